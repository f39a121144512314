"""EfficientNet and EfficientNet-Lite (https://arxiv.org/abs/1905.11946), MobileNetV2
(https://arxiv.org/abs/1801.04381) and TinyNet (https://arxiv.org/abs/2010.14819), built from the blocks of
timm's EfficientNet builder, which the families of its relatives share. It reads `conv_stem`/`bn1`, every
`blocks.<stage>.<block>` (a ds, ir, er, cn or uir block: its convolutions, a MixedConv2d's `.<i>` parts,
batch norms and `se.*`), `conv_head`/`bn2` and `classifier`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import act, batch_norm, conv, conv_norm_act, image_input, linear, squeeze_excite

# timm builds every `tf_` port with BN_EPS_TF_DEFAULT (1e-3) and TF "SAME" padding; its own
# re-trained models keep PyTorch's BatchNorm2d default eps.
TIMM_EPS = 1e-5
TF_EPS = 1e-3


class BlockKind(str, Enum):
    """timm's block classes (_efficientnet_blocks.py), named by their arch-def tokens."""

    DEPTHWISE_SEPARABLE = "ds"  # conv_dw, bn1, [se], conv_pw, bn2
    INVERTED_RESIDUAL = "ir"  # conv_pw, bn1, conv_dw, bn2, [se], conv_pwl, bn3
    EDGE_RESIDUAL = "er"  # conv_exp, bn1, [se], conv_pwl, bn2: EfficientNetV2's FusedMBConv
    CONV_BN_ACT = "cn"  # conv, bn1
    # MobileNetV4's UIB: [dw_start], pw_exp, [dw_mid], [se], pw_proj, [dw_end], each a .conv and a .bn
    UNIVERSAL_INVERTED_RESIDUAL = "uir"


@dataclass(frozen=True)
class StageSpec:
    stride: int  # of the stage's first block; the others keep the resolution
    act: Activation | None = None  # None: the network's activation (ArchConfig.act)
    skip: bool = False  # its ConvBnAct blocks add their input (timm adds one only when told)
    noskip: bool = False  # none of its blocks adds its input, whatever the shapes
    pw_act: bool = False  # its depthwise-separable blocks activate after the pointwise conv too


# Stage grammar, after timm's arch-def strings: one space-separated word per stage, each word
# `_`-joined tokens, named as timm names them. The tensors say everything else: block classes,
# kernel sizes, widths, squeeze-excite.
#   s1/s2   the first block of the stage strides by 1 or 2 (no tensor says where resolution halves)
#   nre     the stage's blocks use ReLU instead of the network's activation
#   nsw     the stage's blocks use SiLU ("swish") instead of the network's activation
#   skip    the stage's ConvBnAct blocks add their input where the shapes allow (EfficientNetV2)
#   noskip  none of the stage's blocks adds its input
#   dsa     timm's `dsa` blocks: depthwise-separable with an activation after the pointwise conv,
#           never adding their input (LCNet)
_ACT_TOKENS = {"nre": Activation.RELU, "nsw": Activation.SILU}
_FLAG_TOKENS = {"skip": {"skip": True}, "noskip": {"noskip": True}, "dsa": {"pw_act": True, "noskip": True}}


def decode_stages(spec: str) -> tuple[StageSpec, ...]:
    stages = []
    for word in spec.split():
        stride, fields = None, {}
        for tok in word.split("_"):
            if re.fullmatch(r"s[12]", tok):
                stride = int(tok[1:])
            elif tok in _ACT_TOKENS:
                fields["act"] = _ACT_TOKENS[tok]
            elif tok in _FLAG_TOKENS:
                fields.update(_FLAG_TOKENS[tok])
            else:
                raise ValueError(f"unknown token {tok!r} in {spec!r}")
        if stride is None:
            raise ValueError(f"stage {word!r} in {spec!r} has no stride token s1/s2")
        stages.append(StageSpec(stride, **fields))
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
class ConvStep:
    """One convolution of a block and the batch norm after it."""

    conv: str  # module path, "blocks.2.0.conv_dw"
    norm: str
    stride: int
    act: bool  # the block's activation follows the norm
    # A MixedConv2d's input channel groups, one kernel size each (`conv.0`, `conv.1`, ...); () for one conv.
    splits: tuple[int, ...] = ()


@dataclass(frozen=True)
class BlockSpec:
    prefix: str
    kind: BlockKind
    stride: int
    act: Activation
    steps: tuple[ConvStep, ...]
    se_before: str | None  # the conv whose input squeeze-excite rescales; None: no SE
    skip: bool  # timm: has_skip = stride == 1 and in_chs == out_chs, unless the stage says otherwise
    in_width: int
    out_width: int

    @property
    def se(self) -> bool:
        return self.se_before is not None


@dataclass(frozen=True)
class Layout:
    blocks: tuple[BlockSpec, ...]
    head_width: int  # conv_head output channels, the classifier's input
    head_norm: str | None  # the batch norm after conv_head; None where conv_head has a bias instead


# ---- layout -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Conv:
    """A convolution slot of a timm block class, named under the block."""

    name: str
    norm: str
    act: bool  # followed by the block's activation
    depthwise: bool = False  # [channels, 1, k, k]: keeps its width
    optional: bool = False  # timm leaves an Identity where the arch def gives it kernel size 0


@dataclass(frozen=True)
class _BlockClass:
    convs: tuple[_Conv, ...]  # in forward order
    strided: tuple[str, ...]  # the conv that takes the block's stride: the first of these present
    se_before: str | None  # squeeze-excite sits right before this conv; None: the class has no SE


_BLOCK_CLASSES = {
    BlockKind.DEPTHWISE_SEPARABLE: _BlockClass(
        (_Conv("conv_dw", "bn1", True, depthwise=True), _Conv("conv_pw", "bn2", False)), ("conv_dw",), "conv_pw"
    ),
    BlockKind.INVERTED_RESIDUAL: _BlockClass(
        (_Conv("conv_pw", "bn1", True), _Conv("conv_dw", "bn2", True, depthwise=True), _Conv("conv_pwl", "bn3", False)),
        ("conv_dw",),
        "conv_pwl",
    ),
    BlockKind.EDGE_RESIDUAL: _BlockClass(
        (_Conv("conv_exp", "bn1", True), _Conv("conv_pwl", "bn2", False)), ("conv_exp",), "conv_pwl"
    ),
    BlockKind.CONV_BN_ACT: _BlockClass((_Conv("conv", "bn1", True),), ("conv",), None),
    # The depthwise convs around the expansion carry no activation; the stride goes to dw_mid, else
    # dw_start, else dw_end (UniversalInvertedResidual.__init__).
    BlockKind.UNIVERSAL_INVERTED_RESIDUAL: _BlockClass(
        (
            _Conv("dw_start.conv", "dw_start.bn", False, depthwise=True, optional=True),
            _Conv("pw_exp.conv", "pw_exp.bn", True),
            _Conv("dw_mid.conv", "dw_mid.bn", True, depthwise=True, optional=True),
            _Conv("pw_proj.conv", "pw_proj.bn", False),
            _Conv("dw_end.conv", "dw_end.bn", False, depthwise=True, optional=True),
        ),
        ("dw_mid.conv", "dw_start.conv", "dw_end.conv"),
        "pw_proj.conv",
    ),
}
# The convolution that tells the classes apart, tried in this order (an "er" block has a conv_pwl
# too, an "ir" block a conv_dw).
_DISTINGUISHING = (
    (BlockKind.EDGE_RESIDUAL, "conv_exp"),
    (BlockKind.INVERTED_RESIDUAL, "conv_pwl"),
    (BlockKind.DEPTHWISE_SEPARABLE, "conv_dw"),
    (BlockKind.CONV_BN_ACT, "conv"),
    (BlockKind.UNIVERSAL_INVERTED_RESIDUAL, "pw_exp.conv"),
)


def split_channels(channels: int, groups: int) -> tuple[int, ...]:
    """timm's MixedConv2d split: equal groups, the remainder to the first."""
    split = [channels // groups] * groups
    split[0] += channels - sum(split)
    return tuple(split)


def _mixed_parts(read: LayoutReader, path: str) -> int:
    """How many kernels a MixedConv2d at `path` holds (`path.0.weight`, ...); 0 where there is none."""
    return len(indexed_blocks(read.ckpt, rf"^{re.escape(path)}\.(\d+)\.weight$"))


def _has_conv(read: LayoutReader, path: str) -> bool:
    return f"{path}.weight" in read or _mixed_parts(read, path) > 0


def _read_conv(read: LayoutReader, path: str, width: int, depthwise: bool) -> tuple[int, tuple[int, ...]]:
    """The conv at `path` reading `width` channels, or the MixedConv2d there (one conv per channel
    group, kernel sizes from the shapes); its output width and input groups (() for one conv)."""

    def part(name: str, channels: int) -> int:
        # A depthwise conv's weight is [channels, 1, k, k]; any other reads all of its input.
        return read.conv(name, channels, bias=False, dims={0: channels, 1: 1} if depthwise else {1: channels})

    parts = 0 if f"{path}.weight" in read else _mixed_parts(read, path)
    if not parts:
        return part(path, width), ()  # a missing weight is refused here, by name
    splits = split_channels(width, parts)
    return sum(part(f"{path}.{i}", channels) for i, channels in enumerate(splits)), splits


def _block_kind(read: LayoutReader, prefix: str) -> BlockKind:
    kind = next((k for k, conv in _DISTINGUISHING if _has_conv(read, f"{prefix}.{conv}")), None)
    if kind is None:
        # Another block class of timm's builder (MobileNetV4's attention blocks, CondConv) or none at all.
        held = sorted(n for n in read.ckpt.names if n.startswith(f"{prefix}."))
        convs = ", ".join(conv for _, conv in _DISTINGUISHING)
        raise UnsupportedModel(
            f"{read.arch}: {prefix} holds none of the {convs} weights of the blocks this layout builds, "
            f"but {', '.join(held[:3])}{' ...' if len(held) > 3 else ''}"
        )
    return kind


def _derive_block(read: LayoutReader, prefix: str, width: int, stride: int, stage: StageSpec, act: Activation) -> BlockSpec:
    """One block from its keys and shapes, every tensor of it placed."""
    kind = _block_kind(read, prefix)
    block_class = _BLOCK_CLASSES[kind]
    convs = [c for c in block_class.convs if not c.optional or _has_conv(read, f"{prefix}.{c.name}")]
    present = {c.name for c in convs}
    strided = next((name for name in block_class.strided if name in present), None)
    if strided is None and stride != 1:
        raise CheckpointError(f"{read.arch}: {prefix} strides by {stride} but has no depthwise conv to stride with")
    in_width, steps, se_before = width, [], None
    for slot in convs:
        path = f"{prefix}.{slot.name}"
        # Squeeze-excite rescales the input of its conv, at that width. A class with no place for
        # SE (ConvBnAct) leaves its tensors to be refused as unknown by `finish`.
        if slot.name == block_class.se_before and f"{prefix}.se.conv_reduce.weight" in read:
            read.squeeze_excite(f"{prefix}.se", width)  # timm rounds the SE width per network; the tensor says it
            se_before = path
        width, splits = _read_conv(read, path, width, slot.depthwise)
        read.batch_norm(f"{prefix}.{slot.norm}", width)
        activates = slot.act or (kind is BlockKind.DEPTHWISE_SEPARABLE and stage.pw_act)
        steps.append(ConvStep(path, f"{prefix}.{slot.norm}", stride if slot.name == strided else 1, activates, splits))
    # timm's ConvBnAct adds its input only where the arch def says `skip`; the others wherever the
    # shapes allow, unless it says `noskip`.
    may_skip = stage.skip if kind is BlockKind.CONV_BN_ACT else not stage.noskip
    return BlockSpec(
        prefix=prefix,
        kind=kind,
        stride=stride,
        act=act,
        steps=tuple(steps),
        se_before=se_before,
        skip=may_skip and stride == 1 and in_width == width,
        in_width=in_width,
        out_width=width,
    )


def _derive_blocks(read: LayoutReader, arch: ArchConfig, in_width: int) -> tuple[BlockSpec, ...]:
    """Every block of `blocks.<stage>.<block>`: class from its keys, widths from its shapes.

    Only the stride, activation and skip rule of a stage come from `arch.stages`. The widths must
    chain from `in_width` (the stem's) through every block, so a mis-shaped tensor is refused here,
    before any weight is read.
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
        blocks.append(_derive_block(read, f"blocks.{stage}.{index}", width, stride, spec, spec.act or arch.act))
    return tuple(blocks)


def derive_layout(ckpt: Checkpoint, arch: ArchConfig, *, head_norm: str | None = "bn2") -> Layout:
    """Stem, blocks and head from names and shapes; every tensor must have its place in them.

    `head_norm` names the batch norm after conv_head: EfficientNet's `bn2`; MobileNetV3's conv_head
    has a bias instead (None), MobileNetV4's is followed by `norm_head`.
    """
    read = LayoutReader(ckpt)
    in_chans = ckpt.config.pretrained.input_size[0]
    stem = read.conv("conv_stem", in_chans, norm="bn1", bias=False, dims={1: in_chans})
    blocks = _derive_blocks(read, arch, stem)
    width = blocks[-1].out_width
    head = read.conv("conv_head", width, norm=head_norm, bias=head_norm is None, dims={1: width, 2: 1, 3: 1})
    read.classifier("classifier", head, bias=True)
    read.finish()
    return Layout(blocks, head, head_norm)


# ---- emission ---------------------------------------------------------------------------------


def emit_stem(g: GraphBuilder, ckpt: Checkpoint, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    return conv_norm_act(g, x, ckpt, "conv_stem", "bn1", arch.act, eps=arch.eps, stride=2, tf_same=arch.tf_same)


def _emit_mixed_conv(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, step: ConvStep, arch: ArchConfig) -> Tensor:
    """timm's MixedConv2d: each channel group through its own conv, padded for its kernel size.

    MixNet's split 1x1 convs (equal halves through equal kernels) could be one conv with groups=2, exactly;
    they stay dense convs over channel slices, as timm runs them. The grouped form was measured at 0.69x the
    expert at batch 1 on the H200 (NOTES, run 7): cuDNN's channels-last grouped 1x1 kernels are the suspect.
    """
    parts, start = [], 0
    for i, width in enumerate(step.splits):
        part = g.slice(x, 1, start, start + width, f"{step.conv}.split")
        parts.append(conv(g, part, ckpt, f"{step.conv}.{i}", stride=step.stride, tf_same=arch.tf_same))
        start += width
    return g.concat(parts, 1, step.conv)


def _emit_step(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, step: ConvStep, fn: Activation, arch: ArchConfig) -> Tensor:
    if step.splits:
        y = _emit_mixed_conv(g, x, ckpt, step, arch)
    else:
        y = conv(g, x, ckpt, step.conv, stride=step.stride, tf_same=arch.tf_same)
    y = batch_norm(g, y, ckpt, step.norm, arch.eps)
    return act(g, y, fn, f"{step.norm}.act") if step.act else y


def emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: BlockSpec, arch: ArchConfig) -> Tensor:
    """One timm block; drop_path is the identity at eval, so the skip is a plain add."""
    y = x
    for step in block.steps:
        if step.conv == block.se_before:
            y = squeeze_excite(g, y, ckpt, f"{block.prefix}.se", inner=arch.se_act or block.act, gate=arch.se_gate)
        y = _emit_step(g, y, ckpt, step, block.act, arch)
    return g.add(y, x, block.prefix) if block.skip else y


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
    # TinyNet shrinks EfficientNet-B0's resolution, width and depth together ("Model Rubik's Cube"):
    # timm builds it with B0's blocks, SiLU and its own padding; the tensors say the widths and depths.
    "tinynet_a": _TIMM,
    "tinynet_b": _TIMM,
    "tinynet_c": _TIMM,
    "tinynet_d": _TIMM,
    "tinynet_e": _TIMM,
}

FAMILY = Family(
    name="efficientnet",
    summary="EfficientNet B0-B3, EfficientNet-Lite0-4, MobileNetV2 and TinyNet A-E: inverted-residual blocks, optional SE",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
