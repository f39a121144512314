"""ResNet, ResNet-D, SE-ResNet, ResNeXt and Wide ResNet classifiers as timm builds them (He et al.,
https://arxiv.org/abs/1512.03385; the "D" stem and shortcut of https://arxiv.org/abs/1812.01187).
Reads the stem `conv1` (or the deep stem `conv1.N`) and `bn1`, the blocks `layerS.B.conv{1,2,3}` /
`bn{1,2,3}` with their optional `se.fc1`/`se.fc2` and `downsample.*`, and the classifier `fc`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, PoolMode
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks, matched_indices
from ._parts import batch_norm, conv, image_input, linear, max_pool, squeeze_excite

_BLOCK = r"^layer(\d+)\.(\d+)\."
# The first stem conv (7x7, or the first 3x3 of the deep stem) strides 2 in every timm ResNet.
STEM_STRIDE = 2
# The stem max pool (kernel, stride, padding): timm's ResNet without `replace_stem_pool` or `aa_layer`.
STEM_POOL = (3, 2, 1)
# "D" shortcuts average-pool 2x2 before their 1x1 conv (timm's `downsample_avg`).
SHORTCUT_POOL = 2


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of a timm ResNet do not say."""

    # timm's ResNet builds every norm as nn.BatchNorm2d with PyTorch's default eps.
    eps: float = 1e-5
    act: Activation = Activation.RELU
    # make_blocks: layer1 keeps the resolution the stem pool left; each later stage halves it in
    # its first block.
    stage_strides: tuple[int, ...] = (1, 2, 2, 2)


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
class BlockSpec:
    prefix: str  # "layer2.0"
    convs: int  # 2 for a basic block, 3 for a bottleneck
    stride: int
    strided_conv: int  # which conv carries the stride: timm strides the 3x3
    se: bool
    shortcut: Shortcut | None  # None: identity


@dataclass(frozen=True)
class Layout:
    stem: tuple[StemConv, ...]
    blocks: tuple[BlockSpec, ...]


@dataclass(frozen=True)
class FeatureMap:
    """What flows from layer to layer at layout time: the width, and the size a 2x2 pool must divide."""

    channels: int
    height: int
    width: int

    def strided(self, stride: int, channels: int | None = None) -> FeatureMap:
        # Every strided op here (the stem convs and pool, the strided 3x3, the strided 1x1 projection,
        # all with timm's symmetric padding) maps a side of n pixels to ceil(n / stride).
        width = self.channels if channels is None else channels
        return FeatureMap(width, -(-self.height // stride), -(-self.width // stride))


def _stem(read: LayoutReader, x: FeatureMap) -> tuple[tuple[StemConv, ...], FeatureMap]:
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


def _shortcut(read: LayoutReader, prefix: str, x: FeatureMap, out: int, stride: int) -> Shortcut | None:
    """The projection on a block's skip path to its `out` channels, None for the identity: `downsample.0`
    is a strided conv, or ("D" models) `downsample.1` a 1x1 conv behind an average pool."""
    if f"{prefix}.downsample.0.weight" in read:
        shortcut = Shortcut(f"{prefix}.downsample.0", f"{prefix}.downsample.1", None)
    elif f"{prefix}.downsample.1.weight" in read:
        # timm's downsample_avg puts nn.Identity at index 0 when the block does not stride.
        pool = f"{prefix}.downsample.0" if stride > 1 else None
        if pool and (x.height % 2 or x.width % 2):
            raise UnsupportedModel(
                f"{read.arch}: {pool} average-pools a {x.height}x{x.width} map with ceil_mode=True, which "
                f"keeps the odd last row/column; trtmc's POOL2D has no ceil mode, so input_size "
                f"{list(read.ckpt.config.pretrained.input_size)} is not supported (sides that are "
                f"multiples of 32 are)"
            )
        shortcut = Shortcut(f"{prefix}.downsample.1", f"{prefix}.downsample.2", pool)
    else:
        shortcut = None
    projection, norm = (shortcut.conv, shortcut.norm) if shortcut else (None, None)
    read.shortcut(prefix, x.channels, out, stride, projection, norm)
    return shortcut


def _block(read: LayoutReader, prefix: str, x: FeatureMap, stride: int) -> tuple[BlockSpec, FeatureMap]:
    """A basic block (conv1, conv2) or a bottleneck (conv1..conv3), its squeeze-excite and its shortcut."""
    convs = 3 if f"{prefix}.conv3.weight" in read else 2
    channels = x.channels
    for i in range(1, convs + 1):
        channels = read.conv(f"{prefix}.conv{i}", channels, norm=f"{prefix}.bn{i}")
    se = f"{prefix}.se.fc1.weight" in read
    if se:
        read.squeeze_excite(f"{prefix}.se", channels, reduce="fc1", expand="fc2")
    shortcut = _shortcut(read, prefix, x, channels, stride)
    # timm strides a bottleneck's 3x3 (conv2) and a basic block's first conv.
    spec = BlockSpec(prefix, convs, stride, 2 if convs == 3 else 1, se, shortcut)
    return spec, x.strided(stride, channels)


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """The stem, the blocks and their shortcuts, from key names and shapes; no weight is read.

    A block is a bottleneck when it has `conv3`; the groups of the 3x3 and every width follow from
    the weight shapes, so one code path serves every size.
    """
    read = LayoutReader(ckpt)
    stem, x = _stem(read, FeatureMap(*ckpt.config.pretrained.input_size))
    blocks = []
    # Stages are numbered from layer1, their blocks from 0.
    for stage, index in indexed_blocks(ckpt, _BLOCK, start=(1, 0), stages=len(arch.stage_strides)):
        stride = arch.stage_strides[stage - 1] if index == 0 else 1
        block, x = _block(read, f"layer{stage}.{index}", x, stride)
        blocks.append(block)
    read.classifier("fc", x.channels)
    read.finish()
    return Layout(stem, tuple(blocks))


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
    p = b.prefix
    y = x
    for i in range(1, b.convs + 1):
        y = conv(g, y, ckpt, f"{p}.conv{i}", stride=b.stride if i == b.strided_conv else 1)
        y = batch_norm(g, y, ckpt, f"{p}.bn{i}", arch.eps)
        if i < b.convs:
            y = g.activation(y, arch.act, f"{p}.act{i}")
    if b.se:
        y = squeeze_excite(g, y, ckpt, f"{p}.se", inner=arch.act, gate=Activation.SIGMOID, reduce="fc1", expand="fc2")
    shortcut = x
    if b.shortcut is not None:
        sc = b.shortcut
        if sc.pool is not None:
            shortcut = g.pool2d(shortcut, sc.pool, PoolMode.AVG, SHORTCUT_POOL, b.stride, count_include_pad=False)
        shortcut = conv(g, shortcut, ckpt, sc.conv, stride=1 if sc.pool is not None else b.stride)
        shortcut = batch_norm(g, shortcut, ckpt, sc.norm, arch.eps)
    return g.activation(g.add(y, shortcut, p), arch.act, f"{p}.act{b.convs}")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    for s in layout.stem:
        x = conv(g, x, ckpt, s.conv, stride=s.stride)
        x = g.activation(batch_norm(g, x, ckpt, s.norm, arch.eps), arch.act, s.act)
    x = max_pool(g, x, "maxpool", *STEM_POOL)
    for block in layout.blocks:
        x = _emit_block(g, x, ckpt, block, arch)
    return linear(g, g.global_avg_pool(x, "global_pool"), ckpt, "fc")


# Every variant here shares timm's defaults; what differs between them is in the tensors.
_TIMM_RESNET = ArchConfig()

FAMILY = Family(
    name="resnet",
    summary="ResNet / ResNet-D / SE-ResNet / ResNeXt / Wide ResNet (timm resnet.py)",
    architectures={
        "resnet18": _TIMM_RESNET,
        "resnet34": _TIMM_RESNET,
        "resnet50": _TIMM_RESNET,
        "resnet101": _TIMM_RESNET,
        "resnet50d": _TIMM_RESNET,
        "seresnet50": _TIMM_RESNET,
        "resnext50_32x4d": _TIMM_RESNET,
        "wide_resnet50_2": _TIMM_RESNET,
    },
    derive_layout=derive_layout,
    emit=emit,
)
