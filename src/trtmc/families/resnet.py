"""ResNet, ResNet-D, SE-ResNet, ResNeXt and Wide ResNet classifiers as timm builds them (He et al.,
https://arxiv.org/abs/1512.03385; the "D" stem and shortcut of https://arxiv.org/abs/1812.01187).
Reads the stem `conv1` (or the deep stem `conv1.N`) and `bn1`, the blocks `layerS.B.conv{1,2,3}` /
`bn{1,2,3}` with their optional `se.fc1`/`se.fc2` and `downsample.*`, and the classifier `fc`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Graph, PoolMode
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._parts import (
    batch_norm, block_indices, classifier_head, conv, expect_shape, expect_tensors, image_input, max_pool, norm_shapes,
    squeeze_excite,
)

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


def expect_conv(
    ckpt: Checkpoint, expected: dict[str, tuple[int, ...]], prefix: str, channels: int, norm: str | None = None
) -> tuple[int, ...]:
    """The [out, in/groups, kh, kw] shape of the conv at `prefix`, checked against the `channels` it
    reads; adds the conv (with its bias and `norm`, if any) to an `expect_tensors` table.

    Shapes only: a malformed checkpoint is refused before any weight loads. RegNet uses these
    `expect_*` helpers too.
    """
    name = f"{prefix}.weight"
    shape = expect_shape(ckpt, name, rank=4)
    if channels % shape[1] or shape[0] % (channels // shape[1]):
        raise CheckpointError(
            f"{ckpt.config.architecture}: tensor {name!r} has shape {shape}, which cannot be a conv "
            f"reading {channels} channels"
        )
    expected[name] = shape
    if f"{prefix}.bias" in ckpt:
        expected[f"{prefix}.bias"] = shape[:1]
    if norm is not None:
        expected.update(norm_shapes(norm, shape[0]))
    return shape


def expect_squeeze_excite(ckpt: Checkpoint, expected: dict[str, tuple[int, ...]], prefix: str, channels: int) -> None:
    """timm's SEModule at `prefix`: 1x1 convs `fc1` (channels -> reduced) and `fc2` (back), with biases."""
    reduced = expect_conv(ckpt, expected, f"{prefix}.fc1", channels)[0]
    expected[f"{prefix}.fc1.bias"] = (reduced,)
    expected[f"{prefix}.fc2.weight"] = (channels, reduced, 1, 1)
    expected[f"{prefix}.fc2.bias"] = (channels,)


def expect_linear(ckpt: Checkpoint, expected: dict[str, tuple[int, ...]], prefix: str, features: int) -> None:
    """The classifier at `prefix`: `features` in, config.json's num_classes out."""
    classes = ckpt.config.num_classes
    expected[f"{prefix}.weight"] = (classes, features)
    if f"{prefix}.bias" in ckpt:
        expected[f"{prefix}.bias"] = (classes,)


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """The stem, the blocks and their shortcuts, from key names and shapes; no weight is read.

    A block is a bottleneck when it has `conv3`; `downsample.0` is a strided 1x1 (or 3x3) conv,
    `downsample.1` a 1x1 conv behind an average pool ("D" models); the groups of the 3x3 and every
    width follow from the weight shapes, so one code path serves every size.
    """
    name = ckpt.config.architecture
    names = set(ckpt.names)
    expected: dict[str, tuple[int, ...]] = {}
    channels, height, width = ckpt.config.pretrained.input_size

    if "conv1.weight" in names:
        stem = (StemConv("conv1", "bn1", "act1", STEM_STRIDE),)
    else:
        # The deep stem is a Sequential (conv, bn, relu, conv, bn, relu, conv) that bn1/act1 follow.
        indices = block_indices(ckpt, r"^conv1\.(\d+)\.weight$")
        convs = [i for (i,) in indices if len(ckpt.shape(f"conv1.{i}.weight")) == 4]
        if not convs:
            raise CheckpointError(f"{name}: no stem conv (neither conv1.weight nor conv1.N.weight) in {ckpt.weights_path}")
        stem = tuple(
            StemConv(
                f"conv1.{i}",
                *((f"conv1.{i + 1}", f"conv1.{i + 2}") if k < len(convs) - 1 else ("bn1", "act1")),
                stride=STEM_STRIDE if k == 0 else 1,
            )
            for k, i in enumerate(convs)
        )
    # Every strided op here (the stem convs and pool, the strided 3x3, the strided 1x1 projection,
    # all with timm's symmetric padding) maps a side of n pixels to ceil(n / stride).
    for s in stem:
        channels = expect_conv(ckpt, expected, s.conv, channels, norm=s.norm)[0]
        height, width = -(-height // s.stride), -(-width // s.stride)
    height, width = -(-height // STEM_POOL[1]), -(-width // STEM_POOL[1])

    found = block_indices(ckpt, r"^layer(\d+)\.(\d+)\.")
    stages = sorted({s for s, _ in found})
    if stages != list(range(1, len(arch.stage_strides) + 1)):
        raise UnsupportedModel(
            f"{name}: expected stages layer1..layer{len(arch.stage_strides)}, the checkpoint has "
            f"{', '.join(f'layer{s}' for s in stages) or 'none'}"
        )
    blocks = []
    for stage, stage_stride in zip(stages, arch.stage_strides):
        indices = [b for s, b in found if s == stage]
        if indices != list(range(len(indices))):
            raise CheckpointError(f"{name}: layer{stage} block indices {indices} are not 0..{len(indices) - 1}")
        for index in indices:
            prefix = f"layer{stage}.{index}"
            stride = stage_stride if index == 0 else 1
            n = 3 if f"{prefix}.conv3.weight" in names else 2
            x = channels
            for i in range(1, n + 1):
                channels = expect_conv(ckpt, expected, f"{prefix}.conv{i}", channels, norm=f"{prefix}.bn{i}")[0]
            se = f"{prefix}.se.fc1.weight" in names
            if se:
                expect_squeeze_excite(ckpt, expected, f"{prefix}.se", channels)
            shortcut = None
            if f"{prefix}.downsample.0.weight" in names:
                shortcut = Shortcut(f"{prefix}.downsample.0", f"{prefix}.downsample.1", None)
            elif f"{prefix}.downsample.1.weight" in names:
                # timm's downsample_avg puts nn.Identity at index 0 when the block does not stride.
                pool = f"{prefix}.downsample.0" if stride > 1 else None
                shortcut = Shortcut(f"{prefix}.downsample.1", f"{prefix}.downsample.2", pool)
                if pool and (height % 2 or width % 2):
                    raise UnsupportedModel(
                        f"{name}: {pool} average-pools a {height}x{width} map with ceil_mode=True, which "
                        f"keeps the odd last row/column; trtmc's POOL2D has no ceil mode, so input_size "
                        f"{list(ckpt.config.pretrained.input_size)} is not supported (sides that are "
                        f"multiples of 32 are)"
                    )
            if shortcut is not None:
                projected = expect_conv(ckpt, expected, shortcut.conv, x, norm=shortcut.norm)[0]
            elif stride != 1:
                raise CheckpointError(f"{name}: {prefix} halves the resolution but has no downsample tensors")
            else:
                projected = x
            if projected != channels:
                raise CheckpointError(f"{name}: {prefix} outputs {channels} channels but its shortcut carries {projected}")
            height, width = -(-height // stride), -(-width // stride)
            blocks.append(BlockSpec(prefix, n, stride, 2 if n == 3 else 1, se, shortcut))
    expect_linear(ckpt, expected, "fc", channels)
    expect_tensors(ckpt, expected)
    return Layout(stem, tuple(blocks))


def _block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
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
        x = _block(g, x, ckpt, block, arch)
    return classifier_head(g, g.global_avg_pool(x, "global_pool"), ckpt, "fc")


def build(ckpt: Checkpoint, arch: ArchConfig) -> Graph:
    layout = derive_layout(ckpt, arch)
    g = GraphBuilder()
    g.output(emit(g, ckpt, layout, arch))
    return g.finish()


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
    build=build,
)
