"""Cross Stage Partial networks as timm builds them (Wang et al., https://arxiv.org/abs/1911.11929):
each stage splits its expanded map in two, runs blocks on one half only, and joins the halves in a
transition. Reads the stem `stem.conv1.{conv,bn}`, every stage `stages.S.{conv_down,conv_exp,
conv_transition_b,conv_transition}.{conv,bn}` with its `blocks.B.conv{1,2,3}.{conv,bn}`, and the
classifier `head.fc`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import batch_norm, conv, image_input, linear, max_pool

_BLOCK = r"^stages\.(\d+)\.blocks\.(\d+)\."
# create_csp_stem's max pool, (kernel, stride, padding), when the stem has one.
STEM_POOL = (3, 2, 1)


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of a timm CSPNet do not say."""

    stem_stride: int  # of stem.conv1: 2 (the ResNet-like 7x7) or 1 (DarkNet's 3x3)
    stem_pool: bool  # a 3x3 max pool after it (STEM_POOL)
    # Each stage's stride, carried by its 3x3 conv_down: timm builds one exactly in the stages that
    # stride, and its weight does not say by how much.
    stage_strides: tuple[int, ...]
    # CspStagesCfg.cross_linear: conv_exp ends without its activation.
    cross_linear: bool
    # CspModelCfg's defaults: norm_layer='batchnorm' (eps 1e-5) and act_layer='leaky_relu', which
    # timm builds as nn.LeakyReLU() with torch's default slope.
    eps: float = 1e-5
    negative_slope: float = 0.01


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "stages.2.blocks.3"
    bottleneck: bool  # BottleneckBlock (conv1..conv3, activation after the sum) or DarkBlock (conv1, conv2)


@dataclass(frozen=True)
class StageSpec:
    prefix: str  # "stages.2"
    stride: int  # of conv_down, the 3x3 (grouped in cspresnext50) that heads a stage which strides
    split: int  # channels of conv_exp's first half, which skips the blocks
    blocks: tuple[BlockSpec, ...]


@dataclass(frozen=True)
class Layout:
    stages: tuple[StageSpec, ...]


# ---- layout -------------------------------------------------------------------------------------


def _cna(read: LayoutReader, prefix: str, channels: int, kernel: int | None = None) -> int:
    """A ConvNormAct at `prefix` (conv without bias, bn) reading `channels`; its output width."""
    dims = {2: kernel, 3: kernel} if kernel is not None else {}
    return read.conv(f"{prefix}.conv", channels, norm=f"{prefix}.bn", bias=False, dims=dims)


def _block(read: LayoutReader, prefix: str, channels: int) -> BlockSpec:
    bottleneck = f"{prefix}.conv3.conv.weight" in read
    width = _cna(read, f"{prefix}.conv1", channels, kernel=1)
    width = _cna(read, f"{prefix}.conv2", width, kernel=3)
    if bottleneck:
        width = _cna(read, f"{prefix}.conv3", width, kernel=1)
    read.shortcut(prefix, channels, width, 1, None, None)  # the identity: blocks keep their width
    return BlockSpec(prefix, bottleneck)


def _stage(read: LayoutReader, prefix: str, channels: int, stride: int, indices: list[int]) -> tuple[StageSpec, int]:
    down = f"{prefix}.conv_down.conv.weight" in read
    if down != (stride != 1):
        raise CheckpointError(
            f"{read.arch}: {prefix} {'has' if down else 'lacks'} conv_down but strides by {stride}; "
            f"timm builds conv_down exactly in the stages that stride"
        )
    if down:
        channels = _cna(read, f"{prefix}.conv_down", channels, kernel=3)
    expanded = _cna(read, f"{prefix}.conv_exp", channels, kernel=1)
    if expanded % 2:
        raise CheckpointError(f"{read.arch}: {prefix}.conv_exp outputs {expanded} channels, which do not split in two")
    half = expanded // 2
    blocks = tuple(_block(read, f"{prefix}.blocks.{i}", half) for i in indices)
    joined = half + _cna(read, f"{prefix}.conv_transition_b", half, kernel=1)
    return StageSpec(prefix, stride, half, blocks), _cna(read, f"{prefix}.conv_transition", joined, kernel=1)


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """Stem, stages and blocks from key names and shapes; strides and the stem pool from the ArchConfig.

    Groups, widths, the expansion and the split come from the weight shapes, and whether a block is a
    bottleneck from its conv3, so one code path serves the ResNet-, ResNeXt- and DarkNet-style stages.
    """
    read = LayoutReader(ckpt)
    channels = _cna(read, "stem.conv1", ckpt.config.pretrained.input_size[0])
    found = indexed_blocks(ckpt, _BLOCK, stages=len(arch.stage_strides))
    stages = []
    for stage, stride in enumerate(arch.stage_strides):
        indices = [index for s, index in found if s == stage]
        spec, channels = _stage(read, f"stages.{stage}", channels, stride, indices)
        stages.append(spec)
    read.classifier("head.fc", channels)
    read.finish()
    return Layout(tuple(stages))


# ---- emission -----------------------------------------------------------------------------------


def _conv_norm_act(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, arch: ArchConfig, *, stride: int = 1, activate: bool = True
) -> Tensor:
    """timm's ConvNormAct with symmetric padding, then LeakyReLU (which `activate=False` leaves out)."""
    x = batch_norm(g, conv(g, x, ckpt, f"{prefix}.conv", stride=stride), ckpt, f"{prefix}.bn", arch.eps)
    if not activate:
        return x
    return g.activation(x, Activation.LEAKY_RELU, f"{prefix}.bn.act", negative_slope=arch.negative_slope)


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
    p = b.prefix
    y = _conv_norm_act(g, x, ckpt, f"{p}.conv1", arch)
    y = _conv_norm_act(g, y, ckpt, f"{p}.conv2", arch)
    if not b.bottleneck:
        return g.add(y, x, p)  # DarkBlock: conv2's activation comes before the sum, none after
    y = _conv_norm_act(g, y, ckpt, f"{p}.conv3", arch, activate=False)
    return g.activation(g.add(y, x, p), Activation.LEAKY_RELU, f"{p}.act3", negative_slope=arch.negative_slope)


def _emit_stage(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, s: StageSpec, arch: ArchConfig) -> Tensor:
    p = s.prefix
    if s.stride != 1:
        x = _conv_norm_act(g, x, ckpt, f"{p}.conv_down", arch, stride=s.stride)
    x = _conv_norm_act(g, x, ckpt, f"{p}.conv_exp", arch, activate=not arch.cross_linear)
    # timm: xs, xb = x.split(expand_chs // 2); only xb runs through the blocks.
    xs, xb = g.slice(x, 1, 0, s.split, f"{p}.xs"), g.slice(x, 1, s.split, x.channels, f"{p}.xb")
    for block in s.blocks:
        xb = _emit_block(g, xb, ckpt, block, arch)
    xb = _conv_norm_act(g, xb, ckpt, f"{p}.conv_transition_b", arch)
    return _conv_norm_act(g, g.concat([xs, xb], 1, f"{p}.cat"), ckpt, f"{p}.conv_transition", arch)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = _conv_norm_act(g, image_input(g, ckpt), ckpt, "stem.conv1", arch, stride=arch.stem_stride)
    if arch.stem_pool:
        x = max_pool(g, x, "stem.pool", *STEM_POOL)
    for stage in layout.stages:
        x = _emit_stage(g, x, ckpt, stage, arch)
    return linear(g, g.global_avg_pool(x, "head.global_pool"), ckpt, "head.fc")


# ---- registration -------------------------------------------------------------------------------

# timm's model_cfgs: the ResNe(X)t-like nets have a 7x7 stem with a max pool (stride 4) and keep the
# resolution in their first stage; CSPDarkNet-53 has a stride-1 3x3 stem and halves in all five stages,
# where its conv_exp keeps the activation (no cross_linear).
_CSPRESNET = ArchConfig(stem_stride=2, stem_pool=True, stage_strides=(1, 2, 2, 2), cross_linear=True)
_CSPDARKNET = ArchConfig(stem_stride=1, stem_pool=False, stage_strides=(2, 2, 2, 2, 2), cross_linear=False)

FAMILY = Family(
    name="cspnet",
    summary="CSPResNet-50, CSPResNeXt-50, CSPDarkNet-53 (timm cspnet.py): split stages, LeakyReLU",
    architectures={
        "cspresnet50": _CSPRESNET,
        "cspresnext50": _CSPRESNET,
        "cspdarknet53": _CSPDARKNET,
    },
    derive_layout=derive_layout,
    emit=emit,
)
