"""timm's re-parameterizable ByobNet networks (RepVGG, MobileOne): a stem block, then stages of blocks
that are each, at inference, one convolution and a ReLU, and a linear classifier `head.fc`.

A checkpoint stores a block in training form, parallel conv + batch-norm branches and a batch-normed
identity that are summed (Ding et al., https://arxiv.org/abs/2101.03697), or already folded into
timm's `reparam_conv` (what `timm.utils.reparameterize_model` saves); both are accepted, a block mixing
them is refused. `repvgg.py` and `mobileone.py` name their branches; reading and folding live here, and
`fastvit.py` reads and emits its MobileOne and large-kernel blocks with `read_block`, `rep_conv` and `rep_block`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv_padding, fold_norm, image_input, linear

_BLOCK = r"^stages\.(\d+)\.(\d+)\."
FUSED = "reparam_conv"  # timm's name for a block's folded convolution
IDENTITY = "identity"  # the batch norm on a block's skip path

# A family's branch names: the ConvNormAct modules of the block at `prefix` that the checkpoint holds,
# relative to it ("conv_kxk", "conv_1x1"), in the order timm sums them.
BranchNames = Callable[[LayoutReader, str], tuple[str, ...]]


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of timm's RepVGG and MobileOne networks do not say."""

    # ByoBlockCfg's default s=2: the stem block and the first block of every stage halve the map.
    stem_stride: int = 2
    stage_strides: tuple[int, ...] = (2, 2, 2, 2)
    # ByoModelCfg's defaults: norm_layer='batchnorm' (eps 1e-5), act_layer='relu' after every block.
    eps: float = 1e-5
    act: Activation = Activation.RELU


@dataclass(frozen=True)
class RepBlock:
    prefix: str  # "stem", "stages.1.0"
    stride: int
    branches: tuple[str, ...]  # training form: the summed ConvNormAct branches; () when fused
    identity: bool  # training form: a batch-normed skip, timm's use_ident (same width, stride 1)

    @property
    def fused(self) -> bool:
        return not self.branches


@dataclass(frozen=True)
class Layout:
    blocks: tuple[RepBlock, ...]  # the stem block first


# ---- layout -------------------------------------------------------------------------------------


def _read_branches(read: LayoutReader, prefix: str, names: tuple[str, ...], channels: int) -> int:
    """Place the branches, which must agree on width and groups and centre on one odd kernel."""
    widths, groups, kernels = set(), set(), set()
    for name in names:
        out = read.conv(f"{prefix}.{name}.conv", channels, norm=f"{prefix}.{name}.bn", bias=False)
        shape = read.shape(f"{prefix}.{name}.conv.weight")
        widths.add(out)
        groups.add(shape[1])
        kernels.add(shape[2:])
    if len(widths) > 1 or len(groups) > 1 or any(kh != kw or kh % 2 == 0 for kh, kw in kernels):
        shapes = {name: read.shape(f"{prefix}.{name}.conv.weight") for name in names}
        raise CheckpointError(f"{read.arch}: the branches of {prefix} cannot be summed into one convolution: {shapes}")
    return widths.pop()


def read_block(
    read: LayoutReader, prefix: str, channels: int, stride: int, branch_names: BranchNames
) -> tuple[RepBlock, int]:
    """The block at `prefix` reading `channels`, in whichever form the checkpoint holds it; its output width."""
    names = branch_names(read, prefix)
    identity_held = f"{prefix}.{IDENTITY}.weight" in read
    if f"{prefix}.{FUSED}.weight" in read:
        if names or identity_held:
            raise CheckpointError(
                f"{read.arch}: {prefix} holds both the folded {FUSED} and training-form branches "
                f"{list(names) + ([IDENTITY] if identity_held else [])}; a checkpoint stores a block in one form"
            )
        return RepBlock(prefix, stride, (), False), read.conv(f"{prefix}.{FUSED}", channels, bias=True)
    if not names:
        raise CheckpointError(f"{read.arch}: {prefix} holds neither {FUSED} nor any conv branch")
    out = _read_branches(read, prefix, names, channels)
    identity = stride == 1 and out == channels  # timm's use_ident
    if identity:
        read.batch_norm(f"{prefix}.{IDENTITY}", out)  # a missing statistic is refused by name in finish()
    elif identity_held:
        raise CheckpointError(
            f"{read.arch}: {prefix} has an identity branch but maps {channels} channels to {out} with stride {stride}"
        )
    return RepBlock(prefix, stride, names, identity), out


def derive_layout(ckpt: Checkpoint, arch: ArchConfig, branch_names: BranchNames) -> Layout:
    """The stem block and every `stages.S.B` block from key names and shapes; no weight is read.

    Widths, groups (depthwise or dense) and kernel sizes come from the branch weights, each block's
    form from which names it holds; only the strides come from `arch`.
    """
    read = LayoutReader(ckpt)
    stem, channels = read_block(read, "stem", ckpt.config.pretrained.input_size[0], arch.stem_stride, branch_names)
    blocks = [stem]
    for stage, index in indexed_blocks(ckpt, _BLOCK, stages=len(arch.stage_strides)):
        stride = arch.stage_strides[stage] if index == 0 else 1
        block, channels = read_block(read, f"stages.{stage}.{index}", channels, stride, branch_names)
        blocks.append(block)
    read.classifier("head.fc", channels)
    read.finish()
    return Layout(tuple(blocks))


# ---- emission -----------------------------------------------------------------------------------


def fold_block(ckpt: Checkpoint, block: RepBlock, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The kernel and bias of the one convolution a training-form block equals at inference.

    Exact, not an approximation: each branch is a convolution followed by a per-channel affine map (its
    batch norm with running statistics), so it is one convolution with a scaled kernel and a bias. A
    smaller kernel zero-padded to the block's size, centred, is the same convolution under the block's
    padding (timm pads every branch by (kernel - 1) / 2, so their centres see the same pixels at any
    stride), and the identity is the kernel with a 1 at the centre of each channel's own input. The
    sum of convolutions is the convolution with the summed kernels. Computed in float64, rounded once.
    """
    p = block.prefix
    weights = {name: ckpt.tensor(f"{p}.{name}.conv.weight").astype(np.float64) for name in block.branches}
    out, per_group = next(iter(weights.values())).shape[:2]
    size = max(w.shape[-1] for w in weights.values())
    kernel = np.zeros((out, per_group, size, size))
    bias = np.zeros(out)
    for name, w in weights.items():
        scale, shift = fold_norm(ckpt, f"{p}.{name}.bn", eps)
        at = (size - w.shape[-1]) // 2
        kernel[:, :, at : at + w.shape[-2], at : at + w.shape[-1]] += w * scale.astype(np.float64)[:, None, None, None]
        bias += shift
    if block.identity:
        scale, shift = fold_norm(ckpt, f"{p}.{IDENTITY}", eps)
        channel = np.arange(out)
        kernel[channel, channel % per_group, size // 2, size // 2] += scale
        bias += shift
    return kernel.astype(np.float32), bias.astype(np.float32)


def block_kernel(ckpt: Checkpoint, block: RepBlock, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The kernel and bias of the block's one convolution: as stored when fused, else folded."""
    if block.fused:
        return ckpt.tensor(f"{block.prefix}.{FUSED}.weight"), ckpt.tensor(f"{block.prefix}.{FUSED}.bias")
    return fold_block(ckpt, block, eps)


def rep_conv(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: RepBlock, eps: float) -> Tensor:
    """The block's one convolution, named `<prefix>.reparam_conv` in either form."""
    kernel, bias = block_kernel(ckpt, block, eps)
    padding = conv_padding(x, kernel.shape[2:], block.stride, tf_same=False)
    return g.conv2d(
        x, f"{block.prefix}.{FUSED}", kernel, bias, stride=block.stride, padding=padding,
        groups=x.channels // kernel.shape[1],
    )


def rep_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: RepBlock, eps: float, act: Activation) -> Tensor:
    """The block at inference: its one convolution, then `act` (named `<prefix>.act`)."""
    return g.activation(rep_conv(g, x, ckpt, block, eps), act, f"{block.prefix}.act")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    for block in layout.blocks:
        x = rep_block(g, x, ckpt, block, arch.eps, arch.act)
    return linear(g, g.global_avg_pool(x, "head.global_pool"), ckpt, "head.fc")
