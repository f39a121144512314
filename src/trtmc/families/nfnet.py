"""Normalizer-free networks, NFNet-F and NFNet-L (Brock et al., "High-Performance Large-Scale Image
Recognition Without Normalization", https://arxiv.org/abs/2102.06171), as timm's nfnet.py builds them.
Reads the stem `stem.conv{1..4}`, the blocks `stages.S.B` (`conv1`, `conv2`, `conv2b`, `conv3`, each with
a `gain`, `downsample.conv`, the squeeze-excite `attn_last.fc{1,2}` or ECA `attn_last.conv`, `skipinit_gain`),
`final_conv` and `head.fc`; the scaled weight standardization and every constant gain fold into the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv, image_input, squeeze_excite, standardize_weight
from ._resnet_trunk import FeatureMap, refuse_odd_ceil_pool, shortcut_pool

_BLOCK = r"^stages\.(\d+)\.(\d+)\."
_STEM = r"^stem\.conv(\d+)\.weight$"
# The mid-block convs in order; conv2b is NfCfg.extra_conv, which every NFNet-F and -L has.
_BLOCK_CONVS = ("conv1", "conv2", "conv2b", "conv3")
STRIDED_CONV = "conv2"
# timm's _nonlin_gamma (from DeepMind's code): the gain that brings each activation's output back to
# unit variance on unit-Gaussian input.
GAMMA = {Activation.GELU: 1.7015043497085571, Activation.SILU: 1.7881293296813965}


class Attention(str, Enum):
    """What sits in `attn_last`, read from its tensors."""

    NONE = "none"
    SQUEEZE_EXCITE = "se"  # fc1, fc2: timm's SEModule with a ReLU inside
    ECA = "eca"  # conv: a 1-d convolution across the pooled channels


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of a timm NFNet do not say."""

    act: Activation
    # dm_ models (gamma_in_act): each activation multiplies its output by its gamma. The others move
    # gamma into every conv's weight scale instead (the stem's first conv included).
    gamma_in_act: bool
    # dm_ models pad TF "SAME" (ScaledStdConv2dSame): asymmetric for the strided 3x3s.
    same_padding: bool
    # NfCfg.std_conv_eps, for every variant here.
    std_conv_eps: float = 1e-5
    # NfCfg.alpha: the residual branch is scaled by alpha before the sum, and beta = 1/sqrt(expected
    # variance) scales each block's input, with the variance growing by alpha^2 per block.
    alpha: float = 0.2
    # NfCfg.attn_gain: the attention's output is doubled.
    attn_gain: float = 2.0
    # stem_type 'deep_quad': four 3x3 convs striding 2, 1, 1, 2.
    stem_strides: tuple[int, ...] = (2, 1, 1, 2)
    # With the stem at stride 4, stages.0 keeps the resolution and each later stage halves it.
    stage_strides: tuple[int, ...] = (1, 2, 2, 2)

    @property
    def gamma(self) -> float:
        return GAMMA[self.act]


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # "stages.1.0"
    convs: tuple[str, ...]  # conv1, conv2, [conv2b,] conv3: each after an activation
    stride: int  # carried by conv2, and by the 2x2 average pool ahead of downsample.conv
    beta: float  # scales the block's activated input, on both paths
    projects: bool  # downsample.conv on the shortcut; identity otherwise
    attention: Attention
    skipinit: bool  # dm_ models: the branch is also scaled by the stored scalar skipinit_gain


@dataclass(frozen=True)
class Layout:
    stem: tuple[str, ...]  # stem.conv1 .. stem.conv4, an activation between each two
    blocks: tuple[BlockSpec, ...]
    final_conv: bool


def _scaled_conv(read: LayoutReader, prefix: str, channels: int) -> int:
    """A ScaledStdConv2d: weight, bias and a per-output-channel gain."""
    out = read.conv(prefix, channels, bias=True)
    read.tensor(f"{prefix}.gain", (out, 1, 1, 1))
    return out


def _attention(read: LayoutReader, prefix: str, channels: int) -> Attention:
    if f"{prefix}.fc1.weight" in read:
        read.squeeze_excite(prefix, channels, reduce="fc1", expand="fc2")
        return Attention.SQUEEZE_EXCITE
    if f"{prefix}.conv.weight" in read:
        (kernel,) = read.shape(f"{prefix}.conv.weight", rank=3, dims={0: 1, 1: 1})[2:]
        if kernel % 2 == 0:
            raise CheckpointError(f"{read.arch}: {prefix}.conv has an even kernel ({kernel}); ECA pads an odd one")
        read.tensor(f"{prefix}.conv.weight", (1, 1, kernel))
        return Attention.ECA
    return Attention.NONE


def _block(read: LayoutReader, prefix: str, x: FeatureMap, stride: int, beta: float) -> tuple[BlockSpec, int]:
    convs = tuple(c for c in _BLOCK_CONVS if c != "conv2b" or f"{prefix}.conv2b.weight" in read)
    channels = x.channels
    for name in convs:
        channels = _scaled_conv(read, f"{prefix}.{name}", channels)
    attention = _attention(read, f"{prefix}.attn_last", channels)
    projects = f"{prefix}.downsample.conv.weight" in read
    if projects:
        read.tensor(f"{prefix}.downsample.conv.gain", (channels, 1, 1, 1))
        if stride > 1:
            refuse_odd_ceil_pool(read, f"{prefix}.downsample.pool", x)
    # DownsampleAvg's conv has a bias; LayoutReader.shortcut places what the names hold.
    read.shortcut(prefix, x.channels, channels, stride, f"{prefix}.downsample.conv" if projects else None, None)
    skipinit = f"{prefix}.skipinit_gain" in read
    if skipinit:
        read.tensor(f"{prefix}.skipinit_gain", ())
    return BlockSpec(prefix, convs, stride, beta, projects, attention, skipinit), channels


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """Stem, blocks, attention kind and head from key names and shapes; no weight is read. Each
    block's beta follows timm's running expected variance over the blocks the tensors number."""
    read = LayoutReader(ckpt)
    stem = tuple(f"stem.conv{i}" for (i,) in indexed_blocks(ckpt, _STEM, start=1))
    if len(stem) != len(arch.stem_strides):
        raise UnsupportedModel(
            f"{read.arch}: the stem has {len(stem)} stem.convN; trtmc serves NFNet's deep_quad stem of {len(arch.stem_strides)}"
        )
    x = FeatureMap(*ckpt.config.pretrained.input_size)
    for prefix, stride in zip(stem, arch.stem_strides):
        x = x.strided(stride, _scaled_conv(read, prefix, x.channels))
    blocks, expected_var = [], 1.0
    for stage, index in indexed_blocks(ckpt, _BLOCK, stages=len(arch.stage_strides)):
        stride = arch.stage_strides[stage] if index == 0 else 1
        block, channels = _block(read, f"stages.{stage}.{index}", x, stride, expected_var**-0.5)
        blocks.append(block)
        x = x.strided(stride, channels)
        # timm resets the expected variance after each stage's first block (its shortcut projects).
        expected_var = (1.0 if index == 0 else expected_var) + arch.alpha**2
    final_conv = "final_conv.weight" in read
    channels = _scaled_conv(read, "final_conv", x.channels) if final_conv else x.channels
    read.classifier("head.fc", channels, bias=True)
    read.finish()
    return Layout(stem, tuple(blocks), final_conv)


def _conv(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, arch: ArchConfig, *, stride: int = 1, input_scale: float = 1.0
) -> Tensor:
    """A ScaledStdConv2d with the constant factors its input carries folded into its weight.

    timm standardizes the weight and scales it by gain * gamma / sqrt(fan_in) on every forward (gamma
    only where it is not in the activations); that weight is computed once here. `input_scale` is
    what the layers ahead multiplied the input by (the activation's gamma, the block's beta): the
    convolution is linear and its zero padding stays zero, so conv(s * x, w) = conv(x, s * w) exactly.
    """
    weight = ckpt.tensor(f"{prefix}.weight")
    gain = ckpt.tensor(f"{prefix}.gain").astype(np.float64).reshape(-1, 1, 1, 1)
    conv_gamma = 1.0 if arch.gamma_in_act else arch.gamma
    factor = gain * (conv_gamma * weight[0].size**-0.5 * input_scale)
    scaled = (standardize_weight(weight, arch.std_conv_eps) * factor).astype(np.float32)
    return conv(g, x, ckpt, prefix, stride=stride, tf_same=arch.same_padding, weight=scaled)


def _eca(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str) -> Tensor:
    """timm's EcaModule: the pooled channels, convolved as one row of C values with a 1-d kernel, gate x."""
    channels, weight = x.channels, ckpt.tensor(f"{prefix}.conv.weight")
    kernel = weight.shape[-1]
    s = g.reshape(g.global_avg_pool(x, f"{prefix}.pool"), (1, channels, 1), f"{prefix}.channels_as_rows")
    pad = (kernel - 1) // 2
    s = g.conv2d(s, f"{prefix}.conv", weight.reshape(1, 1, kernel, 1), padding=(pad, 0, pad, 0))
    s = g.activation(s, Activation.SIGMOID, f"{prefix}.gate")
    return g.mul(x, g.reshape(s, (channels, 1, 1), f"{prefix}.channels"), f"{prefix}.mul")


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, b: BlockSpec, arch: ArchConfig) -> Tensor:
    p = b.prefix
    act_gain = arch.gamma if arch.gamma_in_act else 1.0
    # act1(x) * beta feeds both paths; its two factors move into conv1 and downsample.conv.
    out = g.activation(x, arch.act, f"{p}.act1")
    shortcut = x
    if b.projects:
        pooled = shortcut_pool(g, out, f"{p}.downsample.pool", b.stride) if b.stride > 1 else out
        shortcut = _conv(g, pooled, ckpt, f"{p}.downsample.conv", arch, input_scale=act_gain * b.beta)
    for i, name in enumerate(b.convs):
        if i:
            out = g.activation(out, arch.act, f"{p}.act{name.removeprefix('conv')}")
        scale = act_gain * (b.beta if i == 0 else 1.0)
        out = _conv(g, out, ckpt, f"{p}.{name}", arch, stride=b.stride if name == STRIDED_CONV else 1, input_scale=scale)
    if b.attention is Attention.SQUEEZE_EXCITE:
        out = squeeze_excite(g, out, ckpt, f"{p}.attn_last", inner=Activation.RELU, gate=Activation.SIGMOID, reduce="fc1", expand="fc2")
    elif b.attention is Attention.ECA:
        out = _eca(g, out, ckpt, f"{p}.attn_last")
    # out * attn_gain (with attention) * skipinit_gain (dm_) * alpha + shortcut: one constant scale.
    gain = arch.alpha * (arch.attn_gain if b.attention is not Attention.NONE else 1.0)
    if b.skipinit:
        gain *= float(ckpt.tensor(f"{p}.skipinit_gain"))
    out = g.scale(out, f"{p}.alpha", np.full(out.channels, gain, np.float32), np.zeros(out.channels, np.float32))
    return g.add(out, shortcut, p)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    act_gain = arch.gamma if arch.gamma_in_act else 1.0
    x = image_input(g, ckpt)
    for i, (prefix, stride) in enumerate(zip(layout.stem, arch.stem_strides)):
        if i:
            x = g.activation(x, arch.act, f"stem.act{i + 1}")
        x = _conv(g, x, ckpt, prefix, arch, stride=stride, input_scale=act_gain if i else 1.0)
    for block in layout.blocks:
        x = _emit_block(g, x, ckpt, block, arch)
    if layout.final_conv:
        x = _conv(g, x, ckpt, "final_conv", arch)
    x = g.global_avg_pool(g.activation(x, arch.act, "final_act"), "head.global_pool")
    # final_act's gamma (dm_) survives the average pool unchanged and moves into the classifier.
    weight = ckpt.tensor("head.fc.weight") * np.float32(act_gain)
    return g.linear(x, "head.fc", weight, ckpt.tensor("head.fc.bias"))


FAMILY = Family(
    name="nfnet",
    summary="NFNet-F / NFNet-L / ECA-NFNet: normalizer-free, scaled weight standardization (timm nfnet.py)",
    architectures={
        # _dm_nfnet_cfg: GELU, gamma_in_act, same_padding, skipinit; SE attention (in the tensors).
        "dm_nfnet_f0": ArchConfig(Activation.GELU, gamma_in_act=True, same_padding=True),
        # _nfnet_cfg with act_layer='silu': SE (nfnet_l0) or ECA (eca_nfnet_l0) attention, in the tensors.
        "nfnet_l0": ArchConfig(Activation.SILU, gamma_in_act=False, same_padding=False),
        "eca_nfnet_l0": ArchConfig(Activation.SILU, gamma_in_act=False, same_padding=False),
    },
    derive_layout=derive_layout,
    emit=emit,
)
