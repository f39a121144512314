"""Res2Net and Res2NeXt classifiers as timm builds them (Gao et al., "Res2Net: A New Multi-scale Backbone
Architecture", https://arxiv.org/abs/1904.01169): timm's ResNet trunk around the Bottle2neck block. Reads
each block's `conv1`/`bn1`, its scale convs `convs.N`/`bns.N` and `conv3`/`bn3`; the split width, the
number of scales and the cardinality come from their shapes, the stem, shortcuts and `fc` from the trunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import PoolMode
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import batch_norm, conv
from ._resnet_trunk import FeatureMap, Layout, Shortcut, TrunkConfig, derive_shortcut, derive_trunk, emit_residual, emit_trunk

# Bottle2neck pools the last split of a block that strides or projects: nn.AvgPool2d(3, stride,
# padding=1), counting the padding (timm keeps the original weights' pooling, see its FIXME).
SPLIT_POOL_KERNEL = 3
SPLIT_POOL_PADDING = 1


# timm builds Res2Net with its ResNet class: what the tensors do not say is the trunk's.
ArchConfig = TrunkConfig


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "layer2.0"
    width: int  # channels of each split of conv1's output
    scales: int  # splits; all but the last run through a 3x3 conv (the only one when there is one split)
    stride: int  # carried by every 3x3 and by the pool of the last split
    # timm's `is_first`: a block that strides or projects convolves each split on its own and pools the
    # last; the others add each conv's output to the next split before convolving it.
    first: bool
    shortcut: Shortcut | None

    @property
    def convs(self) -> int:
        return max(1, self.scales - 1)


def _block(read: LayoutReader, prefix: str, x: FeatureMap, stride: int) -> tuple[BlockSpec, int]:
    convs = indexed_blocks(read.ckpt, rf"^{re.escape(prefix)}\.convs\.(\d+)\.weight$")
    if not convs:
        raise CheckpointError(f"{read.arch}: {prefix} has no convs.N tensors; it is not a Bottle2neck block")
    width = read.shape(f"{prefix}.convs.0.weight", rank=4)[0]
    expanded = read.conv(f"{prefix}.conv1", x.channels, norm=f"{prefix}.bn1")
    scales = expanded // width
    if expanded % width or max(1, scales - 1) != len(convs):
        raise CheckpointError(
            f"{read.arch}: {prefix}.conv1 writes {expanded} channels, which do not split into one more "
            f"scale of {width} than its {len(convs)} convs.N"
        )
    for (i,) in convs:
        read.conv(f"{prefix}.convs.{i}", width, norm=f"{prefix}.bns.{i}", dims={0: width})
    out = read.conv(f"{prefix}.conv3", expanded, norm=f"{prefix}.bn3")
    shortcut = derive_shortcut(read, prefix, x, out, stride)
    return BlockSpec(prefix, width, scales, stride, stride > 1 or shortcut is not None, shortcut), out


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout[BlockSpec]:
    """The trunk around Bottle2neck blocks, from key names and shapes; no weight is read."""
    return derive_trunk(ckpt, _block, arch.stage_strides)


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
    p, w = b.prefix, b.width
    y = g.activation(batch_norm(g, conv(g, x, ckpt, f"{p}.conv1"), ckpt, f"{p}.bn1", arch.eps), arch.act, f"{p}.relu")
    splits = [g.slice(y, 1, i * w, (i + 1) * w, f"{p}.split") for i in range(b.scales)] if b.scales > 1 else [y]
    outs: list[Tensor] = []
    for i in range(b.convs):
        sp = splits[i] if i == 0 or b.first else g.add(outs[-1], splits[i], f"{p}.convs.{i}.add")
        sp = batch_norm(g, conv(g, sp, ckpt, f"{p}.convs.{i}", stride=b.stride), ckpt, f"{p}.bns.{i}", arch.eps)
        outs.append(g.activation(sp, arch.act, f"{p}.relu"))
    if b.scales > 1:
        last = splits[-1]
        if b.first:
            last = g.pool2d(last, f"{p}.pool", PoolMode.AVG, SPLIT_POOL_KERNEL, b.stride, SPLIT_POOL_PADDING)
        outs.append(last)
    y = g.concat(outs, 1, f"{p}.cat") if len(outs) > 1 else outs[0]
    y = batch_norm(g, conv(g, y, ckpt, f"{p}.conv3"), ckpt, f"{p}.bn3", arch.eps)
    return emit_residual(g, y, x, ckpt, p, b.shortcut, b.stride, arch, f"{p}.relu")


# The trunk around this family's block: emit(g, checkpoint, layout, arch) -> the logits.
emit = partial(emit_trunk, block=_emit_block)


# Width, scales, cardinality, the deep stem and the pooled shortcut of res2net50d are all in the tensors.
_TIMM_RES2NET = ArchConfig()

FAMILY = Family(
    name="res2net",
    summary="Res2Net / Res2NeXt: ResNet with multi-scale split 3x3s (timm res2net.py)",
    architectures={
        "res2net50_26w_4s": _TIMM_RES2NET,
        "res2net50_14w_8s": _TIMM_RES2NET,
        "res2next50": _TIMM_RES2NET,
        "res2net50d": _TIMM_RES2NET,
    },
    derive_layout=derive_layout,
    emit=emit,
)
