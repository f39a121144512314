"""RegNetX and RegNetY classifiers as timm builds them (Radosavovic et al., "Designing Network Design
Spaces", https://arxiv.org/abs/2003.13678). Reads the stem `stem.conv`/`stem.bn`, the blocks
`sS.bB.conv{1,2,3}.conv`/`.bn` with their optional `se.fc1`/`se.fc2` and `downsample.conv`/`.bn`, and
the classifier `head.fc`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import batch_norm, conv, conv_norm_act, image_input, linear, squeeze_excite

_BLOCK = r"^s(\d+)\.b(\d+)\."
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


def _block(read: LayoutReader, prefix: str, channels: int, stride: int) -> tuple[BlockSpec, int]:
    """conv1 (1x1), conv2 (the grouped 3x3 that strides), RegNetY's squeeze-excite, conv3 (1x1) and the
    shortcut; the block and its output width."""
    width = read.conv(f"{prefix}.conv1.conv", channels, norm=f"{prefix}.conv1.bn")
    width = read.conv(f"{prefix}.conv2.conv", width, norm=f"{prefix}.conv2.bn")
    se = f"{prefix}.se.fc1.weight" in read
    if se:
        read.squeeze_excite(f"{prefix}.se", width, reduce="fc1", expand="fc2")
    out = read.conv(f"{prefix}.conv3.conv", width, norm=f"{prefix}.conv3.bn")
    projects = f"{prefix}.downsample.conv.weight" in read
    projection = f"{prefix}.downsample.conv" if projects else None
    read.shortcut(prefix, channels, out, stride, projection, f"{prefix}.downsample.bn")
    return BlockSpec(prefix, stride, se, projects), out


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """Stages, blocks, SE and projections from key names and shapes; no weight is read.

    Group counts follow from the conv2 weight shape (width / group width) and the SE width from
    `se.fc1`, so nothing of timm's width/group schedule is tabulated.
    """
    read = LayoutReader(ckpt)
    channels = read.conv("stem.conv", ckpt.config.pretrained.input_size[0], norm="stem.bn")
    blocks = []
    # Stages are numbered from s1, their blocks from b1.
    for stage, index in indexed_blocks(ckpt, _BLOCK, start=1, stages=len(arch.stage_strides)):
        stride = arch.stage_strides[stage - 1] if index == 1 else 1
        block, channels = _block(read, f"s{stage}.b{index}", channels, stride)
        blocks.append(block)
    read.classifier("head.fc", channels)
    read.finish()
    return Layout(tuple(blocks))


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
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
        x = _emit_block(g, x, ckpt, block, arch)
    return linear(g, g.global_avg_pool(x, "head.global_pool"), ckpt, "head.fc")


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
    derive_layout=derive_layout,
    emit=emit,
)
