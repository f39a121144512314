"""RegNetX and RegNetY classifiers as timm builds them (Radosavovic et al., "Designing Network Design
Spaces", https://arxiv.org/abs/2003.13678). Reads the stem `stem.conv`/`stem.bn`, the blocks
`sS.bB.conv{1,2,3}.conv`/`.bn` with their optional `se.fc1`/`se.fc2` and `downsample.conv`/`.bn`, and
the classifier `head.fc`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Graph
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._parts import batch_norm, block_indices, classifier_head, conv, conv_norm_act, expect_tensors, image_input, squeeze_excite
from .resnet import expect_conv, expect_linear, expect_squeeze_excite

# timm's RegNet stem is one 3x3 ConvNormAct with stride 2.
STEM_STRIDE = 2


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of a timm RegNet do not say."""

    # RegNetCfg's defaults for every X/Y model served here: norm_layer='batchnorm' (BatchNormAct2d,
    # eps 1e-5) and act_layer='relu', also inside the SE; no linear_out, no pre-activation.
    eps: float = 1e-5
    act: Activation = Activation.RELU
    # RegNet._get_stage_args at output_stride 32: the stem halves, then every one of the four
    # stages halves in its first block (2 -> 4 -> 8 -> 16 -> 32).
    stage_strides: tuple[int, ...] = (2, 2, 2, 2)


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "s2.b1"
    stride: int  # carried by conv2, the grouped 3x3, and by the 1x1 projection
    se: bool  # RegNetY: squeeze-excite between conv2 and conv3
    projects: bool  # downsample.conv/bn on the shortcut; identity otherwise


@dataclass(frozen=True)
class Layout:
    blocks: tuple[BlockSpec, ...]


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """Stages, blocks, SE and projections from key names and shapes; no weight is read.

    Group counts follow from the conv2 weight shape (width / group width) and the SE width from
    `se.fc1`, so nothing of timm's width/group schedule is tabulated.
    """
    name = ckpt.config.architecture
    names = set(ckpt.names)
    expected: dict[str, tuple[int, ...]] = {}
    channels = expect_conv(ckpt, expected, "stem.conv", ckpt.config.pretrained.input_size[0], norm="stem.bn")[0]
    found = block_indices(ckpt, r"^s(\d+)\.b(\d+)\.")
    stages = sorted({s for s, _ in found})
    if stages != list(range(1, len(arch.stage_strides) + 1)):
        raise UnsupportedModel(
            f"{name}: expected stages s1..s{len(arch.stage_strides)}, the checkpoint has "
            f"{', '.join(f's{s}' for s in stages) or 'none'}"
        )
    blocks = []
    for stage, stage_stride in zip(stages, arch.stage_strides):
        indices = [b for s, b in found if s == stage]
        if indices != list(range(1, len(indices) + 1)):
            raise CheckpointError(f"{name}: s{stage} block indices {indices} are not 1..{len(indices)}")
        for index in indices:
            prefix = f"s{stage}.b{index}"
            stride = stage_stride if index == 1 else 1
            x = channels
            width = expect_conv(ckpt, expected, f"{prefix}.conv1.conv", x, norm=f"{prefix}.conv1.bn")[0]
            width = expect_conv(ckpt, expected, f"{prefix}.conv2.conv", width, norm=f"{prefix}.conv2.bn")[0]
            se = f"{prefix}.se.fc1.weight" in names
            if se:
                expect_squeeze_excite(ckpt, expected, f"{prefix}.se", width)
            channels = expect_conv(ckpt, expected, f"{prefix}.conv3.conv", width, norm=f"{prefix}.conv3.bn")[0]
            projects = f"{prefix}.downsample.conv.weight" in names
            if projects:
                projected = expect_conv(ckpt, expected, f"{prefix}.downsample.conv", x, norm=f"{prefix}.downsample.bn")[0]
            elif stride != 1:
                raise CheckpointError(f"{name}: {prefix} halves the resolution but has no downsample.conv")
            else:
                projected = x
            if projected != channels:
                raise CheckpointError(f"{name}: {prefix} outputs {channels} channels but its shortcut carries {projected}")
            blocks.append(BlockSpec(prefix, stride, se, projects))
    expect_linear(ckpt, expected, "head.fc", channels)
    expect_tensors(ckpt, expected)
    return Layout(tuple(blocks))


def _block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
    p = b.prefix
    y = conv_norm_act(g, x, ckpt, f"{p}.conv1.conv", f"{p}.conv1.bn", arch.act, eps=arch.eps)
    y = conv_norm_act(g, y, ckpt, f"{p}.conv2.conv", f"{p}.conv2.bn", arch.act, eps=arch.eps, stride=b.stride)
    if b.se:
        y = squeeze_excite(g, y, ckpt, f"{p}.se", inner=arch.act, gate=Activation.SIGMOID, reduce="fc1", expand="fc2")
    y = conv_norm_act(g, y, ckpt, f"{p}.conv3.conv", f"{p}.conv3.bn", None, eps=arch.eps)
    shortcut = x
    if b.projects:
        shortcut = conv(g, x, ckpt, f"{p}.downsample.conv", stride=b.stride)
        shortcut = batch_norm(g, shortcut, ckpt, f"{p}.downsample.bn", arch.eps)
    return g.activation(g.add(y, shortcut, p), arch.act, f"{p}.act3")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    x = conv_norm_act(g, x, ckpt, "stem.conv", "stem.bn", arch.act, eps=arch.eps, stride=STEM_STRIDE)
    for block in layout.blocks:
        x = _block(g, x, ckpt, block, arch)
    return classifier_head(g, g.global_avg_pool(x, "head.global_pool"), ckpt, "head.fc")


def build(ckpt: Checkpoint, arch: ArchConfig) -> Graph:
    layout = derive_layout(ckpt, arch)
    g = GraphBuilder()
    g.output(emit(g, ckpt, layout, arch))
    return g.finish()


# RegNetX and RegNetY differ only in the SE tensors; regnety_040 is the plain RegNetCfg too (its
# SiLU/GroupNorm sibling is regnety_040_sgn, not served here).
_TIMM_REGNET = ArchConfig()

FAMILY = Family(
    name="regnet",
    summary="RegNetX / RegNetY (timm regnet.py)",
    architectures={
        "regnetx_002": _TIMM_REGNET,
        "regnetx_016": _TIMM_REGNET,
        "regnety_002": _TIMM_REGNET,
        "regnety_016": _TIMM_REGNET,
        "regnety_040": _TIMM_REGNET,
    },
    build=build,
)
