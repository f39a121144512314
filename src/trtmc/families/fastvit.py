"""FastViT classifiers with RepMixer token mixers, as timm builds them (Vasu et al., "FastViT: A Fast Hybrid
Vision Transformer using Structural Reparameterization", https://arxiv.org/abs/2303.14189): a MobileOne stem,
four stages of RepMixer blocks behind large-kernel patch embeddings, a squeeze-excited MobileOne block and
a linear classifier. Reads `stem.N`, `stages.S.downsample.proj.{0,1}`, `stages.S.blocks.B.{token_mixer,
mlp,layer_scale}`, `final_conv` and `head.fc`; every re-parameterizable part in training form (branches
folded here at build time) or as timm's folded `reparam_conv`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import batch_norm, conv, conv_padding, fold_norm, image_input, layer_scaled, linear, squeeze_excite
from ._reparam import FUSED, IDENTITY, RepBlock, block_kernel, read_block, rep_block, rep_conv

# The branches a FastViT MobileOneBlock (num_conv_branches=1 everywhere, the 1x1 scale branch beside
# kernels larger than 1x1) or ReparamLargeKernelConv (a 7x7 and a 3x3) may hold; any other branch stays
# unplaced and is refused.
_BRANCHES = ("conv_kxk.0", "conv_scale", "large_conv", "small_conv")


def _branch_names(read: LayoutReader, prefix: str) -> tuple[str, ...]:
    return tuple(name for name in _BRANCHES if f"{prefix}.{name}.conv.weight" in read)


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of timm's FastViT do not say."""

    # convolutional_stem: a 3x3 conv and a 3x3 depthwise conv, each halving the map, then a 1x1.
    stem_strides: tuple[int, ...] = (2, 2, 1)
    # FastVit's down_stride: every stage's PatchEmbed halves the map.
    down_stride: int = 2
    eps: float = 1e-5  # nn.BatchNorm2d's default, every norm
    act: Activation = Activation.GELU  # nn.GELU, the exact erf form


@dataclass(frozen=True)
class MixerBlock:
    prefix: str  # "stages.2.blocks.3"
    # RepMixer's `mixer` (conv_kxk.0 + conv_scale + identity, or its own reparam_conv); None where timm
    # folded the whole token mixer, residual and `norm` included, into `token_mixer.reparam_conv`.
    mixer: RepBlock | None


@dataclass(frozen=True)
class Stage:
    # PatchEmbed: the large-kernel strided conv `proj.0` (no activation: lkc_use_act=False, as the
    # original weights were trained) and the 1x1 MobileOne block `proj.1`; None where the width stays.
    downsample: tuple[RepBlock, RepBlock] | None
    blocks: tuple[MixerBlock, ...]


@dataclass(frozen=True)
class Layout:
    stem: tuple[RepBlock, ...]
    stages: tuple[Stage, ...]
    final_conv: RepBlock  # squeeze-excited, widening to the classifier's features


# ---- layout -------------------------------------------------------------------------------------


def _read_mixer_block(read: LayoutReader, prefix: str, channels: int) -> MixerBlock:
    if f"{prefix}.token_mixer.qkv.weight" in read:
        raise UnsupportedModel(
            f"{read.arch}: {prefix} mixes tokens with attention (FastViT SA/MA, MobileCLIP's MCi); "
            "only RepMixer blocks are served"
        )
    mixer = None
    if f"{prefix}.token_mixer.{FUSED}.weight" in read:
        read.conv(f"{prefix}.token_mixer.{FUSED}", channels, bias=True, dims={0: channels, 1: 1})
    else:
        mixer, out = read_block(read, f"{prefix}.token_mixer.mixer", channels, 1, _branch_names)
        if out != channels:
            raise CheckpointError(f"{read.arch}: {prefix}.token_mixer maps {channels} channels to {out}")
        # RepMixer's `norm` is a MobileOneBlock with no conv branch: its identity batch norm alone.
        read.batch_norm(f"{prefix}.token_mixer.norm.{IDENTITY}", channels)
        read.tensor(f"{prefix}.token_mixer.layer_scale.gamma", (channels, 1, 1))
    mlp = f"{prefix}.mlp"
    read.conv(f"{mlp}.conv.conv", channels, norm=f"{mlp}.conv.bn", bias=False, dims={0: channels, 1: 1})
    hidden = read.conv(f"{mlp}.fc1", channels, bias=True, dims={1: channels, 2: 1, 3: 1})
    read.conv(f"{mlp}.fc2", hidden, bias=True, dims={0: channels, 2: 1, 3: 1})
    read.tensor(f"{prefix}.layer_scale.gamma", (channels, 1, 1))
    return MixerBlock(prefix, mixer)


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """The stem, each stage's patch embedding and RepMixer blocks, and the head, from key names and
    shapes; no weight is read. Widths, depths, kernel sizes and the MLP ratio come from the tensors,
    each part's form (branches or folded) from which names it holds."""
    read = LayoutReader(ckpt)
    channels = ckpt.config.pretrained.input_size[0]
    stem = []
    for index, stride in enumerate(arch.stem_strides):
        block, channels = read_block(read, f"stem.{index}", channels, stride, _branch_names)
        stem.append(block)
    found = indexed_blocks(ckpt, r"^stages\.(\d+)\.blocks\.(\d+)\.")
    if not found:
        raise CheckpointError(f"{read.arch}: no tensor matches stages.S.blocks.B; not a FastViT checkpoint")
    stages = []
    for stage in sorted({s for s, _ in found}):
        prefix = f"stages.{stage}"
        downsample = None
        if any(name.startswith(f"{prefix}.downsample.") for name in ckpt.names):
            embed, channels = read_block(read, f"{prefix}.downsample.proj.0", channels, arch.down_stride, _branch_names)
            project, channels = read_block(read, f"{prefix}.downsample.proj.1", channels, 1, _branch_names)
            downsample = (embed, project)
        blocks = tuple(_read_mixer_block(read, f"{prefix}.blocks.{b}", channels) for s, b in found if s == stage)
        stages.append(Stage(downsample, blocks))
    final_conv, channels = read_block(read, "final_conv", channels, 1, _branch_names)
    read.squeeze_excite("final_conv.se", channels, reduce="fc1", expand="fc2")
    read.classifier("head.fc", channels)
    read.finish()
    return Layout(tuple(stem), tuple(stages), final_conv)


# ---- emission -----------------------------------------------------------------------------------


def _repmixer_kernel(ckpt: Checkpoint, block: MixerBlock, arch: ArchConfig) -> tuple[np.ndarray, np.ndarray]:
    """RepMixer, x + gamma * (mixer(x) - norm(x)), as the one depthwise convolution timm's reparameterize
    makes of it: `mixer` folds into one kernel, `norm` (a per-channel affine map) and the residual become
    a shift and a 1 at the centre of each channel's kernel, gamma scales each channel. Computed in
    float64, rounded once; a checkpoint timm folded already gives its `reparam_conv` as stored.

    In fp16 the centre tap 1 + gamma * (...) keeps only what fp16 resolves next to 1, yet the logits do not
    suffer: on a random fastvit_t8 whose mixer gammas were scaled to 1e-2, 1e-3 and 1e-4, fp16 logits came
    within 7.1e-4 to 9.6e-4 (of the largest) of timm's fp64 ones, against 7.5e-4 to 9.0e-4 with the
    residual and gamma kept as ops (gammas as drawn, 0.5 to 1: 1.35e-3 against 1.59e-3).
    """
    prefix = f"{block.prefix}.token_mixer"
    if block.mixer is None:  # folded by timm already
        return ckpt.tensor(f"{prefix}.{FUSED}.weight"), ckpt.tensor(f"{prefix}.{FUSED}.bias")
    kernel, bias = (a.astype(np.float64) for a in block_kernel(ckpt, block.mixer, arch.eps))
    scale, shift = fold_norm(ckpt, f"{prefix}.norm.{IDENTITY}", arch.eps)
    gamma = ckpt.tensor(f"{prefix}.layer_scale.gamma").astype(np.float64).reshape(-1)
    out, per_group, height, width = kernel.shape
    channel = np.arange(out)
    kernel[channel, channel % per_group, height // 2, width // 2] -= scale
    kernel = kernel * gamma[:, None, None, None]
    kernel[channel, channel % per_group, height // 2, width // 2] += 1.0
    bias = (bias - shift) * gamma
    return kernel.astype(np.float32), bias.astype(np.float32)


def _token_mixer(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: MixerBlock, arch: ArchConfig) -> Tensor:
    kernel, bias = _repmixer_kernel(ckpt, block, arch)
    padding = conv_padding(x, kernel.shape[2:], 1, tf_same=False)
    name = f"{block.prefix}.token_mixer.{FUSED}"
    return g.conv2d(x, name, kernel, bias, padding=padding, groups=x.channels // kernel.shape[1])


def _conv_mlp(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, arch: ArchConfig) -> Tensor:
    """ConvMlp: a depthwise 7x7 conv with its batch norm, then the pointwise fc1, activation, fc2."""
    y = batch_norm(g, conv(g, x, ckpt, f"{prefix}.conv.conv"), ckpt, f"{prefix}.conv.bn", arch.eps)
    y = g.activation(conv(g, y, ckpt, f"{prefix}.fc1"), arch.act, f"{prefix}.act")
    return conv(g, y, ckpt, f"{prefix}.fc2")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    for block in layout.stem:
        x = rep_block(g, x, ckpt, block, arch.eps, arch.act)
    for stage in layout.stages:
        if stage.downsample is not None:
            embed, project = stage.downsample
            x = rep_block(g, rep_conv(g, x, ckpt, embed, arch.eps), ckpt, project, arch.eps, arch.act)
        for block in stage.blocks:
            x = _token_mixer(g, x, ckpt, block, arch)
            mlp = _conv_mlp(g, x, ckpt, f"{block.prefix}.mlp", arch)
            x = g.add(x, layer_scaled(g, mlp, ckpt, f"{block.prefix}.layer_scale.gamma", axis=1), block.prefix)
    # MobileOneBlock(use_se=True): the squeeze-excite sits between the folded conv and the activation.
    x = rep_conv(g, x, ckpt, layout.final_conv, arch.eps)
    x = squeeze_excite(
        g, x, ckpt, "final_conv.se", inner=Activation.RELU, gate=Activation.SIGMOID, reduce="fc1", expand="fc2"
    )
    x = g.activation(x, arch.act, "final_conv.act")
    return linear(g, g.global_avg_pool(x, "head.global_pool"), ckpt, "head.fc")


# t8, t12 and s12 differ in depths, widths and MLP ratio, all in the tensors. The sa*/ma* sizes put
# attention and a conditional positional encoding in the last stage, which this layout refuses.
_TIMM_FASTVIT = ArchConfig()

FAMILY = Family(
    name="fastvit",
    summary="FastViT T8/T12/S12 (timm fastvit.py): RepMixer blocks, MobileOne/large-kernel branches folded at build",
    architectures={
        "fastvit_t8": _TIMM_FASTVIT,
        "fastvit_t12": _TIMM_FASTVIT,
        "fastvit_s12": _TIMM_FASTVIT,
    },
    derive_layout=derive_layout,
    emit=emit,
)
