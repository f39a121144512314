"""ResNet, ResNet-D, SE-ResNet, ResNeXt and Wide ResNet classifiers as timm builds them (He et al.,
https://arxiv.org/abs/1512.03385; the "D" stem and shortcut of https://arxiv.org/abs/1812.01187).
Reads the blocks `layerS.B.conv{1,2,3}` / `bn{1,2,3}` with their optional `se.fc1`/`se.fc2`; the stem,
shortcuts and classifier around them are the trunk `_resnet_trunk` reads for every ResNet relative.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..checkpoint import Checkpoint
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader
from ._parts import batch_norm, conv, squeeze_excite
from ._resnet_trunk import FeatureMap, Shortcut, TrunkConfig, derive_shortcut, derive_trunk, emit_residual, emit_trunk
from ._resnet_trunk import Layout as Trunk

# What the tensors of a timm ResNet do not say is what they do not say of any block in its trunk.
ArchConfig = TrunkConfig


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "layer2.0"
    convs: int  # 2 for a basic block, 3 for a bottleneck
    stride: int
    strided_conv: int  # which conv carries the stride: timm strides the 3x3
    se: bool
    shortcut: Shortcut | None  # None: identity


Layout = Trunk[BlockSpec]


def _block(read: LayoutReader, prefix: str, x: FeatureMap, stride: int) -> tuple[BlockSpec, int]:
    """A basic block (conv1, conv2) or a bottleneck (conv1..conv3), its squeeze-excite and its shortcut."""
    convs = 3 if f"{prefix}.conv3.weight" in read else 2
    channels = x.channels
    for i in range(1, convs + 1):
        channels = read.conv(f"{prefix}.conv{i}", channels, norm=f"{prefix}.bn{i}")
    se = f"{prefix}.se.fc1.weight" in read
    if se:
        read.squeeze_excite(f"{prefix}.se", channels, reduce="fc1", expand="fc2")
    shortcut = derive_shortcut(read, prefix, x, channels, stride)
    # timm strides a bottleneck's 3x3 (conv2) and a basic block's first conv.
    return BlockSpec(prefix, convs, stride, 2 if convs == 3 else 1, se, shortcut), channels


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """The stem, the blocks and their shortcuts, from key names and shapes; no weight is read.

    A block is a bottleneck when it has `conv3`; the groups of the 3x3 and every width follow from
    the weight shapes, so one code path serves every size.
    """
    return derive_trunk(ckpt, _block, arch.stage_strides)


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
    return emit_residual(g, y, x, ckpt, p, b.shortcut, b.stride, arch, f"{p}.act{b.convs}")


# The trunk around this family's block: emit(g, checkpoint, layout, arch) -> the logits.
emit = partial(emit_trunk, block=_emit_block)


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
