"""EfficientFormer (Li et al., https://arxiv.org/abs/2206.01191) as timm builds it: conv stages whose
blocks mix tokens by pooling (meta4d), then, at the end of the last stage, attention blocks on tokens
(meta3d).

It reads `stem.{conv1, norm1, conv2, norm2}`, `stages.<i>.downsample.{conv, norm}`, the meta4d blocks
`stages.<i>.blocks.<j>.{ls1, mlp.{fc1, norm1, fc2, norm2}, ls2}`, the meta3d blocks `stages.<i>.blocks.<j>.
{norm1, token_mixer.{attention_biases, attention_bias_idxs, qkv, proj}, ls1, norm2, mlp.{fc1, fc2}, ls2}`, `norm`,
`head` and `head_dist`; widths, depths, where attention starts, its heads and key and value widths come
from the shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Binary, PoolMode, Reduction
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks, matched_indices
from ._parts import batch_norm, conv, conv_norm_act, image_input, layer_norm, linear, merge_heads
from .levit import attention_bias_heads, averaged_classifier, relative_position_bias, split_heads_by_part, to_tokens


@dataclass(frozen=True)
class EfficientFormerConfig:
    """What the tensors of a timm EfficientFormer do not say."""

    # The meta4d token mixer: AvgPool2d(pool_size=3, stride 1, padding 1, count_include_pad=False) minus
    # its input. A pool holds no weights.
    pool_size: int = 3
    # nn.BatchNorm2d and nn.LayerNorm defaults: EfficientFormer passes the classes, no eps.
    bn_eps: float = 1e-5
    ln_eps: float = 1e-5
    # Stem4's act_layer stays nn.ReLU; the MLPs use act_layer=nn.GELU (the erf form).
    stem_act: Activation = Activation.RELU
    act: Activation = Activation.GELU
    # Stem4's two convs and each Downsample conv have stride 2.
    stride: int = 2


@dataclass(frozen=True)
class PoolBlock:
    """Meta4d: x + ls1 * (pool(x) - x), then x + ls2 * mlp(x) with 1x1 convs and batch norms."""

    prefix: str
    hidden: int


@dataclass(frozen=True)
class AttentionBlock:
    """Meta3d on tokens: x + ls1 * attn(norm1(x)), then x + ls2 * mlp(norm2(x)) with linears."""

    prefix: str
    heads: int
    key_dim: int
    value_dim: int
    resolution: int  # the tokens form a resolution x resolution grid
    hidden: int


@dataclass(frozen=True)
class StageSpec:
    prefix: str
    downsample: bool  # a strided 3x3 conv + batch norm opens the stage
    blocks: tuple[PoolBlock | AttentionBlock, ...]  # meta4d first, then meta3d after timm's Flat


@dataclass(frozen=True)
class Layout:
    stages: tuple[StageSpec, ...]
    width: int


def _pool_block(read: LayoutReader, prefix: str, width: int) -> PoolBlock:
    read.tensor(f"{prefix}.ls1.gamma", (width,))
    hidden = read.conv(f"{prefix}.mlp.fc1", width, bias=True, norm=f"{prefix}.mlp.norm1", dims={2: 1, 3: 1})
    read.conv(f"{prefix}.mlp.fc2", hidden, bias=True, norm=f"{prefix}.mlp.norm2", dims={0: width, 2: 1, 3: 1})
    read.tensor(f"{prefix}.ls2.gamma", (width,))
    return PoolBlock(prefix, hidden)


def _attention_block(read: LayoutReader, prefix: str, width: int, grid: int) -> AttentionBlock:
    mixer = f"{prefix}.token_mixer"
    read.layer_norm(f"{prefix}.norm1", width)
    heads = attention_bias_heads(read, mixer, grid)
    read.tensor(f"{mixer}.attention_bias_idxs", (grid**2, grid**2))  # the table relative_position_bias recomputes
    merged = read.shape(f"{mixer}.proj.weight", rank=2, dims={0: width})[1]
    per_head, rest = divmod(read.linear(f"{mixer}.qkv", width, bias=True), heads)
    value_dim, odd_values = divmod(merged, heads)
    key_dim, odd_keys = divmod(per_head - value_dim, 2)
    if rest or odd_values or odd_keys or key_dim <= 0:
        raise CheckpointError(
            f"{read.arch}: {mixer}.qkv and {mixer}.proj do not split into {heads} heads of q and k alike plus values"
        )
    read.linear(f"{mixer}.proj", merged, width, bias=True)
    read.tensor(f"{prefix}.ls1.gamma", (width,))
    read.layer_norm(f"{prefix}.norm2", width)
    hidden = read.linear(f"{prefix}.mlp.fc1", width, bias=True)
    read.linear(f"{prefix}.mlp.fc2", hidden, width, bias=True)
    read.tensor(f"{prefix}.ls2.gamma", (width,))
    return AttentionBlock(prefix, heads, key_dim, value_dim, grid, hidden)


def _strided(size: int, stride: int) -> int:
    """A map's side after one of EfficientFormer's 3x3 convs with padding 1 and this stride."""
    return (size - 1) // stride + 1


def _stage(
    read: LayoutReader, stage: int, width: int, grid: int, stride: int, last: bool
) -> tuple[StageSpec, int, int]:
    """Stage `stage` reading `width` channels on a grid x grid map: its spec, its width and its grid.

    timm numbers a stage's modules in one Sequential: the meta4d blocks, then, where the meta3d blocks
    start, a Flat with no tensors, then the meta3d blocks. So the block numbers skip exactly one,
    between the two kinds (or at 0 when every block attends).
    """
    prefix = f"stages.{stage}"
    downsample = f"{prefix}.downsample.conv.weight" in read
    if downsample:
        width = read.conv(f"{prefix}.downsample.conv", width, bias=True, norm=f"{prefix}.downsample.norm")
        grid = _strided(grid, stride)
    numbers = [j for (j,) in matched_indices(read.ckpt, rf"^{prefix}\.blocks\.(\d+)\.")]
    pooling = sum(f"{prefix}.blocks.{j}.mlp.norm1.weight" in read for j in numbers)
    attending = len(numbers) - pooling
    expected = list(range(pooling)) + list(range(pooling + 1, pooling + 1 + attending))
    if numbers != expected:
        raise CheckpointError(
            f"{read.arch}: {prefix}.blocks are numbered {numbers}; timm numbers {pooling} pooling blocks from 0, "
            f"then its Flat, then {attending} attention blocks: {expected}"
        )
    if attending and not last:
        raise UnsupportedModel(
            f"{read.arch}: {prefix} has attention blocks; EfficientFormer has them in its last stage only"
        )
    blocks: list[PoolBlock | AttentionBlock] = [
        _pool_block(read, f"{prefix}.blocks.{j}", width) for j in range(pooling)
    ]
    blocks += [_attention_block(read, f"{prefix}.blocks.{j}", width, grid) for j in expected[pooling:]]
    return StageSpec(prefix, downsample, tuple(blocks)), width, grid


def derive_layout(ckpt: Checkpoint, arch: EfficientFormerConfig) -> Layout:
    """Stem, stages and blocks from names; widths, depths and attention shapes from shapes."""
    read = LayoutReader(ckpt)
    in_chans, height, width_px = ckpt.config.pretrained.input_size
    if height != width_px:
        raise UnsupportedModel(
            f"{read.arch}: a {height}x{width_px} input; EfficientFormer's attention needs a square one"
        )
    width = read.conv("stem.conv1", in_chans, bias=True, norm="stem.norm1")
    width = read.conv("stem.conv2", width, bias=True, norm="stem.norm2")
    grid = _strided(_strided(height, arch.stride), arch.stride)  # Stem4's two convs
    stage_numbers = [s for (s,) in indexed_blocks(ckpt, r"^stages\.(\d+)\.")]
    if not stage_numbers:
        raise CheckpointError(f"{read.arch}: no stages.<i> tensors; not an EfficientFormer checkpoint")
    stages = []
    for stage in stage_numbers:
        spec, width, grid = _stage(read, stage, width, grid, arch.stride, last=stage == stage_numbers[-1])
        stages.append(spec)
    if not isinstance(stages[-1].blocks[-1], AttentionBlock):
        raise UnsupportedModel(f"{read.arch}: its last stage has no attention blocks to end on tokens")
    read.layer_norm("norm", width)
    for head in ("head", "head_dist"):
        read.classifier(head, width, bias=True)
    read.finish()
    return Layout(tuple(stages), width)


def _layer_scale(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, name: str, axis: int) -> Tensor:
    # Its own op rather than folded into the layer before it: trained layer scales start at 1e-5, and
    # folded into a weight they would push fp16 weights into the subnormal range.
    gamma = ckpt.tensor(f"{name}.gamma")
    return g.scale(x, name, gamma, np.zeros_like(gamma), axis=axis)


def _emit_pool_block(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: PoolBlock, arch: EfficientFormerConfig
) -> Tensor:
    p, size = block.prefix, arch.pool_size
    pooled = g.pool2d(x, f"{p}.token_mixer.pool", PoolMode.AVG, size, 1, size // 2, count_include_pad=False)
    y = g.binary(pooled, x, Binary.SUB, f"{p}.token_mixer")
    x = g.add(x, _layer_scale(g, y, ckpt, f"{p}.ls1", axis=1), f"{p}.add1")
    y = conv_norm_act(g, x, ckpt, f"{p}.mlp.fc1", f"{p}.mlp.norm1", arch.act, eps=arch.bn_eps)
    y = batch_norm(g, conv(g, y, ckpt, f"{p}.mlp.fc2"), ckpt, f"{p}.mlp.norm2", arch.bn_eps)
    return g.add(x, _layer_scale(g, y, ckpt, f"{p}.ls2", axis=1), f"{p}.add2")


def _emit_attention_block(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: AttentionBlock, arch: EfficientFormerConfig
) -> Tensor:
    p, mixer, d = block.prefix, f"{block.prefix}.token_mixer", block.key_dim
    y = layer_norm(g, x, ckpt, f"{p}.norm1", arch.ln_eps)
    parts = (("q", d), ("k", d), ("v", block.value_dim))
    q, k, v = split_heads_by_part(g, linear(g, y, ckpt, f"{mixer}.qkv"), block.heads, parts, mixer)
    bias = relative_position_bias(ckpt.tensor(f"{mixer}.attention_biases"), block.resolution)
    y = merge_heads(g, g.attention(q, k, v, mixer, scale=d**-0.5, bias=bias), mixer)
    y = linear(g, y, ckpt, f"{mixer}.proj")
    x = g.add(x, _layer_scale(g, y, ckpt, f"{p}.ls1", axis=-1), f"{p}.add1")
    y = layer_norm(g, x, ckpt, f"{p}.norm2", arch.ln_eps)
    y = g.activation(linear(g, y, ckpt, f"{p}.mlp.fc1"), arch.act, f"{p}.mlp.act")
    y = linear(g, y, ckpt, f"{p}.mlp.fc2")
    return g.add(x, _layer_scale(g, y, ckpt, f"{p}.ls2", axis=-1), f"{p}.add2")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: EfficientFormerConfig) -> Tensor:
    x = image_input(g, ckpt)
    x = conv_norm_act(g, x, ckpt, "stem.conv1", "stem.norm1", arch.stem_act, eps=arch.bn_eps, stride=arch.stride)
    x = conv_norm_act(g, x, ckpt, "stem.conv2", "stem.norm2", arch.stem_act, eps=arch.bn_eps, stride=arch.stride)
    for stage in layout.stages:
        if stage.downsample:
            d = f"{stage.prefix}.downsample"
            x = conv_norm_act(g, x, ckpt, f"{d}.conv", f"{d}.norm", None, eps=arch.bn_eps, stride=arch.stride)
        for block in stage.blocks:
            if isinstance(block, AttentionBlock):
                if len(x.shape) == 4:  # timm's Flat, before the first attention block
                    x = to_tokens(g, x, f"{stage.prefix}.flat")
                x = _emit_attention_block(g, x, ckpt, block, arch)
            else:
                x = _emit_pool_block(g, x, ckpt, block, arch)
    x = layer_norm(g, x, ckpt, "norm", arch.ln_eps)  # per token, before the mean over them
    x = g.reduce(x, "head.global_pool", Reduction.MEAN, (1,), keepdim=False)
    heads = [(ckpt.tensor(f"{head}.weight"), ckpt.tensor(f"{head}.bias")) for head in ("head", "head_dist")]
    return averaged_classifier(g, x, heads, "head")


FAMILY = Family(
    name="efficientformer",
    summary="EfficientFormer: pooling token mixers in conv stages, then attention with learned position biases",
    architectures={
        "efficientformer_l1": EfficientFormerConfig(),
        "efficientformer_l3": EfficientFormerConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
