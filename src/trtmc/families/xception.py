"""Aligned Xception classifiers as timm builds them (Chollet, https://arxiv.org/abs/1610.02357, in the
DeepLab form of Chen et al., https://arxiv.org/abs/1802.02611): residual blocks of three depthwise-
separable convolutions. Reads the stem `stem.{0,1}.{conv,bn}`, every block
`blocks.N.stack.conv{1,2,3}.{conv_dw,bn_dw,conv_pw,bn_pw}` with its optional `shortcut.{conv,bn}`, and
the classifier `head.fc`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import act, batch_norm, conv, conv_norm_act, image_input, linear

_BLOCK = r"^blocks\.(\d+)\."
_STEM = (("stem.0", 2), ("stem.1", 1))  # (ConvNormAct, stride): timm's 3x3 convs, 32 then 64 channels
_SEPARABLE = 3  # every XceptionModule stacks three separable convolutions; the third carries the stride


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of a timm aligned Xception do not say."""

    # The strides of the entry flow's blocks, which the middle flow follows; a block's shortcut
    # projection is there whenever its width changes, so the tensors cannot say whether it strides.
    entry_strides: tuple[int, ...]
    # The exit flow: a strided block, then a block without residual whose ReLUs follow each norm
    # (timm's no_skip=True, start_with_relu=False). Every block between the flows keeps its width
    # and resolution: the middle flow, 8 blocks in xception41, 16 in xception65 and xception71.
    exit_strides: tuple[int, ...] = (2, 1)
    # timm builds these three with norm_layer=partial(nn.BatchNorm2d, eps=.001).
    eps: float = 1e-3
    act: Activation = Activation.RELU


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "blocks.3"
    stride: int
    projects: bool  # shortcut.conv/bn on the skip path
    residual: bool  # False for the exit flow's last block (no_skip)
    relu_first: bool  # start_with_relu: ReLU before each separable conv, none after its norms


@dataclass(frozen=True)
class Layout:
    blocks: tuple[BlockSpec, ...]


# ---- layout -------------------------------------------------------------------------------------


def _separable(read: LayoutReader, prefix: str, channels: int) -> int:
    """conv_dw (depthwise 3x3) and bn_dw, then conv_pw (1x1) and bn_pw; the width it outputs."""
    read.conv(f"{prefix}.conv_dw", channels, norm=f"{prefix}.bn_dw", bias=False, dims={0: channels, 1: 1})
    return read.conv(f"{prefix}.conv_pw", channels, norm=f"{prefix}.bn_pw", bias=False, dims={1: channels, 2: 1, 3: 1})


def _block(read: LayoutReader, prefix: str, channels: int, stride: int, last: bool) -> tuple[BlockSpec, int]:
    width = channels
    for i in range(1, _SEPARABLE + 1):
        width = _separable(read, f"{prefix}.stack.conv{i}", width)
    projects = f"{prefix}.shortcut.conv.weight" in read
    if last and projects:
        raise CheckpointError(f"{read.arch}: {prefix} ends the exit flow without a residual, yet has a shortcut projection")
    if not last:
        projection = f"{prefix}.shortcut.conv" if projects else None
        read.shortcut(prefix, channels, width, stride, projection, f"{prefix}.shortcut.bn")
    return BlockSpec(prefix, stride, projects, residual=not last, relu_first=not last), width


def _strides(read: LayoutReader, arch: ArchConfig, count: int) -> list[int]:
    middle = count - len(arch.entry_strides) - len(arch.exit_strides)
    if middle < 0:
        raise UnsupportedModel(
            f"{read.arch}: {count} blocks cannot hold an entry flow of {len(arch.entry_strides)} and an exit flow "
            f"of {len(arch.exit_strides)}"
        )
    return [*arch.entry_strides, *(1,) * middle, *arch.exit_strides]


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """The stem and every block from key names and shapes; strides from the flows of the ArchConfig.

    The middle flow's length is the block count the names give, and each block must read the width
    the one before wrote, so a missing or mis-shaped convolution is refused before any weight is read.
    """
    read = LayoutReader(ckpt)
    channels = ckpt.config.pretrained.input_size[0]
    for prefix, _ in _STEM:
        channels = read.conv(f"{prefix}.conv", channels, norm=f"{prefix}.bn", bias=False)
    found = indexed_blocks(ckpt, _BLOCK)
    strides = _strides(read, arch, len(found))
    blocks = []
    for (index,), stride in zip(found, strides):
        block, channels = _block(read, f"blocks.{index}", channels, stride, last=index == len(found) - 1)
        blocks.append(block)
    read.classifier("head.fc", channels)
    read.finish()
    return Layout(tuple(blocks))


# ---- emission -----------------------------------------------------------------------------------


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
    y = x
    for i in range(1, _SEPARABLE + 1):
        p = f"{b.prefix}.stack.conv{i}"
        if b.relu_first:
            y = g.activation(y, arch.act, f"{b.prefix}.stack.act{i}")
        after = None if b.relu_first else arch.act
        y = conv(g, y, ckpt, f"{p}.conv_dw", stride=b.stride if i == _SEPARABLE else 1)
        y = act(g, batch_norm(g, y, ckpt, f"{p}.bn_dw", arch.eps), after, f"{p}.act_dw")
        y = conv(g, y, ckpt, f"{p}.conv_pw")
        y = act(g, batch_norm(g, y, ckpt, f"{p}.bn_pw", arch.eps), after, f"{p}.act_pw")
    if not b.residual:
        return y
    skip = x
    if b.projects:
        skip = conv(g, x, ckpt, f"{b.prefix}.shortcut.conv", stride=b.stride)
        skip = batch_norm(g, skip, ckpt, f"{b.prefix}.shortcut.bn", arch.eps)
    return g.add(y, skip, b.prefix)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    for prefix, stride in _STEM:
        x = conv_norm_act(g, x, ckpt, f"{prefix}.conv", f"{prefix}.bn", arch.act, eps=arch.eps, stride=stride)
    for block in layout.blocks:
        x = _emit_block(g, x, ckpt, block, arch)
    return linear(g, g.global_avg_pool(x, "head.global_pool"), ckpt, "head.fc")


# ---- registration -------------------------------------------------------------------------------

# timm's block_cfg: xception41 and xception65 halve the map in each of their three entry blocks;
# xception71 spreads the same three halvings over five blocks.
_XCEPTION = ArchConfig(entry_strides=(2, 2, 2))
_XCEPTION71 = ArchConfig(entry_strides=(2, 1, 2, 1, 2))

FAMILY = Family(
    name="xception",
    summary="Aligned Xception 41/65/71 (timm xception_aligned.py): separable-conv residual blocks, eps 1e-3",
    architectures={
        "xception41": _XCEPTION,
        "xception65": _XCEPTION,
        "xception71": _XCEPTION71,
    },
    derive_layout=derive_layout,
    emit=emit,
)
