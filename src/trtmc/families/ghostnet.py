"""GhostNet v1 (Han et al., https://arxiv.org/abs/1911.11907): ghost bottlenecks whose 1x1 convolutions are
split into a primary convolution plus a cheap depthwise one, concatenated and cut to the output width.

It reads `conv_stem`/`bn1`, every `blocks.<stage>.<block>.{ghost1,conv_dw,bn_dw,se,ghost2,shortcut}` tensor,
the final `blocks.<last>.0.{conv,bn1}`, `conv_head` and `classifier`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Graph
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._parts import (
    act,
    batch_norm,
    block_indices,
    classifier_head,
    conv,
    conv_norm_act,
    expect_shape,
    expect_tensors,
    image_input,
    norm_shapes,
    squeeze_excite,
)

log = logging.getLogger(__name__)

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
    arch: str
    blocks: tuple[BottleneckSpec, ...]
    head: str  # blocks.<last>.0: the final ConvBnAct
    num_classes: int


def _ghost_spec(ckpt: Checkpoint, expected: dict, prefix: str, in_chs: int, width: int) -> GhostSpec:
    init = expect_shape(ckpt, f"{prefix}.primary_conv.0.weight", rank=4, dims={1: in_chs})[0]
    cheap = expect_shape(ckpt, f"{prefix}.cheap_operation.0.weight", rank=4, dims={1: 1})
    new = cheap[0]
    # The cheap op is depthwise (a whole number of outputs per primary channel) and the concatenation
    # holds at least the width the block asks for.
    if new % init or not init < width <= init + new:
        raise CheckpointError(
            f"{ckpt.config.architecture}: ghost module {prefix} has {init} primary and {new} cheap channels "
            f"({prefix}.cheap_operation.0.weight {cheap}), which cannot produce {width} channels"
        )
    expected[f"{prefix}.primary_conv.0.weight"] = ckpt.shape(f"{prefix}.primary_conv.0.weight")
    expected[f"{prefix}.cheap_operation.0.weight"] = cheap
    expected.update(norm_shapes(f"{prefix}.primary_conv.1", init))
    expected.update(norm_shapes(f"{prefix}.cheap_operation.1", new))
    return GhostSpec(prefix, width)


def _bottleneck_spec(
    ckpt: Checkpoint, expected: dict, prefix: str, in_chs: int, config: GhostNetConfig
) -> BottleneckSpec:
    arch = ckpt.config.architecture
    # ghost2 reads the mid width that ghost1 makes and conv_dw and the SE keep.
    mid = expect_shape(ckpt, f"{prefix}.ghost2.primary_conv.0.weight", rank=4)[1]
    ghost1 = _ghost_spec(ckpt, expected, f"{prefix}.ghost1", in_chs, mid)
    stride = 1
    if f"{prefix}.conv_dw.weight" in ckpt:
        stride = config.downsample_stride
        kernel = expect_shape(ckpt, f"{prefix}.conv_dw.weight", rank=4, dims={0: mid, 1: 1})
        expected[f"{prefix}.conv_dw.weight"] = kernel
        expected.update(norm_shapes(f"{prefix}.bn_dw", mid))
    has_se = f"{prefix}.se.conv_reduce.weight" in ckpt
    if has_se:
        reduced = expect_shape(ckpt, f"{prefix}.se.conv_reduce.weight", rank=4)[0]
        expected[f"{prefix}.se.conv_reduce.weight"] = (reduced, mid, 1, 1)
        expected[f"{prefix}.se.conv_reduce.bias"] = (reduced,)
        expected[f"{prefix}.se.conv_expand.weight"] = (mid, reduced, 1, 1)
        expected[f"{prefix}.se.conv_expand.bias"] = (mid,)
    conv_shortcut = f"{prefix}.shortcut.0.weight" in ckpt
    if conv_shortcut:
        kernel = expect_shape(ckpt, f"{prefix}.shortcut.0.weight", rank=4, dims={0: in_chs, 1: 1})
        out = expect_shape(ckpt, f"{prefix}.shortcut.2.weight", rank=4)[0]
        expected[f"{prefix}.shortcut.0.weight"] = kernel
        expected.update(norm_shapes(f"{prefix}.shortcut.1", in_chs))
        expected[f"{prefix}.shortcut.2.weight"] = (out, in_chs, 1, 1)
        expected.update(norm_shapes(f"{prefix}.shortcut.3", out))
    elif stride != 1:
        raise CheckpointError(f"{arch}: {prefix} downsamples (it has conv_dw) but has no {prefix}.shortcut.0.weight")
    else:
        out = in_chs  # timm keeps an identity shortcut only where the width and resolution stay
    ghost2 = _ghost_spec(ckpt, expected, f"{prefix}.ghost2", mid, out)
    return BottleneckSpec(prefix, in_chs, out, ghost1, ghost2, stride, has_se, conv_shortcut)


def derive_layout(ckpt: Checkpoint, config: GhostNetConfig) -> Layout:
    """The bottleneck sequence from key names (stage and block indices) and shapes (widths).

    Reads names and shapes only, so a malformed checkpoint is refused before any weight loads; a
    tensor the layout does not account for is refused too, so no weight is dropped silently.
    """
    arch = ckpt.config.architecture
    indices = block_indices(ckpt, _BLOCK)
    if not indices:
        raise UnsupportedModel(f"{arch}: no blocks.<stage>.<block>.ghost1 tensors; is this a GhostNet v1 checkpoint?")
    stages = sorted({s for s, _ in indices})
    if stages != list(range(len(stages))):
        raise CheckpointError(f"{arch}: block stages {stages} are not contiguous from blocks.0")

    expected: dict[str, tuple[int, ...]] = {}
    expected["conv_stem.weight"] = expect_shape(ckpt, "conv_stem.weight", rank=4, dims={1: 3})
    width = expected["conv_stem.weight"][0]
    expected.update(norm_shapes("bn1", width))
    blocks = []
    for stage in stages:
        numbers = [b for s, b in indices if s == stage]
        if numbers != list(range(len(numbers))):
            raise CheckpointError(f"{arch}: blocks.{stage} block indices {numbers} are not contiguous from 0")
        for number in numbers:
            blocks.append(_bottleneck_spec(ckpt, expected, f"blocks.{stage}.{number}", width, config))
            width = blocks[-1].out_chs

    head = f"blocks.{stages[-1] + 1}.0"
    features = expect_shape(ckpt, f"{head}.conv.weight", rank=4, dims={1: width})[0]
    expected[f"{head}.conv.weight"] = (features, width, 1, 1)
    expected.update(norm_shapes(f"{head}.bn1", features))
    hidden = expect_shape(ckpt, "conv_head.weight", rank=4)[0]
    expected["conv_head.weight"] = (hidden, features, 1, 1)
    expected["conv_head.bias"] = (hidden,)
    num_classes = ckpt.config.num_classes
    expected["classifier.weight"] = (num_classes, hidden)
    expected["classifier.bias"] = (num_classes,)
    # GhostNet v2/v3 (ghost1.short_conv, the *_rpr_* branches) fail here, as unexpected tensors.
    expect_tensors(ckpt, expected)
    return Layout(arch, tuple(blocks), head, num_classes)


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


def emit(ckpt: Checkpoint, layout: Layout, config: GhostNetConfig) -> Graph:
    g = GraphBuilder()
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
    g.output(classifier_head(g, x, ckpt))
    return g.finish()


def build(ckpt: Checkpoint, config: GhostNetConfig) -> Graph:
    layout = derive_layout(ckpt, config)
    log.debug("%s: %d ghost bottlenecks", layout.arch, len(layout.blocks))
    return emit(ckpt, layout, config)


FAMILY = Family(
    name="ghostnet",
    summary="GhostNet v1: ghost modules (primary conv + cheap depthwise op), SE with a hard-sigmoid gate",
    architectures={
        # The width multiplier is read from the tensors, so the three sizes share one config.
        "ghostnet_050": GhostNetConfig(),
        "ghostnet_100": GhostNetConfig(),
        "ghostnet_130": GhostNetConfig(),
    },
    build=build,
)
