"""EfficientNet and EfficientNet-Lite (https://arxiv.org/abs/1905.11946) and MobileNetV2
(https://arxiv.org/abs/1801.04381), built from timm's depthwise-separable and inverted-residual blocks,
whose emitters mobilenetv3.py shares. It reads `conv_stem`/`bn1`, every
`blocks.<stage>.<block>.{conv_dw,conv_pw,conv_pwl,conv,bn1..bn3,se.*}`, `conv_head`/`bn2` and `classifier`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv_norm_act, image_input, linear, squeeze_excite

# timm builds every `tf_` port with BN_EPS_TF_DEFAULT (1e-3) and TF "SAME" padding; its own
# re-trained models keep PyTorch's BatchNorm2d default eps.
TIMM_EPS = 1e-5
TF_EPS = 1e-3


class BlockKind(str, Enum):
    """timm's block classes (_efficientnet_blocks.py), named by their arch-def tokens."""

    DEPTHWISE_SEPARABLE = "ds"  # conv_dw, bn1, [se], conv_pw, bn2
    INVERTED_RESIDUAL = "ir"  # conv_pw, bn1, conv_dw, bn2, [se], conv_pwl, bn3
    CONV_BN_ACT = "cn"  # conv, bn1


@dataclass(frozen=True)
class StageSpec:
    stride: int  # of the stage's first block; the others keep the resolution
    act: Activation | None = None  # None: the network's activation (ArchConfig.act)


# Stage grammar, after timm's arch-def strings: one space-separated word per stage, each word
# `_`-joined tokens.
#   s1/s2  the first block of the stage strides by 1 or 2 (no tensor says where resolution halves)
#   nre    the stage's blocks use ReLU instead of the network's activation (timm's own token)
_ACT_TOKENS = {"nre": Activation.RELU}


def decode_stages(spec: str) -> tuple[StageSpec, ...]:
    stages = []
    for word in spec.split():
        stride, act = None, None
        for tok in word.split("_"):
            if re.fullmatch(r"s[12]", tok):
                stride = int(tok[1:])
            elif tok in _ACT_TOKENS:
                act = _ACT_TOKENS[tok]
            else:
                raise ValueError(f"unknown token {tok!r} in {spec!r}")
        if stride is None:
            raise ValueError(f"stage {word!r} in {spec!r} has no stride token s1/s2")
        stages.append(StageSpec(stride, act))
    return tuple(stages)


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of an EfficientNet-style network cannot say."""

    stages: tuple[StageSpec, ...]
    act: Activation
    eps: float = TIMM_EPS
    tf_same: bool = False  # TF "SAME" padding: asymmetric on stride-2 convolutions
    se_act: Activation | None = None  # squeeze-excite inner activation; None: the block's own
    se_gate: Activation = Activation.SIGMOID


@dataclass(frozen=True)
class BlockSpec:
    prefix: str
    kind: BlockKind
    stride: int
    act: Activation
    se: bool
    skip: bool  # timm: has_skip = stride == 1 and in_chs == out_chs (no `noskip` in these nets)
    in_width: int
    out_width: int


@dataclass(frozen=True)
class Layout:
    blocks: tuple[BlockSpec, ...]
    head_width: int  # conv_head output channels, the classifier's input


# ---- layout -----------------------------------------------------------------------------------

# Per block class, its (convolution, norm) pairs in forward order.
_CONVS = {
    BlockKind.INVERTED_RESIDUAL: (("conv_pw", "bn1"), ("conv_dw", "bn2"), ("conv_pwl", "bn3")),
    BlockKind.DEPTHWISE_SEPARABLE: (("conv_dw", "bn1"), ("conv_pw", "bn2")),
    BlockKind.CONV_BN_ACT: (("conv", "bn1"),),
}
# The convolution that tells the classes apart, tried in this order (an "ir" block has a conv_dw too).
_DISTINGUISHING = (
    (BlockKind.INVERTED_RESIDUAL, "conv_pwl"),
    (BlockKind.DEPTHWISE_SEPARABLE, "conv_dw"),
    (BlockKind.CONV_BN_ACT, "conv"),
)


def _derive_block(read: LayoutReader, prefix: str, width: int, stride: int, act: Activation) -> BlockSpec:
    """One block from its keys and shapes, every tensor of it placed."""
    kind = next((k for k, conv in _DISTINGUISHING if f"{prefix}.{conv}.weight" in read), None)
    if kind is None:
        raise CheckpointError(
            f"{read.arch}: {prefix} holds none of conv_pwl, conv_dw or conv weights, so it is no timm block"
        )
    in_width, se_width = width, None
    for conv, norm in _CONVS[kind]:
        # Each convolution reads the width the one before it wrote; a depthwise one keeps its width
        # (its weight is [channels, 1, k, k]). Squeeze-excite sits right after it, at that width.
        depthwise = conv == "conv_dw"
        dims = {0: width, 1: 1} if depthwise else {1: width}
        width = read.conv(f"{prefix}.{conv}", width, norm=f"{prefix}.{norm}", bias=False, dims=dims)
        se_width = width if depthwise else se_width
    # A ConvBnAct has no place for SE; tensors of one there are refused as unknown by `finish`.
    se = se_width is not None and f"{prefix}.se.conv_reduce.weight" in read
    if se:
        read.squeeze_excite(f"{prefix}.se", se_width)  # timm rounds the SE width per network; the tensor says it
    return BlockSpec(
        prefix=prefix,
        kind=kind,
        stride=stride,
        act=act,
        se=se,
        # timm's ConvBnAct only skips when its arch string says `skip`, which none of the served
        # networks do.
        skip=kind is not BlockKind.CONV_BN_ACT and stride == 1 and in_width == width,
        in_width=in_width,
        out_width=width,
    )


def _derive_blocks(read: LayoutReader, arch: ArchConfig, in_width: int) -> tuple[BlockSpec, ...]:
    """Every block of `blocks.<stage>.<block>`: class from its keys, widths from its shapes.

    Only the stride and activation of a stage come from `arch.stages`. The widths must chain from
    `in_width` (the stem's) through every block, so a mis-shaped tensor is refused here, before
    any weight is read.
    """
    found = indexed_blocks(read.ckpt, r"^blocks\.(\d+)\.(\d+)\.")
    stages = sorted({stage for stage, _ in found})
    if len(stages) != len(arch.stages):
        raise CheckpointError(
            f"{read.arch}: the checkpoint has blocks.<stage> indices {stages}, but {read.arch} has "
            f"{len(arch.stages)} stages (0..{len(arch.stages) - 1})"
        )
    blocks: list[BlockSpec] = []
    for stage, index in found:
        spec = arch.stages[stage]
        width = blocks[-1].out_width if blocks else in_width
        stride = spec.stride if index == 0 else 1
        blocks.append(_derive_block(read, f"blocks.{stage}.{index}", width, stride, spec.act or arch.act))
    return tuple(blocks)


def derive_layout(ckpt: Checkpoint, arch: ArchConfig, *, head_norm: bool = True) -> Layout:
    """Stem, blocks and head from names and shapes; every tensor must have its place in them.

    `head_norm` (timm's name): EfficientNet follows conv_head with batch norm; MobileNetV3's
    conv_head has a bias instead.
    """
    read = LayoutReader(ckpt)
    in_chans = ckpt.config.pretrained.input_size[0]
    stem = read.conv("conv_stem", in_chans, norm="bn1", bias=False, dims={1: in_chans})
    blocks = _derive_blocks(read, arch, stem)
    width = blocks[-1].out_width
    norm = "bn2" if head_norm else None
    head = read.conv("conv_head", width, norm=norm, bias=not head_norm, dims={1: width, 2: 1, 3: 1})
    read.classifier("classifier", head, bias=True)
    read.finish()
    return Layout(blocks, head)


# ---- emission ---------------------------------------------------------------------------------


def emit_stem(g: GraphBuilder, ckpt: Checkpoint, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    return conv_norm_act(g, x, ckpt, "conv_stem", "bn1", arch.act, eps=arch.eps, stride=2, tf_same=arch.tf_same)


def emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: BlockSpec, arch: ArchConfig) -> Tensor:
    """One timm block; drop_path is the identity at eval, so the skip is a plain add."""
    p = block.prefix

    def cna(t: Tensor, conv: str, norm: str, fn: Activation | None, stride: int = 1) -> Tensor:
        return conv_norm_act(g, t, ckpt, f"{p}.{conv}", f"{p}.{norm}", fn, eps=arch.eps, stride=stride, tf_same=arch.tf_same)

    def se(t: Tensor) -> Tensor:
        if not block.se:
            return t
        return squeeze_excite(g, t, ckpt, f"{p}.se", inner=arch.se_act or block.act, gate=arch.se_gate)

    if block.kind is BlockKind.CONV_BN_ACT:
        y = cna(x, "conv", "bn1", block.act, block.stride)
    elif block.kind is BlockKind.DEPTHWISE_SEPARABLE:
        y = se(cna(x, "conv_dw", "bn1", block.act, block.stride))
        y = cna(y, "conv_pw", "bn2", None)  # timm's pw_act=False: no activation after the projection
    else:
        y = cna(x, "conv_pw", "bn1", block.act)
        y = se(cna(y, "conv_dw", "bn2", block.act, block.stride))
        y = cna(y, "conv_pwl", "bn3", None)
    return g.add(y, x, p) if block.skip else y


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = emit_stem(g, ckpt, arch)
    for block in layout.blocks:
        x = emit_block(g, x, ckpt, block, arch)
    x = conv_norm_act(g, x, ckpt, "conv_head", "bn2", arch.act, eps=arch.eps, tf_same=arch.tf_same)
    x = g.global_avg_pool(x, "global_pool")
    return linear(g, x, ckpt, "classifier")


# ---- registration -----------------------------------------------------------------------------

# EfficientNet, its Lite variants and MobileNetV2 share one seven-stage schedule: resolution halves
# at stages 1, 2, 3 and 5 (timm's arch_def `s2` entries), giving output stride 32 after the stem.
EFFICIENTNET_STAGES = decode_stages("s1 s2 s2 s2 s1 s2 s1")

_TIMM = ArchConfig(EFFICIENTNET_STAGES, Activation.SILU)  # timm's 'swish'
_TF = replace(_TIMM, eps=TF_EPS, tf_same=True)
# Lite drops squeeze-excite (absent from its tensors) and uses ReLU6, which quantizes well.
_TF_LITE = replace(_TF, act=Activation.RELU6)
_MOBILENETV2 = ArchConfig(EFFICIENTNET_STAGES, Activation.RELU6)

ARCHITECTURES = {
    "efficientnet_b0": _TIMM,
    "efficientnet_b1": _TIMM,
    "efficientnet_b2": _TIMM,
    "efficientnet_b3": _TIMM,
    "tf_efficientnet_b0": _TF,
    "tf_efficientnet_b1": _TF,
    "tf_efficientnet_b2": _TF,
    "tf_efficientnet_b3": _TF,
    "tf_efficientnet_lite0": _TF_LITE,
    "tf_efficientnet_lite1": _TF_LITE,
    "tf_efficientnet_lite2": _TF_LITE,
    "tf_efficientnet_lite3": _TF_LITE,
    "tf_efficientnet_lite4": _TF_LITE,
    "mobilenetv2_100": _MOBILENETV2,
}

FAMILY = Family(
    name="efficientnet",
    summary="EfficientNet B0-B3, EfficientNet-Lite0-4 and MobileNetV2: inverted-residual blocks, optional SE",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
