"""Pre-activation ResNets (He et al., "Identity Mappings in Deep Residual Networks",
https://arxiv.org/abs/1603.05027) and Big Transfer's (BiT, https://arxiv.org/abs/1912.11370) as timm's
resnetv2.py builds them. Reads the stem `stem.conv` (or the deep `stem.conv{1,2,3}` with `stem.norm{1,2}`),
the blocks `stages.S.blocks.B.{norm,conv}{1,2,3}` with `downsample.conv`, the final `norm` and the 1x1
conv classifier `head.fc`; whether the norms are batch or group norms follows from their tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import batch_norm, conv, image_input, max_pool, standardize_weight
from ._resnet_trunk import FeatureMap, refuse_odd_ceil_pool, shortcut_pool

_BLOCK = r"^stages\.(\d+)\.blocks\.(\d+)\."
_DEEP_STEM = r"^stem\.conv(\d+)\.weight$"
# The stem's first conv strides 2 (the 7x7, or the first 3x3 of the deep stem); so does its max pool,
# kernel 3 with one pixel of padding on each side.
STEM_STRIDE = 2
STEM_POOL = (3, 2, 1)


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of a timm ResNetV2 do not say."""

    # BatchNormAct2d and GroupNormAct both default to eps=1e-5 and a ReLU after the norm.
    eps: float = 1e-5
    act: Activation = Activation.RELU
    # GroupNormAct's num_groups=32 (BiT): a group norm stores only its per-channel affine.
    groups: int = 32
    # BiT convs are StdConv2d: every weight standardized per output channel (eps 1e-8 in
    # _create_resnetv2_bit); None for the plain convs of resnetv2_50 and its BatchNorm siblings.
    std_conv_eps: float | None = None
    # BiT's stem_type 'fixed': nn.ConstantPad2d(1, 0.) and then an unpadded max pool, so the maxima of
    # the border windows include those zeros. Otherwise the pool pads itself and never picks its padding.
    zero_padded_stem_pool: bool = False
    # avg_down ('d' models): DownsampleAvg average-pools 2x2 before a stride-1 projection, where
    # DownsampleConv strides the 1x1 itself; both store only downsample.conv.
    avg_down: bool = False
    # ResNetV2 at output_stride 32: stages.0 keeps the stem's resolution, each later stage halves it.
    stage_strides: tuple[int, ...] = (1, 2, 2, 2)


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "stages.1.blocks.0"
    convs: int  # 2 for a pre-activation basic block, 3 for a bottleneck
    stride: int  # on the 3x3 that a bottleneck's conv2 and a basic block's conv1 are
    projects: bool  # downsample.conv on the shortcut, reading the pre-activated input


@dataclass(frozen=True)
class Layout:
    stem: tuple[str, ...]  # ("stem.conv",) or the deep stem's convs, stem.norm<i> after all but the last
    blocks: tuple[BlockSpec, ...]
    group_norm: bool  # BiT: every norm a GroupNorm; otherwise every norm a batch norm


def _norm(read: LayoutReader, prefix: str, channels: int, group_norm: bool, arch: ArchConfig) -> None:
    if not group_norm:
        read.batch_norm(prefix, channels)
        return
    if channels % arch.groups:
        raise CheckpointError(f"{read.arch}: {prefix} normalizes {channels} channels, which do not split into {arch.groups} groups")
    read.layer_norm(prefix, channels)  # a group norm's tensors are a layer norm's: weight and bias


def _block(read: LayoutReader, prefix: str, x: FeatureMap, stride: int, group_norm: bool, arch: ArchConfig) -> tuple[BlockSpec, int]:
    convs = 3 if f"{prefix}.conv3.weight" in read else 2
    channels = x.channels
    for i in range(1, convs + 1):
        _norm(read, f"{prefix}.norm{i}", channels, group_norm, arch)
        channels = read.conv(f"{prefix}.conv{i}", channels, bias=False)
    projects = f"{prefix}.downsample.conv.weight" in read
    if projects and arch.avg_down and stride > 1:
        refuse_odd_ceil_pool(read, f"{prefix}.downsample.pool", x)
    read.shortcut(prefix, x.channels, channels, stride, f"{prefix}.downsample.conv" if projects else None, None)
    return BlockSpec(prefix, convs, stride, projects), channels


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """Stem, blocks, projections and the kind of norm from key names and shapes; no weight is read."""
    read = LayoutReader(ckpt)
    # A group norm keeps no running statistics; the final norm says which kind every norm is.
    group_norm = "norm.running_mean" not in read
    stem = ("stem.conv",) if "stem.conv.weight" in read else tuple(
        f"stem.conv{i}" for (i,) in indexed_blocks(ckpt, _DEEP_STEM, start=1)
    )
    if not stem:
        raise CheckpointError(f"{read.arch}: no stem conv (neither stem.conv.weight nor stem.conv1.weight)")
    x = FeatureMap(*ckpt.config.pretrained.input_size)
    for i, prefix in enumerate(stem):
        if i:
            _norm(read, f"stem.norm{i}", x.channels, group_norm, arch)
        x = x.strided(STEM_STRIDE if i == 0 else 1, read.conv(prefix, x.channels, bias=False))
    x = x.strided(STEM_POOL[1])
    blocks = []
    # Stages and their blocks are numbered from 0.
    for stage, index in indexed_blocks(ckpt, _BLOCK, stages=len(arch.stage_strides)):
        stride = arch.stage_strides[stage] if index == 0 else 1
        block, channels = _block(read, f"stages.{stage}.blocks.{index}", x, stride, group_norm, arch)
        blocks.append(block)
        x = x.strided(stride, channels)
    _norm(read, "norm", x.channels, group_norm, arch)
    read.classifier("head.fc", x.channels, bias=True, pointwise=True)
    read.finish()
    return Layout(stem, tuple(blocks), group_norm)


def _norm_act(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, layout: Layout, arch: ArchConfig) -> Tensor:
    if layout.group_norm:
        weight, bias = ckpt.tensor(f"{prefix}.weight"), ckpt.tensor(f"{prefix}.bias")
        x = g.group_norm(x, prefix, arch.groups, weight, bias, arch.eps)
    else:
        x = batch_norm(g, x, ckpt, prefix, arch.eps)
    return g.activation(x, arch.act, f"{prefix}.act")


def _conv(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, arch: ArchConfig, stride: int = 1) -> Tensor:
    if arch.std_conv_eps is None:
        return conv(g, x, ckpt, prefix, stride=stride)
    # StdConv2d standardizes its weight on every forward; standardizing the stored weight once here
    # gives the convolution the same weight.
    weight = standardize_weight(ckpt.tensor(f"{prefix}.weight"), arch.std_conv_eps)
    return conv(g, x, ckpt, prefix, stride=stride, weight=weight)


def _emit_stem(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    for i, prefix in enumerate(layout.stem):
        if i:
            x = _norm_act(g, x, ckpt, f"stem.norm{i}", layout, arch)
        x = _conv(g, x, ckpt, prefix, arch, stride=STEM_STRIDE if i == 0 else 1)
    kernel, stride, padding = STEM_POOL
    if not arch.zero_padded_stem_pool:
        return max_pool(g, x, "stem.pool", kernel, stride, padding)
    # The zeros go in as a depthwise 1x1 identity convolution with that padding: x * 1 is exact in
    # every precision, and the border is exactly 0.
    identity = np.ones((x.channels, 1, 1, 1), np.float32)
    x = g.conv2d(x, "stem.pad", identity, padding=padding, groups=x.channels)
    return max_pool(g, x, "stem.pool", kernel, stride, 0)


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, layout: Layout, arch: ArchConfig) -> Tensor:
    """norm1 -> act, which both paths read; the convs, each after a norm and act; the sum, no act."""
    p = b.prefix
    preact = _norm_act(g, x, ckpt, f"{p}.norm1", layout, arch)
    shortcut = x
    if b.projects:
        pooled = arch.avg_down and b.stride > 1
        shortcut = shortcut_pool(g, preact, f"{p}.downsample.pool", b.stride) if pooled else preact
        shortcut = _conv(g, shortcut, ckpt, f"{p}.downsample.conv", arch, stride=1 if pooled else b.stride)
    # timm strides a bottleneck's 3x3 (conv2) and a basic block's first conv.
    strided = 2 if b.convs == 3 else 1
    y = _conv(g, preact, ckpt, f"{p}.conv1", arch, stride=b.stride if strided == 1 else 1)
    for i in range(2, b.convs + 1):
        y = _norm_act(g, y, ckpt, f"{p}.norm{i}", layout, arch)
        y = _conv(g, y, ckpt, f"{p}.conv{i}", arch, stride=b.stride if strided == i else 1)
    return g.add(y, shortcut, p)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = _emit_stem(g, ckpt, layout, arch)
    for block in layout.blocks:
        x = _emit_block(g, x, ckpt, block, layout, arch)
    x = _norm_act(g, x, ckpt, "norm", layout, arch)
    # ClassifierHead(use_conv=True): pool without flattening, a 1x1 conv with bias, then flatten.
    x = conv(g, g.global_avg_pool(x, "head.global_pool", keepdim=True), ckpt, "head.fc")
    return g.flatten(x, "head.flatten")


FAMILY = Family(
    name="resnetv2",
    summary="Pre-activation ResNet V2 and BiT (weight-standardized convs, GroupNorm) (timm resnetv2.py)",
    architectures={
        # conv_layer=create_conv2d, norm_layer=BatchNormAct2d; basic blocks and bottlenecks are in the tensors.
        "resnetv2_18": ArchConfig(),
        "resnetv2_50": ArchConfig(),
        # stem_type='deep' (in the tensors) and avg_down=True (not).
        "resnetv2_50d": ArchConfig(avg_down=True),
        # _create_resnetv2_bit: stem_type='fixed', StdConv2d(eps=1e-8), GroupNormAct(32).
        "resnetv2_50x1_bit": ArchConfig(std_conv_eps=1e-8, zero_padded_stem_pool=True),
    },
    derive_layout=derive_layout,
    emit=emit,
)
