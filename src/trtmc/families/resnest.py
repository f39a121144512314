"""ResNeSt classifiers as timm builds them (Zhang et al., "ResNeSt: Split-Attention Networks",
https://arxiv.org/abs/2004.08955): timm's ResNet trunk (deep stem, pooled shortcuts) around bottlenecks
whose 3x3 is a split attention over `radix` branches. Reads each block's `conv1`/`bn1`, the split
attention `conv2.{conv,bn0,fc1,bn1,fc2}` and `conv3`/`bn3`; radix and cardinality come from their shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import PoolMode, Reduction
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader
from ._parts import batch_norm, conv, conv_norm_act, softmax_over_branches
from ._resnet_trunk import FeatureMap, Layout, Shortcut, TrunkConfig, derive_shortcut, derive_trunk, emit_residual, emit_trunk

# ResNestBottleneck's "avd" pool: nn.AvgPool2d(3, stride, padding=1), counting the padding.
AVD_POOL_KERNEL = 3
AVD_POOL_PADDING = 1


@dataclass(frozen=True, kw_only=True)
class ArchConfig(TrunkConfig):
    """What the tensors of a timm ResNeSt do not say: the trunk's facts (its ResNet class also builds
    the split attention's norms and ReLUs), and where a strided block pools."""

    # avd: a strided block moves its stride from the split-attention 3x3 to a 3x3 average pool, which
    # holds no tensors; avd_first puts that pool before the 3x3 instead of after it.
    avd: bool = True
    avd_first: bool = False


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "layer2.0"
    stride: int
    radix: int  # branches the split attention weighs against each other
    cardinality: int  # groups of the attention's 1x1s, and of its softmax layout
    shortcut: Shortcut | None


def _block(read: LayoutReader, prefix: str, x: FeatureMap, stride: int) -> tuple[BlockSpec, int]:
    width = read.conv(f"{prefix}.conv1", x.channels, norm=f"{prefix}.bn1")
    splat = f"{prefix}.conv2"
    # conv3 reads the attention's output, one branch wide; the 3x3 writes all radix branches.
    out = read.shape(f"{prefix}.conv3.weight", rank=4)[1]
    branches = read.conv(f"{splat}.conv", width, norm=f"{splat}.bn0")
    radix = branches // out
    if branches % out:
        raise CheckpointError(f"{read.arch}: {splat}.conv writes {branches} channels, not a multiple of conv3's {out}")
    if radix < 2:
        raise UnsupportedModel(f"{read.arch}: {splat} has radix {radix}; trtmc serves split attention over 2 or more branches")
    cardinality = out // read.shape(f"{splat}.fc1.weight", rank=4)[1]
    attn = read.conv(f"{splat}.fc1", out, norm=f"{splat}.bn1", bias=True)
    read.conv(f"{splat}.fc2", attn, bias=True, dims={0: branches})
    final = read.conv(f"{prefix}.conv3", out, norm=f"{prefix}.bn3")
    shortcut = derive_shortcut(read, prefix, x, final, stride)
    return BlockSpec(prefix, stride, radix, cardinality, shortcut), final


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout[BlockSpec]:
    """The trunk around split-attention bottlenecks, from key names and shapes; no weight is read."""
    return derive_trunk(ckpt, _block, arch.stage_strides)


def _split_attention(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, stride: int, arch: ArchConfig) -> Tensor:
    """timm's SplitAttn: a grouped 3x3 writing `radix` branches, weighed by a softmax over branches of
    an attention computed from their sum."""
    p = f"{b.prefix}.conv2"
    y = conv_norm_act(g, x, ckpt, f"{p}.conv", f"{p}.bn0", arch.act, eps=arch.eps, stride=stride)
    width = y.channels // b.radix
    # timm sums the branches, then averages over pixels. Averaging first would be the same sum on 1x1
    # maps, but rounded differently, and ResNeSt amplifies such differences: on a random resnest50d the
    # reversed order moves the logits by 1.5e-3 of the largest against float64, this order by 7e-5.
    _, _, height, wide = y.shape
    s = g.reshape(y, (b.radix, width, height * wide), f"{p}.branches")
    s = g.reshape(g.reduce(s, f"{p}.sum", Reduction.SUM, (1,), keepdim=False), (width, height, wide), f"{p}.sum")
    s = g.global_avg_pool(s, f"{p}.gap", keepdim=True)
    s = conv_norm_act(g, s, ckpt, f"{p}.fc1", f"{p}.bn1", arch.act, eps=arch.eps)
    logits = conv(g, s, ckpt, f"{p}.fc2")
    branches = [g.slice(y, 1, r * width, (r + 1) * width, f"{p}.branch_{r}") for r in range(b.radix)]
    return softmax_over_branches(g, branches, logits, groups=b.cardinality, source=p)


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
    p = b.prefix
    pooled = arch.avd and b.stride > 1
    y = g.activation(batch_norm(g, conv(g, x, ckpt, f"{p}.conv1"), ckpt, f"{p}.bn1", arch.eps), arch.act, f"{p}.act1")
    if pooled and arch.avd_first:
        y = g.pool2d(y, f"{p}.avd_first", PoolMode.AVG, AVD_POOL_KERNEL, b.stride, AVD_POOL_PADDING)
    y = _split_attention(g, y, ckpt, b, 1 if pooled else b.stride, arch)
    if pooled and not arch.avd_first:
        y = g.pool2d(y, f"{p}.avd_last", PoolMode.AVG, AVD_POOL_KERNEL, b.stride, AVD_POOL_PADDING)
    y = batch_norm(g, conv(g, y, ckpt, f"{p}.conv3"), ckpt, f"{p}.bn3", arch.eps)
    return emit_residual(g, y, x, ckpt, p, b.shortcut, b.stride, arch, f"{p}.act3")


# The trunk around this family's block: emit(g, checkpoint, layout, arch) -> the logits.
emit = partial(emit_trunk, block=_emit_block)


# block_args=dict(radix=2, avd=True, avd_first=False) for all three; depths and widths are in the tensors.
_TIMM_RESNEST = ArchConfig()

FAMILY = Family(
    name="resnest",
    summary="ResNeSt: ResNet-D with split attention over radix branches (timm resnest.py)",
    architectures={
        "resnest14d": _TIMM_RESNEST,
        "resnest26d": _TIMM_RESNEST,
        "resnest50d": _TIMM_RESNEST,
    },
    derive_layout=derive_layout,
    emit=emit,
)
