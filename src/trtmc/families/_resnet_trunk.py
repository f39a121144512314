"""The trunk timm's `ResNet` class builds around any residual block, shared by ResNet and the relatives
timm builds with that class: Res2Net, SKNet and ResNeSt (https://arxiv.org/abs/1512.03385; the "D" stem
and shortcut of https://arxiv.org/abs/1812.01187). It reads the stem `conv1`/`bn1` (or the deep stem
`conv1.N`), the blocks `layerS.B` and their shortcuts `downsample.*`, and the classifier `fc`; each
family reads and emits its own block between them. The map sizes and the 2x2 ceil-mode shortcut pool
also serve the pre-activation and normalizer-free ResNets (resnetv2, nfnet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, PoolMode
from ..graph_builder import GraphBuilder, Tensor
from . import UnsupportedModel
from ._layout import LayoutReader, indexed_blocks, matched_indices
from ._parts import batch_norm, conv, image_input, linear, max_pool

BLOCK = r"^layer(\d+)\.(\d+)\."
# The first stem conv (7x7, or the first 3x3 of the deep stem) strides 2 in every timm ResNet.
STEM_STRIDE = 2
# The stem max pool (kernel, stride, padding): timm's ResNet without `replace_stem_pool` or `aa_layer`.
STEM_POOL = (3, 2, 1)
# make_blocks: layer1 keeps the resolution the stem pool left; each later stage halves it in its
# first block.
STAGE_STRIDES = (1, 2, 2, 2)
# "D" shortcuts average-pool 2x2 before their 1x1 conv (timm's `downsample_avg`).
SHORTCUT_POOL = 2

BlockT = TypeVar("BlockT")
ConfigT = TypeVar("ConfigT", bound="TrunkConfig")


@dataclass(frozen=True)
class TrunkConfig:
    """What the tensors of timm's ResNet class do not say, whatever its block; a family with more to
    say extends it."""

    # Every norm is an nn.BatchNorm2d with PyTorch's default eps (the blocks' own norms too).
    eps: float = 1e-5
    act: Activation = Activation.RELU
    stage_strides: tuple[int, ...] = STAGE_STRIDES


@dataclass(frozen=True)
class StemConv:
    conv: str
    norm: str
    act: str
    stride: int


@dataclass(frozen=True)
class Shortcut:
    conv: str
    norm: str
    pool: str | None  # the average pool's module path ("D" models), if it pools


@dataclass(frozen=True)
class Layout(Generic[BlockT]):
    stem: tuple[StemConv, ...]
    blocks: tuple[BlockT, ...]


@dataclass(frozen=True)
class FeatureMap:
    """What flows from layer to layer at layout time: the width, and the size a 2x2 pool must divide."""

    channels: int
    height: int
    width: int

    def strided(self, stride: int, channels: int | None = None) -> FeatureMap:
        # Every strided op of these networks (stem convs and pools, strided 3x3s and their 3x3 average
        # pools, strided 1x1 projections, with timm's symmetric padding or TF "SAME") maps n pixels to
        # ceil(n / stride).
        width = self.channels if channels is None else channels
        return FeatureMap(width, -(-self.height // stride), -(-self.width // stride))


# A family's block: (reader, "layer2.0", the map it reads, its stride) -> (its spec, its output width).
BlockReader = Callable[[LayoutReader, str, FeatureMap, int], "tuple[BlockT, int]"]


def refuse_odd_ceil_pool(read: LayoutReader, pool: str, x: FeatureMap) -> None:
    """timm's strided 2x2 shortcut pools use ceil_mode=True, which keeps an odd last row or column as a
    pool of its own; trtmc's POOL2D has no ceil mode, so an odd map there is refused."""
    if x.height % 2 or x.width % 2:
        raise UnsupportedModel(
            f"{read.arch}: {pool} average-pools a {x.height}x{x.width} map with ceil_mode=True, which "
            f"keeps the odd last row/column; trtmc's POOL2D has no ceil mode, so input_size "
            f"{list(read.ckpt.config.pretrained.input_size)} is not supported (sides that are "
            f"multiples of 32 are)"
        )


def derive_stem(read: LayoutReader, x: FeatureMap) -> tuple[tuple[StemConv, ...], FeatureMap]:
    """`conv1` and `bn1`, or the deep stem: a Sequential (conv, bn, relu, conv, bn, relu, conv) that
    bn1 and act1 follow; then the max pool."""
    if "conv1.weight" in read:
        stem: tuple[StemConv, ...] = (StemConv("conv1", "bn1", "act1", STEM_STRIDE),)
    else:
        indices = matched_indices(read.ckpt, r"^conv1\.(\d+)\.weight$")
        convs = [i for (i,) in indices if len(read.shape(f"conv1.{i}.weight")) == 4]
        if not convs:
            raise CheckpointError(
                f"{read.arch}: no stem conv (neither conv1.weight nor conv1.N.weight) in {read.ckpt.weights_path}"
            )
        stem = tuple(
            StemConv(
                f"conv1.{i}",
                *((f"conv1.{i + 1}", f"conv1.{i + 2}") if k < len(convs) - 1 else ("bn1", "act1")),
                stride=STEM_STRIDE if k == 0 else 1,
            )
            for k, i in enumerate(convs)
        )
    for s in stem:
        x = x.strided(s.stride, read.conv(s.conv, x.channels, norm=s.norm))
    return stem, x.strided(STEM_POOL[1])


def derive_shortcut(read: LayoutReader, prefix: str, x: FeatureMap, out: int, stride: int) -> Shortcut | None:
    """The projection on a block's skip path to its `out` channels, None for the identity: `downsample.0`
    is a strided conv, or ("D" models) `downsample.1` a 1x1 conv behind an average pool."""
    if f"{prefix}.downsample.0.weight" in read:
        shortcut = Shortcut(f"{prefix}.downsample.0", f"{prefix}.downsample.1", None)
    elif f"{prefix}.downsample.1.weight" in read:
        # timm's downsample_avg puts nn.Identity at index 0 when the block does not stride.
        pool = f"{prefix}.downsample.0" if stride > 1 else None
        if pool:
            refuse_odd_ceil_pool(read, pool, x)
        shortcut = Shortcut(f"{prefix}.downsample.1", f"{prefix}.downsample.2", pool)
    else:
        shortcut = None
    projection, norm = (shortcut.conv, shortcut.norm) if shortcut else (None, None)
    read.shortcut(prefix, x.channels, out, stride, projection, norm)
    return shortcut


def derive_trunk(ckpt: Checkpoint, block: BlockReader, stage_strides: tuple[int, ...] = STAGE_STRIDES) -> Layout:
    """The stem, every block `block` reads, and the classifier, from key names and shapes; no weight is read."""
    read = LayoutReader(ckpt)
    stem, x = derive_stem(read, FeatureMap(*ckpt.config.pretrained.input_size))
    blocks = []
    # Stages are numbered from layer1, their blocks from 0.
    for stage, index in indexed_blocks(ckpt, BLOCK, start=(1, 0), stages=len(stage_strides)):
        stride = stage_strides[stage - 1] if index == 0 else 1
        spec, channels = block(read, f"layer{stage}.{index}", x, stride)
        blocks.append(spec)
        x = x.strided(stride, channels)
    read.classifier("fc", x.channels)
    read.finish()
    return Layout(stem, tuple(blocks))


def shortcut_pool(g: GraphBuilder, x: Tensor, source: str, stride: int) -> Tensor:
    """The 2x2 average pool of a "D" shortcut (ceil mode and odd maps are refused at layout time)."""
    return g.pool2d(x, source, PoolMode.AVG, SHORTCUT_POOL, stride, count_include_pad=False)


def emit_residual(
    g: GraphBuilder,
    y: Tensor,
    x: Tensor,
    ckpt: Checkpoint,
    prefix: str,
    shortcut: Shortcut | None,
    stride: int,
    arch: TrunkConfig,
    act_source: str,
) -> Tensor:
    """act(y + shortcut(x)): a block's output `y` joined with the skip path from its input `x`."""
    if shortcut is not None:
        if shortcut.pool is not None:
            x = shortcut_pool(g, x, shortcut.pool, stride)
        x = conv(g, x, ckpt, shortcut.conv, stride=1 if shortcut.pool is not None else stride)
        x = batch_norm(g, x, ckpt, shortcut.norm, arch.eps)
    return g.activation(g.add(y, x, prefix), arch.act, act_source)


# A family's block emitter: (builder, its input, checkpoint, its spec, the config) -> its output.
BlockEmitter = Callable[[GraphBuilder, Tensor, Checkpoint, BlockT, ConfigT], Tensor]


def emit_trunk(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ConfigT, block: BlockEmitter) -> Tensor:
    """The stem, each block through `block`, the global pool and `fc`: the logits."""
    x = image_input(g, ckpt)
    for s in layout.stem:
        x = conv(g, x, ckpt, s.conv, stride=s.stride)
        x = g.activation(batch_norm(g, x, ckpt, s.norm, arch.eps), arch.act, s.act)
    x = max_pool(g, x, "maxpool", *STEM_POOL)
    for spec in layout.blocks:
        x = block(g, x, ckpt, spec, arch)
    return linear(g, g.global_avg_pool(x, "global_pool"), ckpt, "fc")
