"""Dual Path Networks (Chen et al., https://arxiv.org/abs/1707.01629): every block reads the concatenation
of a summed residual path and a concatenated dense path, and splits its output back into that pair.

It reads the stem `features.conv1_1.{conv,bn}`, every `features.conv<stage>_<block>.*` tensor (the stride of
a stage from its `c1x1_w_s1`/`c1x1_w_s2` projection, groups and widths from shapes), the final
`features.conv<last>_bn_ac.bn` and the 1x1 convolution `classifier`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks, matched_indices
from ._parts import act, batch_norm, conv, conv_norm_act, image_input, max_pool

_STEM = "features.conv1_1"
_BLOCK = r"^features\.conv(\d+)_(\d+)\.c1x1_a\."
_FINAL = r"^features\.conv(\d+)_bn_ac\.bn\.weight$"
# The projection's member name is its stride: timm names it after the key stride of the block.
_PROJECTIONS = {"c1x1_w_s1": 1, "c1x1_w_s2": 2}


@dataclass(frozen=True)
class DPNConfig:
    # timm builds every DPN norm with eps=0.001, not the PyTorch default of 1e-5.
    eps: float = 1e-3
    # Every norm is a BatchNormAct2d with ReLU. The final conv5_bn_ac asks for `fc_act_layer='elu'`,
    # but get_norm_act_layer keeps the act_layer already bound into the norm partial, so it is ReLU too.
    act: Activation = Activation.RELU
    # features.conv1_pool: nn.MaxPool2d(kernel_size=3, stride=2, padding=1) for every size.
    stem_pool: tuple[int, int, int] = (3, 2, 1)


# ---- layout ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DualPathSpec:
    prefix: str  # features.conv<stage>_<block>
    in_chs: int  # residual + dense width of the pair it reads
    projection: str | None  # c1x1_w_s1 / c1x1_w_s2 in the block that heads a stage
    stride: int
    residual: int  # width of the summed path (timm's num_1x1_c)
    inc: int  # dense channels the block appends
    split_convs: bool  # "b" variants end in c1x1_c1 and c1x1_c2 after a conv-less c1x1_c


@dataclass(frozen=True)
class Layout:
    blocks: tuple[DualPathSpec, ...]
    final_norm: str  # features.conv<last>_bn_ac: norm + ReLU on the concatenated pair


def _block(read: LayoutReader, prefix: str, in_chs: int, residual: int | None) -> DualPathSpec:
    """One dual-path block; `residual` is the stage's summed width, None for the block that heads it."""
    projections = [leaf for leaf in _PROJECTIONS if f"{prefix}.{leaf}.conv.weight" in read]
    if len(projections) > 1 or (residual is None) != bool(projections):
        raise CheckpointError(
            f"{read.arch}: {prefix} has projections {projections}; only the first block of a stage projects, with one"
        )
    projection = projections[0] if projections else None
    split_convs = f"{prefix}.c1x1_c1.weight" in read

    # timm's BnActConv2d: each norm normalizes the input of the conv it precedes.
    read.batch_norm(f"{prefix}.c1x1_a.bn", in_chs)
    mid = read.conv(f"{prefix}.c1x1_a.conv", in_chs, bias=False, dims={1: in_chs, 2: 1, 3: 1})
    read.batch_norm(f"{prefix}.c3x3_b.bn", mid)
    grouped = read.shape(f"{prefix}.c3x3_b.conv.weight", rank=4)
    if mid % grouped[1] or grouped[0] % (mid // grouped[1]):
        raise CheckpointError(
            f"{read.arch}: {prefix}.c3x3_b.conv.weight {grouped} does not split {mid} input channels into groups"
        )
    width = read.conv(f"{prefix}.c3x3_b.conv", mid, bias=False)
    read.batch_norm(f"{prefix}.c1x1_c.bn", width)
    # What the block emits: the residual plus one increment of dense channels, from one convolution
    # split afterwards or ("b") from two.
    if split_convs:
        produced = read.conv(f"{prefix}.c1x1_c1", width, bias=False, dims={1: width, 2: 1, 3: 1})
        inc = read.conv(f"{prefix}.c1x1_c2", width, bias=False, dims={1: width, 2: 1, 3: 1})
    else:
        produced = read.conv(f"{prefix}.c1x1_c.conv", width, bias=False, dims={1: width, 2: 1, 3: 1})

    stride = 1
    if projection is not None:
        # The projection emits the residual plus two increments: with what c1x1_c emits, that fixes both.
        read.batch_norm(f"{prefix}.{projection}.bn", in_chs)
        projected = read.conv(f"{prefix}.{projection}.conv", in_chs, bias=False, dims={1: in_chs, 2: 1, 3: 1})
        if not split_convs:
            inc = projected - produced
        residual = projected - 2 * inc
        stride = _PROJECTIONS[projection]
    elif not split_convs:
        inc = produced - residual
    if inc <= 0 or residual <= 0 or produced != residual + (0 if split_convs else inc):
        raise CheckpointError(
            f"{read.arch}: {prefix} emits {produced}{f' + {inc}' if split_convs else ''} channels from c1x1_c, "
            f"which do not fit a residual path of {residual} channels"
        )
    return DualPathSpec(prefix, in_chs, projection, stride, residual, inc, split_convs)


def derive_layout(ckpt: Checkpoint, config: DPNConfig) -> Layout:
    """Stages and blocks from the `features.conv<stage>_<block>` names, widths and groups from shapes.

    Reads names and shapes only, so a malformed checkpoint is refused before any weight loads; a
    tensor the layout does not account for is refused too, so no weight is dropped silently.
    """
    read = LayoutReader(ckpt)
    # Stages are numbered from conv2 (conv1 is the stem), their blocks from 1.
    indices = indexed_blocks(ckpt, _BLOCK, start=(2, 1))
    if not indices:
        raise UnsupportedModel(
            f"{read.arch}: no features.conv<stage>_<block>.c1x1_a tensors; is this a DPN checkpoint?"
        )
    stem = read.conv(f"{_STEM}.conv", 3, norm=f"{_STEM}.bn", bias=False, dims={1: 3})
    blocks: list[DualPathSpec] = []
    residual, dense = stem, 0  # the stem output enters the first block as a single tensor
    for stage, number in indices:
        stage_residual = None if number == 1 else residual
        spec = _block(read, f"features.conv{stage}_{number}", residual + dense, stage_residual)
        blocks.append(spec)
        residual = spec.residual
        # A projecting block starts the dense path with its two increments; every block appends one.
        dense = (2 * spec.inc if spec.projection else dense) + spec.inc

    last = indices[-1][0]
    final = [stage for (stage,) in matched_indices(ckpt, _FINAL)]
    if final != [last]:
        raise CheckpointError(f"{read.arch}: expected the final norm features.conv{last}_bn_ac, found stages {final}")
    final_norm = f"features.conv{last}_bn_ac"
    read.batch_norm(f"{final_norm}.bn", residual + dense)
    read.classifier("classifier", residual + dense, bias=True, pointwise=True)
    read.finish()
    return Layout(tuple(blocks), final_norm)


# ---- emission -------------------------------------------------------------------------------


def _bn_act_conv(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, config: DPNConfig, stride: int = 1
) -> Tensor:
    """timm's BnActConv2d: the norm and ReLU come before the convolution."""
    x = act(g, batch_norm(g, x, ckpt, f"{prefix}.bn", config.eps), config.act, f"{prefix}.bn.act")
    return conv(g, x, ckpt, f"{prefix}.conv", stride=stride)


def _split(g: GraphBuilder, x: Tensor, at: int, first: str, second: str) -> tuple[Tensor, Tensor]:
    return g.slice(x, 1, 0, at, first), g.slice(x, 1, at, x.channels, second)


def _dual_path(
    g: GraphBuilder, pair: tuple[Tensor, Tensor] | Tensor, ckpt: Checkpoint, spec: DualPathSpec, config: DPNConfig
) -> tuple[Tensor, Tensor]:
    p = spec.prefix
    x_in = pair if isinstance(pair, Tensor) else g.concat(pair, 1, f"{p}.x_in")
    if spec.projection is None:
        x_s1, x_s2 = pair
    else:
        x_s = _bn_act_conv(g, x_in, ckpt, f"{p}.{spec.projection}", config, stride=spec.stride)
        x_s1, x_s2 = _split(g, x_s, spec.residual, f"{p}.x_s1", f"{p}.x_s2")
    y = _bn_act_conv(g, x_in, ckpt, f"{p}.c1x1_a", config)
    y = _bn_act_conv(g, y, ckpt, f"{p}.c3x3_b", config, stride=spec.stride)
    if spec.split_convs:
        y = act(g, batch_norm(g, y, ckpt, f"{p}.c1x1_c.bn", config.eps), config.act, f"{p}.c1x1_c.bn.act")
        out1, out2 = conv(g, y, ckpt, f"{p}.c1x1_c1"), conv(g, y, ckpt, f"{p}.c1x1_c2")
    else:
        y = _bn_act_conv(g, y, ckpt, f"{p}.c1x1_c", config)
        out1, out2 = _split(g, y, spec.residual, f"{p}.out1", f"{p}.out2")
    return g.add(x_s1, out1, f"{p}.resid"), g.concat([x_s2, out2], 1, f"{p}.dense")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, config: DPNConfig) -> Tensor:
    x = image_input(g, ckpt)
    x = conv_norm_act(g, x, ckpt, f"{_STEM}.conv", f"{_STEM}.bn", config.act, eps=config.eps, stride=2)
    kernel, stride, padding = config.stem_pool
    pair: tuple[Tensor, Tensor] | Tensor = max_pool(g, x, "features.conv1_pool", kernel, stride, padding)
    for spec in layout.blocks:
        pair = _dual_path(g, pair, ckpt, spec, config)
    x = g.concat(pair, 1, f"{layout.final_norm}.cat")
    x = act(g, batch_norm(g, x, ckpt, f"{layout.final_norm}.bn", config.eps), config.act, f"{layout.final_norm}.bn.act")
    # timm's DPN head pools first and classifies with a 1x1 convolution (bias included), then flattens.
    x = g.global_avg_pool(x, "global_pool", keepdim=True)
    x = conv(g, x, ckpt, "classifier")
    return g.flatten(x, "flatten")


FAMILY = Family(
    name="dpn",
    summary="Dual Path Networks: summed residual and concatenated dense paths, grouped 3x3, eps 1e-3 norms",
    architectures={
        # Stem kernel (3 or 7), widths, groups, block counts and the "b" split convolutions all come
        # from the tensors; the six sizes differ in nothing else.
        "dpn68": DPNConfig(),
        "dpn68b": DPNConfig(),
        "dpn92": DPNConfig(),
        "dpn98": DPNConfig(),
        "dpn107": DPNConfig(),
        "dpn131": DPNConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
