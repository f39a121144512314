"""Swin Transformer V2 (Liu et al., https://arxiv.org/abs/2111.09883) as timm's `swin_transformer_v2`
builds it: Swin's shifted windows with scaled cosine attention, a continuous position bias from a small
MLP, norms after each residual branch, and patch merging that normalizes after the reduction.

It reads `patch_embed.{proj, norm}`, `layers.<i>.downsample.{reduction, norm}`, `layers.<i>.blocks.<j>.
{attn.{qkv, q_bias, v_bias, logit_scale, cpb_mlp.0, cpb_mlp.2, proj}, norm1, mlp.fc1, mlp.fc2, norm2}`,
`norm` and `head.fc`; widths, depths, MLP widths and head counts (logit_scale is heads x 1 x 1) come
from their shapes. The window does not: the position-bias MLP reads coordinates, not a table sized by
the window, so it is the architecture's (`SwinV2Config.window`), clamped to each stage's grid as timm does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader
from ._parts import l2_normalize, layer_norm, linear
from .swin import (
    Layout,
    StageSpec,
    gather_patches,
    emit_trunk,
    merge_window_heads,
    patch_embedding,
    relative_position_bias,
    shifted_window_attention,
    split_window_heads,
    stage_depths,
    windowed_bias,
)

# timm clamps each head's learned logit scale at log(1 / 0.01): cosine scores are scaled by at most 100.
_MAX_LOGIT_SCALE = math.log(100.0)
# The continuous position bias: coordinates normalized to [-8, 8] and log-spaced (log2(|x| + 1) / log2(8)),
# the MLP's output squashed to (0, 16) by 16 * sigmoid.
_COORDINATE_RANGE = 8.0
_BIAS_RANGE = 16.0


@dataclass(frozen=True)
class SwinV2Config:
    # The window timm registers the model with (swinv2_tiny_window8_256: 8); stages whose grid is
    # smaller attend over the whole grid. No tensor records it.
    window: int
    # timm's SwinTransformerV2 takes nn.LayerNorm itself: torch's eps 1e-5, in every norm.
    norm_eps: float = 1e-5
    # The MLP uses nn.GELU, the exact erf form.
    act: Activation = Activation.GELU
    # F.normalize's default eps, under q's and k's norms in the cosine attention.
    normalize_eps: float = 1e-12


def _stage_window(read: LayoutReader, prefix: str, resolution: tuple[int, int], arch: SwinV2Config) -> int:
    """timm's _calc_window_shift: the configured window, or the whole grid where that is smaller."""
    windows = {min(arch.window, side) for side in resolution}
    if len(windows) > 1 or any(side % arch.window for side in resolution if side > arch.window):
        raise UnsupportedModel(
            f"{read.arch}: {prefix} sees a {resolution[0]}x{resolution[1]} token grid that {arch.window}x"
            f"{arch.window} windows do not tile; trtmc does not pad windows"
        )
    return windows.pop()


def _attention(read: LayoutReader, prefix: str, width: int, heads: int) -> None:
    """timm's V2 WindowAttention: qkv without a bias of its own (q_bias and v_bias; k has none), the
    per-head logit scale, the position-bias MLP (2 -> hidden -> heads) and the projection."""
    read.linear(f"{prefix}.qkv", width, 3 * width, bias=False)
    read.tensor(f"{prefix}.q_bias", (width,))
    read.tensor(f"{prefix}.v_bias", (width,))
    read.tensor(f"{prefix}.logit_scale", (heads, 1, 1))
    hidden = read.linear(f"{prefix}.cpb_mlp.0", 2, bias=True)
    read.linear(f"{prefix}.cpb_mlp.2", hidden, heads, bias=False)
    read.linear(f"{prefix}.proj", width, width, bias=True)


def _stage(
    read: LayoutReader,
    prefix: str,
    depth: int,
    width: int,
    resolution: tuple[int, int],
    arch: SwinV2Config,
    first: bool,
) -> StageSpec:
    if not first:
        width_in, width = width, read.linear(f"{prefix}.downsample.reduction", 4 * width, bias=False)
        read.layer_norm(f"{prefix}.downsample.norm", width)
        if width != 2 * width_in:
            raise CheckpointError(f"{read.arch}: {prefix}.downsample.reduction widens {width_in} to {width}, not 2x")
        resolution = (resolution[0] // 2, resolution[1] // 2)
    heads = read.shape(f"{prefix}.blocks.0.attn.logit_scale", rank=3, dims={1: 1, 2: 1})[0]
    if width % heads:
        raise CheckpointError(f"{read.arch}: {prefix} is {width} wide, which does not split into {heads} heads")
    hidden = read.shape(f"{prefix}.blocks.0.mlp.fc1.weight", rank=2)[0]
    for j in range(depth):
        p = f"{prefix}.blocks.{j}"
        _attention(read, f"{p}.attn", width, heads)
        read.layer_norm(f"{p}.norm1", width)
        read.mlp(f"{p}.mlp", width, hidden)
        read.layer_norm(f"{p}.norm2", width)
    window = _stage_window(read, prefix, resolution, arch)
    return StageSpec(prefix, width, resolution, window, heads, hidden, depth, merges=not first)


def derive_layout(ckpt: Checkpoint, arch: SwinV2Config) -> Layout:
    """Stages and blocks from the key names; widths and heads from the shapes; windows from the config."""
    read = LayoutReader(ckpt)
    width, patch, resolution = patch_embedding(read)
    stages: list[StageSpec] = []
    for i, depth in stage_depths(read, "Swin Transformer V2").items():
        stages.append(_stage(read, f"layers.{i}", depth, width, resolution, arch, first=not stages))
        width, resolution = stages[-1].width, stages[-1].resolution
    read.layer_norm("norm", width)
    read.classifier("head.fc", width, bias=True)
    read.finish()
    return Layout(patch, tuple(stages))


def log_spaced_coordinates(window: int) -> np.ndarray:
    """[(2w - 1)^2, 2]: each offset (row, column) between two tokens of a window, row-major, as timm's
    relative_coords_table feeds it to the position-bias MLP: divided by w - 1, times 8, then
    sign(x) * log2(|x| + 1) / log2(8). (These models were trained at their own window: timm's
    pretrained_window_size is 0.)"""
    offsets = np.arange(-(window - 1), window, dtype=np.float64) / (window - 1) * _COORDINATE_RANGE
    table = np.stack(np.meshgrid(offsets, offsets, indexing="ij"), axis=-1).reshape(-1, 2)
    return np.sign(table) * np.log2(np.abs(table) + 1.0) / np.log2(_COORDINATE_RANGE)


def continuous_position_bias(ckpt: Checkpoint, prefix: str, window: int) -> np.ndarray:
    """[heads, w*w, w*w]: the block's position-bias MLP run once, at build time, over the coordinates,
    16 * sigmoid of it, gathered by offset. It depends on the weights alone, so it is a constant, exactly
    what timm recomputes on every forward (in float64 here, then rounded once)."""
    hidden = log_spaced_coordinates(window) @ ckpt.tensor(f"{prefix}.cpb_mlp.0.weight").T.astype(np.float64)
    hidden = np.maximum(hidden + ckpt.tensor(f"{prefix}.cpb_mlp.0.bias"), 0.0)
    table = hidden @ ckpt.tensor(f"{prefix}.cpb_mlp.2.weight").T.astype(np.float64)
    table = _BIAS_RANGE / (1.0 + np.exp(-table))
    return relative_position_bias(table.astype(np.float32), window)


def _cosine_window_attention(
    g: GraphBuilder,
    x: Tensor,
    ckpt: Checkpoint,
    prefix: str,
    stage: StageSpec,
    shift: tuple[int, int],
    arch: SwinV2Config,
) -> Tensor:
    """timm's V2 WindowAttention over windows [N, windows, w*w, C] as one ATTENTION op of scale 1:
    softmax(scale_h * q̂ k̂^T + bias) v with q̂, k̂ L2-normalized. The head's scale multiplies q̂ before the
    op, which is exact: (s q̂) · k̂ = s (q̂ · k̂), one rounding either way, and |s q̂| <= 100 fits fp16."""
    windows = x.shape[1]
    q_bias = ckpt.tensor(f"{prefix}.q_bias")
    # timm's k_bias is a zero buffer, not a parameter: the projection's bias is (q_bias | 0 | v_bias).
    qkv_bias = np.concatenate([q_bias, np.zeros_like(q_bias), ckpt.tensor(f"{prefix}.v_bias")])
    qkv = g.linear(x, f"{prefix}.qkv", ckpt.tensor(f"{prefix}.qkv.weight"), qkv_bias)
    q, k, v = split_window_heads(g, qkv, stage.heads, prefix)
    scale = np.exp(np.minimum(ckpt.tensor(f"{prefix}.logit_scale").reshape(-1).astype(np.float64), _MAX_LOGIT_SCALE))
    scale = np.tile(scale, windows).reshape(1, windows * stage.heads, 1, 1).astype(np.float32)  # window-major
    q = l2_normalize(g, q, arch.normalize_eps, f"{prefix}.q_norm")
    q = g.mul(q, g.constant(f"{prefix}.logit_scale", scale), f"{prefix}.logit_scale")
    k = l2_normalize(g, k, arch.normalize_eps, f"{prefix}.k_norm")
    bias = windowed_bias(continuous_position_bias(ckpt, prefix, stage.window), stage, shift)
    out = g.attention(q, k, v, prefix, scale=1.0, bias=bias)
    return linear(g, merge_window_heads(g, out, windows, prefix), ckpt, f"{prefix}.proj")


def _block(
    g: GraphBuilder,
    ckpt: Checkpoint,
    arch: SwinV2Config,
    x: Tensor,
    prefix: str,
    stage: StageSpec,
    shift: tuple[int, int],
) -> Tensor:
    """timm's SwinTransformerV2Block, res-post-norm: x + norm1(attention(x)), then x + norm2(mlp(x));
    the norms sit inside the residual branches, after what they normalize."""
    attend = partial(
        _cosine_window_attention, g, ckpt=ckpt, prefix=f"{prefix}.attn", stage=stage, shift=shift, arch=arch
    )
    y = shifted_window_attention(g, x, stage, shift, attend, prefix)
    x = g.add(x, layer_norm(g, y, ckpt, f"{prefix}.norm1", arch.norm_eps), f"{prefix}.residual1")
    y = g.activation(linear(g, x, ckpt, f"{prefix}.mlp.fc1"), arch.act, f"{prefix}.mlp.act")
    y = linear(g, y, ckpt, f"{prefix}.mlp.fc2")
    return g.add(x, layer_norm(g, y, ckpt, f"{prefix}.norm2", arch.norm_eps), f"{prefix}.residual2")


def _merge_patches(g: GraphBuilder, ckpt: Checkpoint, arch: SwinV2Config, x: Tensor, prefix: str) -> Tensor:
    """timm's V2 PatchMerging: 2x2 neighbourhoods gathered, projected to 2C, then normalized (V1
    normalizes the 4C features before the projection)."""
    x = linear(g, gather_patches(g, x, prefix), ckpt, f"{prefix}.reduction")
    return layer_norm(g, x, ckpt, f"{prefix}.norm", arch.norm_eps)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: SwinV2Config) -> Tensor:
    return emit_trunk(
        g, ckpt, layout, arch.norm_eps, partial(_merge_patches, g, ckpt, arch), partial(_block, g, ckpt, arch)
    )


FAMILY = Family(
    name="swinv2",
    summary="Swin Transformer V2: shifted windows, scaled cosine attention, continuous position bias, res-post-norm",
    architectures={
        "swinv2_tiny_window8_256": SwinV2Config(window=8),
        # The last stage's 8x8 grid is smaller than a 16x16 window: it attends over the whole grid.
        "swinv2_tiny_window16_256": SwinV2Config(window=16),
    },
    derive_layout=derive_layout,
    emit=emit,
)
