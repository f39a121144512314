"""GhostNet v1 (Han et al., https://arxiv.org/abs/1911.11907): ghost bottlenecks whose 1x1 convolutions are
split into a primary convolution plus a cheap depthwise one, concatenated and cut to the output width.

It reads `conv_stem`/`bn1`, every `blocks.<stage>.<block>.{ghost1,conv_dw,bn_dw,se,ghost2,shortcut}` tensor,
the final `blocks.<last>.0.{conv,bn1}`, `conv_head` and `classifier`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import act, batch_norm, conv, conv_norm_act, image_input, linear, squeeze_excite

_BLOCK = r"^blocks\.(\d+)\.(\d+)\.ghost1\."


@dataclass(frozen=True)
class GhostNetConfig:
    # timm builds GhostNet v1 with plain nn.BatchNorm2d (eps 1e-5) and ReLU throughout.
    eps: float = 1e-5
    act: Activation = Activation.RELU
    # _SE_LAYER = partial(SqueezeExcite, gate_layer='hard_sigmoid'): relu6(x + 3) / 6, not a sigmoid.
    se_gate: Activation = Activation.HARD_SIGMOID
    # conv_dw exists only in blocks with stride > 1, and its weight does not record the stride: every
    # downsampling row of timm's GhostNet cfgs uses s=2.
    downsample_stride: int = 2


# ---- layout ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GhostSpec:
    """One Ghost module: primary 1x1 conv, cheap depthwise conv, concatenated and cut to `width`."""

    prefix: str
    width: int


@dataclass(frozen=True)
class BottleneckSpec:
    prefix: str  # blocks.<stage>.<block>
    in_chs: int
    out_chs: int
    ghost1: GhostSpec  # expands to the block's mid width
    ghost2: GhostSpec  # projects back to out_chs, no activation
    stride: int  # > 1 only with a conv_dw
    has_se: bool
    conv_shortcut: bool  # depthwise conv + bn, 1x1 conv + bn; otherwise identity


@dataclass(frozen=True)
class Layout:
    blocks: tuple[BottleneckSpec, ...]
    head: str  # blocks.<last>.0: the final ConvBnAct


def _ghost_spec(read: LayoutReader, prefix: str, in_chs: int, width: int) -> GhostSpec:
    primary, cheap_op = f"{prefix}.primary_conv", f"{prefix}.cheap_operation"
    init = read.conv(f"{primary}.0", in_chs, norm=f"{primary}.1", bias=False, dims={1: in_chs})
    cheap = read.shape(f"{cheap_op}.0.weight", rank=4, dims={1: 1})
    new = cheap[0]
    # The cheap op is depthwise (a whole number of outputs per primary channel) and the concatenation
    # holds at least the width the block asks for.
    if new % init or not init < width <= init + new:
        raise CheckpointError(
            f"{read.arch}: ghost module {prefix} has {init} primary and {new} cheap channels "
            f"({cheap_op}.0.weight {cheap}), which cannot produce {width} channels"
        )
    read.conv(f"{cheap_op}.0", init, norm=f"{cheap_op}.1", bias=False)
    return GhostSpec(prefix, width)


def _bottleneck_spec(read: LayoutReader, prefix: str, in_chs: int, config: GhostNetConfig) -> BottleneckSpec:
    # ghost2 reads the mid width that ghost1 makes and conv_dw and the SE keep.
    mid = read.shape(f"{prefix}.ghost2.primary_conv.0.weight", rank=4)[1]
    ghost1 = _ghost_spec(read, f"{prefix}.ghost1", in_chs, mid)
    stride = 1
    if f"{prefix}.conv_dw.weight" in read:
        stride = config.downsample_stride
        read.conv(f"{prefix}.conv_dw", mid, norm=f"{prefix}.bn_dw", bias=False, dims={0: mid, 1: 1})
    has_se = f"{prefix}.se.conv_reduce.weight" in read
    if has_se:
        read.squeeze_excite(f"{prefix}.se", mid)
    shortcut = f"{prefix}.shortcut"
    conv_shortcut = f"{shortcut}.0.weight" in read
    if conv_shortcut:
        # A depthwise conv and its norm, then a 1x1 conv to the block's output width and its norm.
        read.conv(f"{shortcut}.0", in_chs, norm=f"{shortcut}.1", bias=False, dims={0: in_chs, 1: 1})
        out = read.conv(f"{shortcut}.2", in_chs, norm=f"{shortcut}.3", bias=False, dims={1: in_chs, 2: 1, 3: 1})
    elif stride != 1:
        raise CheckpointError(f"{read.arch}: {prefix} downsamples (it has conv_dw) but has no {prefix}.shortcut.0.weight")
    else:
        out = in_chs  # timm keeps an identity shortcut only where the width and resolution stay
    ghost2 = _ghost_spec(read, f"{prefix}.ghost2", mid, out)
    return BottleneckSpec(prefix, in_chs, out, ghost1, ghost2, stride, has_se, conv_shortcut)


def derive_layout(ckpt: Checkpoint, config: GhostNetConfig) -> Layout:
    """The bottleneck sequence from key names (stage and block indices) and shapes (widths).

    Reads names and shapes only, so a malformed checkpoint is refused before any weight loads; a
    tensor the layout does not account for is refused too, so no weight is dropped silently.
    """
    read = LayoutReader(ckpt)
    indices = indexed_blocks(ckpt, _BLOCK)
    if not indices:
        raise UnsupportedModel(
            f"{read.arch}: no blocks.<stage>.<block>.ghost1 tensors; is this a GhostNet v1 checkpoint?"
        )
    width = read.conv("conv_stem", 3, norm="bn1", bias=False, dims={1: 3})
    blocks = []
    for stage, number in indices:
        blocks.append(_bottleneck_spec(read, f"blocks.{stage}.{number}", width, config))
        width = blocks[-1].out_chs
    head = f"blocks.{indices[-1][0] + 1}.0"
    features = read.conv(f"{head}.conv", width, norm=f"{head}.bn1", bias=False, dims={1: width, 2: 1, 3: 1})
    hidden = read.conv("conv_head", features, bias=True, dims={1: features, 2: 1, 3: 1})
    read.classifier("classifier", hidden, bias=True)
    # GhostNet v2/v3 (ghost1.short_conv, the *_rpr_* branches) fail here, as unexpected tensors.
    read.finish()
    return Layout(tuple(blocks), head)


# ---- emission -------------------------------------------------------------------------------


def _ghost(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, spec: GhostSpec, fn: Activation | None, eps: float) -> Tensor:
    p = spec.prefix
    x1 = batch_norm(g, conv(g, x, ckpt, f"{p}.primary_conv.0"), ckpt, f"{p}.primary_conv.1", eps)
    x1 = act(g, x1, fn, f"{p}.primary_conv.2")
    x2 = batch_norm(g, conv(g, x1, ckpt, f"{p}.cheap_operation.0"), ckpt, f"{p}.cheap_operation.1", eps)
    x2 = act(g, x2, fn, f"{p}.cheap_operation.2")
    out = g.concat([x1, x2], 1, f"{p}.cat")
    return out if out.channels == spec.width else g.slice(out, 1, 0, spec.width, f"{p}.out")


def _bottleneck(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, spec: BottleneckSpec, config: GhostNetConfig) -> Tensor:
    p, eps = spec.prefix, config.eps
    y = _ghost(g, x, ckpt, spec.ghost1, config.act, eps)
    if spec.stride > 1:
        y = batch_norm(g, conv(g, y, ckpt, f"{p}.conv_dw", stride=spec.stride), ckpt, f"{p}.bn_dw", eps)
    if spec.has_se:
        y = squeeze_excite(g, y, ckpt, f"{p}.se", inner=config.act, gate=config.se_gate)
    y = _ghost(g, y, ckpt, spec.ghost2, None, eps)
    shortcut = x
    if spec.conv_shortcut:
        shortcut = batch_norm(g, conv(g, x, ckpt, f"{p}.shortcut.0", stride=spec.stride), ckpt, f"{p}.shortcut.1", eps)
        shortcut = batch_norm(g, conv(g, shortcut, ckpt, f"{p}.shortcut.2"), ckpt, f"{p}.shortcut.3", eps)
    return g.add(y, shortcut, f"{p}.add")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, config: GhostNetConfig) -> Tensor:
    x = image_input(g, ckpt)
    x = conv_norm_act(g, x, ckpt, "conv_stem", "bn1", None, eps=config.eps, stride=2)
    x = act(g, x, config.act, "act1")
    for spec in layout.blocks:
        x = _bottleneck(g, x, ckpt, spec, config)
    x = conv_norm_act(g, x, ckpt, f"{layout.head}.conv", f"{layout.head}.bn1", config.act, eps=config.eps)
    # timm pools before conv_head: a 1x1 convolution with bias on the pooled features, then ReLU.
    x = g.global_avg_pool(x, "global_pool", keepdim=True)
    x = act(g, conv(g, x, ckpt, "conv_head"), config.act, "act2")
    x = g.flatten(x, "flatten")
    return linear(g, x, ckpt, "classifier")


FAMILY = Family(
    name="ghostnet",
    summary="GhostNet v1: ghost modules (primary conv + cheap depthwise op), SE with a hard-sigmoid gate",
    architectures={
        # The width multiplier is read from the tensors, so the three sizes share one config.
        "ghostnet_050": GhostNetConfig(),
        "ghostnet_100": GhostNetConfig(),
        "ghostnet_130": GhostNetConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
