"""Inception-v3 classifiers as timm builds them (Szegedy et al., "Rethinking the Inception Architecture
for Computer Vision", https://arxiv.org/abs/1512.00567): a convolutional stem, then Mixed blocks whose
parallel branches are concatenated. Reads the stem `Conv2d_*.{conv,bn}`, every
`Mixed_<stage><letter>.<branch>.{conv,bn}` (each block's class from its branch names, widths from
shapes), the classifier `fc`, and the training-only `AuxLogits.*` head when a checkpoint carries it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, PoolMode
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader
from ._parts import act, batch_norm, conv, image_input, linear

_BLOCK = re.compile(r"^Mixed_(\d+)([a-z])\.(\w+?)\.(?:conv|bn)\.")
# InceptionAux, the head torchvision trained beside the network: pool, 1x1 conv0, unpadded 5x5 conv1, fc.
_AUX = "AuxLogits"
_AUX_CONVS = "conv0 conv1/valid"
# Every pool of the network is 3x3: average pools keep the map (stride 1, padding 1, the padding
# counted, as F.avg_pool2d's default), max pools halve it without padding. (kernel, stride, padding):
_POOLS = {PoolMode.AVG: (3, 1, 1), PoolMode.MAX: (3, 2, 0)}


@dataclass(frozen=True)
class ConvStep:
    """A ConvNormAct: conv (no bias), batch norm, ReLU."""

    name: str
    stride: int = 1
    # timm pads every stride-1 conv of the Mixed blocks by (k - 1) / 2 per axis, keeping the map size,
    # and every strided one (and two stem convs) not at all: the kernel alone cannot say which.
    keeps_size: bool = True


@dataclass(frozen=True)
class PoolStep:
    mode: PoolMode
    name: str | None = None  # the stem's pools are modules (Pool1, Pool2); the blocks' are inline


@dataclass(frozen=True)
class SplitStep:
    """Two convolutions reading the same map, concatenated (InceptionE's 1x3 and 3x1 pair)."""

    convs: tuple[ConvStep, ...]


Step = ConvStep | PoolStep | SplitStep
Branch = tuple[Step, ...]

# timm's stem and block classes as data. A block is branches joined by "|", concatenated along the
# channels in that order; a branch (and the stem) is words applied in sequence:
#   NAME        a ConvNormAct that keeps the map size
#   NAME/s2     a ConvNormAct with stride 2 and no padding
#   NAME/valid  a ConvNormAct with stride 1 and no padding
#   A+B         two ConvNormAct words reading the same map, concatenated
#   avg, max    a 3x3 pool (_POOLS); `NAME:max` names the pool's module
_STEM = "Conv2d_1a_3x3/s2 Conv2d_2a_3x3/valid Conv2d_2b_3x3 Pool1:max Conv2d_3b_1x1 Conv2d_4a_3x3/valid Pool2:max"
_BLOCK_CLASSES = {
    "A": "branch1x1 | branch5x5_1 branch5x5_2 | branch3x3dbl_1 branch3x3dbl_2 branch3x3dbl_3 | avg branch_pool",
    "B": "branch3x3/s2 | branch3x3dbl_1 branch3x3dbl_2 branch3x3dbl_3/s2 | max",
    "C": "branch1x1 | branch7x7_1 branch7x7_2 branch7x7_3 "
    "| branch7x7dbl_1 branch7x7dbl_2 branch7x7dbl_3 branch7x7dbl_4 branch7x7dbl_5 | avg branch_pool",
    "D": "branch3x3_1 branch3x3_2/s2 | branch7x7x3_1 branch7x7x3_2 branch7x7x3_3 branch7x7x3_4/s2 | max",
    "E": "branch1x1 | branch3x3_1 branch3x3_2a+branch3x3_2b "
    "| branch3x3dbl_1 branch3x3dbl_2 branch3x3dbl_3a+branch3x3dbl_3b | avg branch_pool",
}
_CONV_SUFFIXES = {"": (1, True), "/s2": (2, False), "/valid": (1, False)}


def _decode_conv(word: str, spec: str) -> ConvStep:
    match = re.fullmatch(r"(\w+?)(/s2|/valid)?", word)
    if match is None:
        raise ValueError(f"unknown token {word!r} in {spec!r}")
    stride, keeps_size = _CONV_SUFFIXES[match.group(2) or ""]
    return ConvStep(match.group(1), stride, keeps_size)


def decode_branch(spec: str) -> Branch:
    steps: list[Step] = []
    for word in spec.split():
        name, _, pool = word.rpartition(":") if ":" in word else (None, "", word)
        if pool in ("avg", "max"):
            steps.append(PoolStep(PoolMode(pool), name))
        elif "+" in word:
            steps.append(SplitStep(tuple(_decode_conv(part, spec) for part in word.split("+"))))
        else:
            steps.append(_decode_conv(word, spec))
    return tuple(steps)


def decode_block(spec: str) -> tuple[Branch, ...]:
    return tuple(decode_branch(branch) for branch in spec.split("|"))


STEM = decode_branch(_STEM)
BLOCK_CLASSES = {kind: decode_block(spec) for kind, spec in _BLOCK_CLASSES.items()}


def _conv_names(branches: tuple[Branch, ...]) -> frozenset[str]:
    """The ConvNormAct modules a block class holds: what tells the classes apart in a checkpoint."""
    names = set()
    for step in (step for branch in branches for step in branch):
        convs = step.convs if isinstance(step, SplitStep) else (step,)
        names.update(c.name for c in convs if isinstance(c, ConvStep))
    return frozenset(names)


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of timm's Inception-v3 do not say."""

    # InceptionV3(norm_eps=1e-3, act_layer='relu'): every ConvNormAct normalizes with eps 0.001.
    eps: float = 1e-3
    act: Activation = Activation.RELU
    # The block classes in order (InceptionV3.__init__): three A at 35x35, the B reduction, four C at
    # 17x17, the D reduction and two E at 8x8. Each block's class is read from its branch names; this
    # order catches a checkpoint that lacks a whole block, which the widths alone would not (A, C and E
    # keep theirs).
    blocks: str = "AAABCCCCDEE"


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "Mixed_6b"
    kind: str  # "C": timm's InceptionC
    branches: tuple[Branch, ...]


@dataclass(frozen=True)
class Layout:
    blocks: tuple[BlockSpec, ...]


# ---- layout -------------------------------------------------------------------------------------


def _read_branch(read: LayoutReader, scope: str, branch: Branch, channels: int) -> int:
    """Place a branch's convolutions reading `channels` (none is grouped); the width it outputs."""
    for step in branch:
        if isinstance(step, ConvStep):
            prefix = f"{scope}{step.name}"
            channels = read.conv(f"{prefix}.conv", channels, norm=f"{prefix}.bn", bias=False, dims={1: channels})
        elif isinstance(step, SplitStep):
            channels = sum(_read_branch(read, scope, (conv,), channels) for conv in step.convs)
    return channels


def _mixed_blocks(read: LayoutReader) -> dict[str, frozenset[str]]:
    """Each Mixed block's name -> the ConvNormAct modules it holds, blocks in network order."""
    found: dict[tuple[int, str], set[str]] = {}
    for name in read.ckpt.names:
        if match := _BLOCK.match(name):
            stage, letter, module = match.groups()
            found.setdefault((int(stage), letter), set()).add(module)
    return {f"Mixed_{stage}{letter}": frozenset(modules) for (stage, letter), modules in sorted(found.items())}


def _block_kind(read: LayoutReader, prefix: str, modules: frozenset[str]) -> str:
    for kind, branches in BLOCK_CLASSES.items():
        if _conv_names(branches) == modules:
            return kind
    raise UnsupportedModel(f"{read.arch}: {prefix} holds {sorted(modules)}, the branches of no Inception-v3 block class")


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """The stem, then each Mixed block's class from its branch names and its widths from their shapes.

    A block's output is its branches concatenated, and the next block must read exactly that, so a
    missing or mis-shaped branch is refused before any weight is read.
    """
    read = LayoutReader(ckpt)
    channels = _read_branch(read, "", STEM, ckpt.config.pretrained.input_size[0])
    blocks: list[BlockSpec] = []
    aux_width = None
    for prefix, modules in _mixed_blocks(read).items():
        kind = _block_kind(read, prefix, modules)
        branches = BLOCK_CLASSES[kind]
        if kind == "D":
            aux_width = channels  # the auxiliary head reads the last 17x17 map, what the D block reads
        # A pool-only branch passes its input's channels through.
        channels = sum(_read_branch(read, f"{prefix}.", branch, channels) for branch in branches)
        blocks.append(BlockSpec(prefix, kind, branches))
    kinds = "".join(b.kind for b in blocks)
    if kinds != arch.blocks:
        raise CheckpointError(
            f"{read.arch}: the Mixed blocks {[b.prefix for b in blocks]} are of classes {kinds or 'none'}; "
            f"{read.arch} has {arch.blocks}"
        )
    if any(name.startswith(f"{_AUX}.") for name in ckpt.names):
        # torchvision's weights (inception_v3.tv_in1k) keep the auxiliary classifier that helped training;
        # timm's eval forward never runs it. Its tensors are placed (and shape-checked), not emitted.
        _read_branch(read, f"{_AUX}.", decode_branch(_AUX_CONVS), aux_width)
        read.classifier(f"{_AUX}.fc", read.shape(f"{_AUX}.conv1.conv.weight")[0])
    read.classifier("fc", channels)
    read.finish()
    return Layout(tuple(blocks))


# ---- emission -----------------------------------------------------------------------------------


def _conv_norm_act(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, step: ConvStep, arch: ArchConfig) -> Tensor:
    kh, kw = ckpt.shape(f"{prefix}.conv.weight")[2:]
    padding = ((kh - 1) // 2, (kw - 1) // 2) if step.keeps_size else (0, 0)
    x = conv(g, x, ckpt, f"{prefix}.conv", stride=step.stride, padding=padding)
    return act(g, batch_norm(g, x, ckpt, f"{prefix}.bn", arch.eps), arch.act, f"{prefix}.act")


def _emit_branch(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, scope: str, branch: Branch, arch: ArchConfig) -> Tensor:
    for step in branch:
        if isinstance(step, ConvStep):
            x = _conv_norm_act(g, x, ckpt, f"{scope}{step.name}", step, arch)
        elif isinstance(step, SplitStep):
            parts = [_conv_norm_act(g, x, ckpt, f"{scope}{c.name}", c, arch) for c in step.convs]
            # Named as timm's forward names the pair: branch3x3_2a + branch3x3_2b -> branch3x3_2.
            x = g.concat(parts, 1, f"{scope}{os.path.commonprefix([c.name for c in step.convs])}")
        else:
            kernel, stride, padding = _POOLS[step.mode]
            x = g.pool2d(x, step.name or f"{scope}{step.mode.value}_pool", step.mode, kernel, stride, padding)
    return x


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = _emit_branch(g, image_input(g, ckpt), ckpt, "", STEM, arch)
    for block in layout.blocks:
        outputs = [_emit_branch(g, x, ckpt, f"{block.prefix}.", branch, arch) for branch in block.branches]
        x = g.concat(outputs, 1, block.prefix)
    return linear(g, g.global_avg_pool(x, "global_pool"), ckpt, "fc")


# ---- registration -------------------------------------------------------------------------------

_TIMM_INCEPTION_V3 = ArchConfig()

FAMILY = Family(
    name="inception_v3",
    summary="Inception-v3 (timm inception_v3.py): factorized 7x7 and 3x3 branches, 299x299 input",
    architectures={
        "inception_v3": _TIMM_INCEPTION_V3,
        # timm >= 0.9 serves these as weight tags of inception_v3 (tf_in1k, tf_adv_in1k) and maps the
        # old names onto it; checkpoints exported under the old names have the same tensors.
        "tf_inception_v3": _TIMM_INCEPTION_V3,
        "adv_inception_v3": _TIMM_INCEPTION_V3,
    },
    derive_layout=derive_layout,
    emit=emit,
)
