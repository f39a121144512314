"""Selective Kernel ResNets as timm builds them (Li et al., "Selective Kernel Networks",
https://arxiv.org/abs/1903.06586): timm's ResNet trunk around blocks whose 3x3 is a SelectiveKernel,
parallel 3x3 paths of growing dilation mixed by a softmax attention. Reads each block's
`conv{1,2,3}.conv`/`.bn`, the paths `paths.N.conv`/`.bn` and the attention `attn.{fc_reduce,bn,fc_select}`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial

from ..checkpoint import Checkpoint, CheckpointError
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import act, batch_norm, conv, conv_norm_act, softmax_over_branches
from ._resnet_trunk import FeatureMap, Layout, Shortcut, TrunkConfig, derive_shortcut, derive_trunk, emit_residual, emit_trunk


@dataclass(frozen=True, kw_only=True)
class ArchConfig(TrunkConfig):
    """What the tensors of a timm SKNet do not say: the trunk's facts (its ResNet class also builds the
    attention's norm and ReLU), and the selective kernel's."""

    # Which half of the block's input each path reads: skresnet18/34 split the input channels between
    # the paths, skresnext50 feeds every path all of them. A split path with g groups and an unsplit one
    # with 2g groups have the same weight shape, so only the config tells them apart.
    split_input: bool
    # SelectiveKernel's default kernel_size=[3, 5] with keep_3x3: every path is a 3x3, the second
    # dilated by 2 to see as far as a 5x5; the weights are 3x3 either way.
    path_dilations: tuple[int, ...] = (1, 2)


@dataclass(frozen=True)
class SelectiveKernelSpec:
    prefix: str  # "layer1.0.conv1" in a basic block, "layer1.0.conv2" in a bottleneck
    path_input: int  # channels each path reads: all the input's, or (split_input) its own run of them
    stride: int


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "layer2.0"
    before: str | None  # a bottleneck's 1x1 ConvNormAct ahead of the selective kernel
    sk: SelectiveKernelSpec
    after: str  # the ConvNormAct without activation that closes the block
    stride: int
    shortcut: Shortcut | None


def _selective_kernel(read: LayoutReader, prefix: str, channels: int, stride: int, arch: ArchConfig) -> tuple[SelectiveKernelSpec, int]:
    paths = indexed_blocks(read.ckpt, rf"^{re.escape(prefix)}\.paths\.(\d+)\.conv\.weight$")
    if len(paths) != len(arch.path_dilations):
        raise CheckpointError(
            f"{read.arch}: {prefix} has {len(paths)} paths.N convs; its SelectiveKernel has {len(arch.path_dilations)}"
        )
    if arch.split_input and channels % len(paths):
        raise CheckpointError(f"{read.arch}: {prefix} cannot split {channels} input channels between {len(paths)} paths")
    path_input = channels // len(paths) if arch.split_input else channels
    out = read.conv(f"{prefix}.paths.0.conv", path_input, norm=f"{prefix}.paths.0.bn")
    for (i,) in paths[1:]:
        read.conv(f"{prefix}.paths.{i}.conv", path_input, norm=f"{prefix}.paths.{i}.bn", dims={0: out})
    reduced = read.conv(f"{prefix}.attn.fc_reduce", out, norm=f"{prefix}.attn.bn", bias=False, dims={2: 1, 3: 1})
    read.conv(f"{prefix}.attn.fc_select", reduced, bias=False, dims={0: out * len(paths), 2: 1, 3: 1})
    return SelectiveKernelSpec(prefix, path_input, stride), out


def _block(read: LayoutReader, prefix: str, x: FeatureMap, stride: int, arch: ArchConfig) -> tuple[BlockSpec, int]:
    """A basic block (SelectiveKernel `conv1`, then `conv2`) or a bottleneck (`conv1`, the
    SelectiveKernel `conv2`, then `conv3`), and its shortcut."""
    bottleneck = f"{prefix}.conv3.conv.weight" in read
    channels, before = x.channels, None
    if bottleneck:
        before = f"{prefix}.conv1"
        channels = read.conv(f"{before}.conv", channels, norm=f"{before}.bn")
    sk, channels = _selective_kernel(read, f"{prefix}.conv{2 if bottleneck else 1}", channels, stride, arch)
    after = f"{prefix}.conv{3 if bottleneck else 2}"
    out = read.conv(f"{after}.conv", channels, norm=f"{after}.bn")
    shortcut = derive_shortcut(read, prefix, x, out, stride)
    return BlockSpec(prefix, before, sk, after, stride, shortcut), out


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout[BlockSpec]:
    """The trunk around selective-kernel blocks, from key names and shapes; no weight is read."""
    return derive_trunk(ckpt, lambda read, prefix, x, stride: _block(read, prefix, x, stride, arch), arch.stage_strides)


def _emit_selective_kernel(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, sk: SelectiveKernelSpec, arch: ArchConfig) -> Tensor:
    """sum_i path_i(x) * softmax_i(attention(sum_i path_i(x))), as timm's SelectiveKernel."""
    p = sk.prefix
    paths = []
    for i, dilation in enumerate(arch.path_dilations):
        y = g.slice(x, 1, i * sk.path_input, (i + 1) * sk.path_input, f"{p}.split") if arch.split_input else x
        y = conv(g, y, ckpt, f"{p}.paths.{i}.conv", stride=sk.stride, dilation=dilation)
        paths.append(act(g, batch_norm(g, y, ckpt, f"{p}.paths.{i}.bn", arch.eps), arch.act, f"{p}.paths.{i}.bn.act"))
    summed = paths[0]
    for path in paths[1:]:
        summed = g.add(summed, path, f"{p}.attn.sum")
    s = g.global_avg_pool(summed, f"{p}.attn.pool", keepdim=True)
    s = conv_norm_act(g, s, ckpt, f"{p}.attn.fc_reduce", f"{p}.attn.bn", arch.act, eps=arch.eps)
    logits = conv(g, s, ckpt, f"{p}.attn.fc_select")
    return softmax_over_branches(g, paths, logits, groups=1, source=p)


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
    y = x
    if b.before is not None:
        y = conv_norm_act(g, y, ckpt, f"{b.before}.conv", f"{b.before}.bn", arch.act, eps=arch.eps)
    y = _emit_selective_kernel(g, y, ckpt, b.sk, arch)
    y = conv_norm_act(g, y, ckpt, f"{b.after}.conv", f"{b.after}.bn", None, eps=arch.eps)
    return emit_residual(g, y, x, ckpt, b.prefix, b.shortcut, b.stride, arch, f"{b.prefix}.act")


# The trunk around this family's block: emit(g, checkpoint, layout, arch) -> the logits.
emit = partial(emit_trunk, block=_emit_block)


FAMILY = Family(
    name="skresnet",
    summary="Selective Kernel ResNet / ResNeXt: dilated 3x3 paths mixed by softmax attention (timm sknet.py)",
    architectures={
        # sk_kwargs split_input=True (rd_ratio 1/8: the attention width is in the tensors).
        "skresnet18": ArchConfig(split_input=True),
        "skresnet34": ArchConfig(split_input=True),
        # sk_kwargs split_input=False, with 32 groups per path.
        "skresnext50_32x4d": ArchConfig(split_input=False),
    },
    derive_layout=derive_layout,
    emit=emit,
)
