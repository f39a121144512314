"""Swin Transformer (Liu et al., https://arxiv.org/abs/2103.14030) as timm's `swin_transformer` builds it:
window attention with a relative position bias, shifted windows every other block, patch merging.

It reads `patch_embed.{proj, norm}`, `layers.<i>.downsample.{norm, reduction}`, `layers.<i>.blocks.<j>.
{norm1, attn.relative_position_bias_table, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}`, `norm` and
`head.fc`; widths, depths, MLP widths, each stage's window and head count (the bias table is
(2 * window - 1)^2 x heads) come from their shapes, and the shifts from the windows and the input size.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Reduction
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv, image_input, layer_norm, linear, relative_position_index, transformer_block

_BLOCK = r"^layers\.(\d+)\.blocks\.(\d+)\."
# Shifted-window attention masks pairs of tokens from different image regions with this bias, not
# -inf (timm's get_attn_mask): exp(-100) is 0 in every precision, and no row is ever all masked.
_MASKED = -100.0


@dataclass(frozen=True)
class SwinConfig:
    # timm's SwinTransformer takes nn.LayerNorm itself: torch's eps 1e-5, in every norm.
    norm_eps: float = 1e-5
    # The MLP uses nn.GELU, the exact erf form.
    act: Activation = Activation.GELU


@dataclass(frozen=True)
class StageSpec:
    prefix: str  # layers.<i>
    width: int
    resolution: tuple[int, int]  # the token grid the stage's blocks see
    window: int  # its attention windows are window x window tokens
    heads: int
    hidden: int  # MLP width
    depth: int
    merges: bool  # PatchMerging first: 2x2 neighbours concatenated, normalized, projected

    @property
    def shift(self) -> tuple[int, int]:
        """How far every other block rolls the grid along H and W: half a window, except along an axis
        one window covers (timm's _calc_window_shift)."""
        return tuple(self.window // 2 if self.window < size else 0 for size in self.resolution)  # type: ignore[return-value]

    @property
    def tokens(self) -> int:
        return self.window * self.window


@dataclass(frozen=True)
class Layout:
    patch: int
    stages: tuple[StageSpec, ...]


def _window(read: LayoutReader, prefix: str, resolution: tuple[int, int]) -> tuple[int, int]:
    """The window and head count a stage's relative position bias table [(2w - 1)^2, heads] holds."""
    name = f"{prefix}.blocks.0.attn.relative_position_bias_table"
    rows, heads = read.shape(name, rank=2)
    side = (round(rows**0.5) + 1) // 2
    if (2 * side - 1) ** 2 != rows:
        raise CheckpointError(f"{read.arch}: {name} has {rows} rows, not (2 * window - 1)^2 for a square window")
    if any(r % side for r in resolution):
        raise UnsupportedModel(
            f"{read.arch}: {prefix} sees a {resolution[0]}x{resolution[1]} token grid that {side}x{side} windows "
            "do not tile; trtmc does not pad windows"
        )
    return side, heads


def _stage(read: LayoutReader, prefix: str, depth: int, width_in: int, resolution: tuple[int, int], first: bool) -> StageSpec:
    merges = not first
    width = width_in
    if merges:
        read.layer_norm(f"{prefix}.downsample.norm", 4 * width_in)
        width = read.linear(f"{prefix}.downsample.reduction", 4 * width_in, bias=False)
        resolution = (resolution[0] // 2, resolution[1] // 2)
    window, heads = _window(read, prefix, resolution)
    if width % heads:
        raise CheckpointError(f"{read.arch}: {prefix} is {width} wide, which does not split into {heads} heads")
    hidden = read.shape(f"{prefix}.blocks.0.mlp.fc1.weight", rank=2)[0]
    for j in range(depth):
        p = f"{prefix}.blocks.{j}"
        read.layer_norm(f"{p}.norm1", width)
        read.tensor(f"{p}.attn.relative_position_bias_table", ((2 * window - 1) ** 2, heads))
        read.linear(f"{p}.attn.qkv", width, 3 * width, bias=True)
        read.linear(f"{p}.attn.proj", width, width, bias=True)
        read.layer_norm(f"{p}.norm2", width)
        read.mlp(f"{p}.mlp", width, hidden)
    return StageSpec(prefix, width, resolution, window, heads, hidden, depth, merges)


def patch_embedding(read: LayoutReader) -> tuple[int, int, tuple[int, int]]:
    """timm's PatchEmbed with its norm (Swin V1 and V2), placed: the embedding width, the patch size
    and the token grid it makes of the checkpoint's input size (`LayoutReader.patch_grid`)."""
    width, patch, grid = read.patch_grid()
    read.conv("patch_embed.proj", read.ckpt.config.pretrained.input_size[0], bias=True)
    read.layer_norm("patch_embed.norm", width)
    return width, patch, grid


def stage_depths(read: LayoutReader, network: str) -> dict[int, int]:
    """Each stage's block count, stage by stage, from the layers.<i>.blocks.<j> names."""
    indices = indexed_blocks(read.ckpt, _BLOCK)
    if not indices:
        raise CheckpointError(f"{read.arch}: no layers.<i>.blocks.<j> tensors; not a {network} checkpoint")
    return dict(sorted(Counter(stage for stage, _ in indices).items()))


def derive_layout(ckpt: Checkpoint, arch: SwinConfig) -> Layout:
    """Stages and blocks from the key names; widths, windows and heads from the shapes."""
    read = LayoutReader(ckpt)
    width, patch, resolution = patch_embedding(read)
    depths = stage_depths(read, "Swin Transformer")
    stages = []
    for i, depth in depths.items():
        stages.append(_stage(read, f"layers.{i}", depth, width, resolution, first=not stages))
        width, resolution = stages[-1].width, stages[-1].resolution
    read.layer_norm("norm", width)
    read.classifier("head.fc", width, bias=True)
    read.finish()
    return Layout(patch, tuple(stages))


def relative_position_bias(table: np.ndarray, window: int) -> np.ndarray:
    """[heads, w*w, w*w]: the table's entry for each pair of tokens of a window, by their offset."""
    return np.ascontiguousarray(table[relative_position_index(window, window)].transpose(2, 0, 1))


def shifted_window_mask(resolution: tuple[int, int], window: int, shift: tuple[int, int]) -> np.ndarray:
    """[windows, w*w, w*w]: 0 where two tokens of a shifted window come from the same image region, else
    _MASKED (timm's get_attn_mask: after the roll, the last window of a row or column joins pixels
    from opposite edges)."""
    height, width = resolution
    regions = np.zeros(resolution)
    rows, cols = (((0, -window), (-window, -s), (-s, None)) for s in shift)  # an unshifted axis is one region
    for i, (top, bottom) in enumerate(rows):
        for j, (left, right) in enumerate(cols):
            regions[top:bottom, left:right] = 3 * i + j
    windows = regions.reshape(height // window, window, width // window, window).transpose(0, 2, 1, 3)
    windows = windows.reshape(-1, window * window)
    return np.where(windows[:, None, :] != windows[:, :, None], _MASKED, 0.0).astype(np.float32)


def windowed_bias(bias: np.ndarray, stage: StageSpec, shift: tuple[int, int]) -> np.ndarray:
    """[1, windows * heads, w*w, w*w], window-major: each head's position bias `bias` [heads, w*w, w*w]
    in every window, plus the shifted-window mask of every window, summed in float32 as timm sums them."""
    windows = (stage.resolution[0] // stage.window) * (stage.resolution[1] // stage.window)
    bias = np.repeat(bias[None], windows, axis=0)
    if any(shift):
        bias = bias + shifted_window_mask(stage.resolution, stage.window, shift)[:, None]
    return bias.reshape(1, -1, stage.tokens, stage.tokens)


def roll(g: GraphBuilder, x: Tensor, shift: tuple[int, int], source: str) -> Tensor:
    """torch.roll(x, shift, dims=(1, 2)) on [N, H, W, C], as two slices and a concat per rolled axis."""
    for axis, by in zip((1, 2), shift):
        if not by:
            continue
        size = x.shape[axis]
        cut = (size - by) % size
        head, tail = g.slice(x, axis, cut, size, f"{source}.roll"), g.slice(x, axis, 0, cut, f"{source}.roll")
        x = g.concat([head, tail], axis, f"{source}.roll")
    return x


def window_partition(g: GraphBuilder, x: Tensor, window: int, source: str) -> Tensor:
    """[N, H, W, C] -> [N, windows, w*w, C], windows row-major: timm's window_partition, batch kept first."""
    _, height, width, channels = x.shape
    x = g.reshape(x, (height // window, window, width // window, window, channels), f"{source}.partition")
    x = g.transpose(x, (0, 1, 3, 2, 4, 5), f"{source}.partition")
    return g.reshape(x, ((height // window) * (width // window), window * window, channels), f"{source}.partition")


def window_reverse(g: GraphBuilder, x: Tensor, resolution: tuple[int, int], window: int, source: str) -> Tensor:
    """[N, windows, w*w, C] -> [N, H, W, C]: timm's window_reverse."""
    height, width = resolution
    channels = x.shape[-1]
    x = g.reshape(x, (height // window, width // window, window, window, channels), f"{source}.reverse")
    x = g.transpose(x, (0, 1, 3, 2, 4, 5), f"{source}.reverse")
    return g.reshape(x, (height, width, channels), f"{source}.reverse")


def split_window_heads(g: GraphBuilder, qkv: Tensor, heads: int, prefix: str) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as [N, windows * heads, w*w, d], window-major, from a fused projection [N, windows, w*w,
    3 * heads * d] whose features run (q | k | v, head, d): one ATTENTION op then serves every window."""
    _, windows, tokens, features = qkv.shape
    head_dim = features // (3 * heads)
    qkv = g.reshape(qkv, (windows, tokens, 3 * heads, head_dim), f"{prefix}.split_heads")
    qkv = g.transpose(qkv, (0, 1, 3, 2, 4), f"{prefix}.split_heads")  # [N, windows, (q|k|v, head), w*w, d]
    q, k, v = (
        g.reshape(g.slice(qkv, 2, i * heads, (i + 1) * heads, f"{prefix}.{part}"), (windows * heads, tokens, head_dim), f"{prefix}.{part}")
        for i, part in enumerate("qkv")
    )
    return q, k, v


def merge_window_heads(g: GraphBuilder, out: Tensor, windows: int, prefix: str) -> Tensor:
    """[N, windows * heads, w*w, d] back to [N, windows, w*w, heads * d]."""
    _, window_heads, tokens, head_dim = out.shape
    heads = window_heads // windows
    out = g.reshape(out, (windows, heads, tokens, head_dim), f"{prefix}.merge_heads")
    out = g.transpose(out, (0, 1, 3, 2, 4), f"{prefix}.merge_heads")
    return g.reshape(out, (windows, tokens, heads * head_dim), f"{prefix}.merge_heads")


def _window_attention(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, stage: StageSpec, shift: tuple[int, int]
) -> Tensor:
    """timm's WindowAttention over windows [N, windows, w*w, C], one ATTENTION op for all of them: the
    windows and heads share its second axis, window-major, and the bias holds each pair's share."""
    q, k, v = split_window_heads(g, linear(g, x, ckpt, f"{prefix}.qkv"), stage.heads, prefix)
    table = ckpt.tensor(f"{prefix}.relative_position_bias_table")
    bias = windowed_bias(relative_position_bias(table, stage.window), stage, shift)
    out = g.attention(q, k, v, prefix, scale=q.shape[-1] ** -0.5, bias=bias)
    return linear(g, merge_window_heads(g, out, x.shape[1], prefix), ckpt, f"{prefix}.proj")


def shifted_window_attention(
    g: GraphBuilder,
    y: Tensor,
    stage: StageSpec,
    shift: tuple[int, int],
    attend: Callable[[Tensor], Tensor],
    prefix: str,
) -> Tensor:
    """The attention branch of a block over tokens [N, H, W, C]: roll, partition, `attend` (windows
    [N, windows, w*w, C] to the same), reverse, roll back (timm's SwinTransformerBlock._attn, V1 and V2)."""
    if any(shift):
        y = roll(g, y, (-shift[0], -shift[1]), f"{prefix}.shift")
    y = window_reverse(g, attend(window_partition(g, y, stage.window, prefix)), stage.resolution, stage.window, prefix)
    return roll(g, y, shift, f"{prefix}.unshift") if any(shift) else y


def gather_patches(g: GraphBuilder, x: Tensor, prefix: str) -> Tensor:
    """[N, H, W, C] -> [N, H/2, W/2, 4C]: each 2x2 neighbourhood's features, column offset outer and row
    offset inner, as timm's PatchMerging (V1 and V2) concatenates them."""
    _, height, width, channels = x.shape
    x = g.reshape(x, (height // 2, 2, width // 2, 2, channels), f"{prefix}.merge")
    x = g.transpose(x, (0, 1, 3, 4, 2, 5), f"{prefix}.merge")
    return g.reshape(x, (height // 2, width // 2, 4 * channels), f"{prefix}.merge")


def _merge_patches(g: GraphBuilder, ckpt: Checkpoint, arch: SwinConfig, x: Tensor, prefix: str) -> Tensor:
    """timm's PatchMerging: 2x2 neighbourhoods gathered, normalized, projected."""
    x = layer_norm(g, gather_patches(g, x, prefix), ckpt, f"{prefix}.norm", arch.norm_eps)
    return linear(g, x, ckpt, f"{prefix}.reduction")


def patch_tokens(g: GraphBuilder, ckpt: Checkpoint, patch: int, eps: float) -> Tensor:
    """The image as normalized patch tokens [N, H, W, C]: timm's Swin (V1 and V2) works channels-last."""
    x = conv(g, image_input(g, ckpt), ckpt, "patch_embed.proj", stride=patch, padding=0)
    x = g.transpose(x, (0, 2, 3, 1), "patch_embed.nhwc")
    return layer_norm(g, x, ckpt, "patch_embed.norm", eps)


# A Swin block as the trunk emits it: tokens [N, H, W, C], the block's prefix, its stage and its shift.
BlockEmitter = Callable[[Tensor, str, StageSpec, tuple[int, int]], Tensor]


def emit_trunk(
    g: GraphBuilder,
    ckpt: Checkpoint,
    layout: Layout,
    eps: float,
    merge: Callable[[Tensor, str], Tensor],
    block: BlockEmitter,
) -> Tensor:
    """The network around Swin's blocks (V1 and V2): patch tokens, each stage's patch merging (`merge`) and
    blocks (`block`), every other block shifted, then the final norm, the mean over tokens and the classifier."""
    x = patch_tokens(g, ckpt, layout.patch, eps)
    for stage in layout.stages:
        if stage.merges:
            x = merge(x, f"{stage.prefix}.downsample")
        for j in range(stage.depth):
            x = block(x, f"{stage.prefix}.blocks.{j}", stage, stage.shift if j % 2 else (0, 0))
    x = layer_norm(g, x, ckpt, "norm", eps)
    x = g.reduce(x, "head.global_pool", Reduction.MEAN, (1, 2), keepdim=False)
    return linear(g, x, ckpt, "head.fc")


def _block(
    g: GraphBuilder,
    ckpt: Checkpoint,
    arch: SwinConfig,
    x: Tensor,
    prefix: str,
    stage: StageSpec,
    shift: tuple[int, int],
) -> Tensor:
    """timm's SwinTransformerBlock: the pre-norm transformer block around shifted-window attention."""
    attend_windows = partial(_window_attention, g, ckpt=ckpt, prefix=f"{prefix}.attn", stage=stage, shift=shift)
    attend = partial(shifted_window_attention, g, stage=stage, shift=shift, attend=attend_windows, prefix=prefix)
    return transformer_block(g, x, ckpt, prefix, attend, eps=arch.norm_eps, act=arch.act)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: SwinConfig) -> Tensor:
    return emit_trunk(
        g, ckpt, layout, arch.norm_eps, partial(_merge_patches, g, ckpt, arch), partial(_block, g, ckpt, arch)
    )


FAMILY = Family(
    name="swin",
    summary="Swin Transformer: shifted-window attention with relative position bias, patch merging",
    architectures={
        "swin_tiny_patch4_window7_224": SwinConfig(),
        # Swin-S3 (searched windows 7, 7, 14, 7): the third stage's 14x14 window covers its whole grid.
        "swin_s3_tiny_224": SwinConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
