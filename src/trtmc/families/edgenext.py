"""EdgeNeXt (Maaz et al., https://arxiv.org/abs/2206.10589) as timm builds it: ConvNeXt-like stages whose
last blocks are split depth-wise transpose attention (SDTA) blocks, attending across channels.

It reads `stem.{0, 1}`, `stages.<i>.downsample.{0, 1}`, the conv blocks `stages.<i>.blocks.<j>.{conv_dw,
norm, mlp.fc1, mlp.fc2, gamma}`, the SDTA blocks `stages.<i>.blocks.<j>.{convs.<k>, pos_embd.token_projection,
norm_xca, xca.{temperature, qkv, proj}, gamma_xca, norm, mlp.fc1, mlp.fc2, gamma}` and `head.{norm, fc}`;
widths, depths, kernels, channel splits, heads and where a positional encoding is added come from them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv, image_input, l2_normalize, layer_norm, linear
from .levit import to_map, to_tokens

_BLOCK = r"^stages\.(\d+)\.blocks\.(\d+)\."


@dataclass(frozen=True)
class EdgeNeXtConfig:
    """What the tensors of a timm EdgeNeXt do not say."""

    # Every norm is LayerNorm2d or nn.LayerNorm with eps=1e-6; the MLPs use nn.GELU (the erf form).
    norm_eps: float = 1e-6
    act: Activation = Activation.GELU
    # CrossCovarianceAttn L2-normalizes q and k with F.normalize's default eps.
    normalize_eps: float = 1e-12
    # PositionalEncodingFourier's temperature; its feature width is the projection's input.
    temperature: float = 10000.0


@dataclass(frozen=True)
class ConvBlock:
    """Depthwise kxk conv, then norm, MLP and layer scale on channels-last tokens, plus the input."""

    prefix: str
    kernel: int


@dataclass(frozen=True)
class SplitTransposeBlock:
    """SDTA: depthwise 3x3 convs over channel chunks, each fed the previous one's output (Res2Net-like),
    a positional encoding where stored, cross-covariance attention, then the conv block's MLP."""

    prefix: str
    chunks: tuple[int, ...]  # channel widths; every chunk but the last goes through a conv
    heads: int
    positions: bool


@dataclass(frozen=True)
class StageSpec:
    prefix: str
    downsample: int  # kernel (= stride) of the norm + conv opening the stage; 0 keeps the resolution
    blocks: tuple[ConvBlock | SplitTransposeBlock, ...]


@dataclass(frozen=True)
class Layout:
    patch: int  # the stem is a patch x patch convolution of stride patch
    stages: tuple[StageSpec, ...]


def _mlp(read: LayoutReader, prefix: str, width: int) -> None:
    """norm, mlp.fc1, mlp.fc2 (linears) and the layer scale `gamma` of a block `width` wide."""
    read.layer_norm(f"{prefix}.norm", width)
    hidden = read.linear(f"{prefix}.mlp.fc1", width, bias=True)
    read.linear(f"{prefix}.mlp.fc2", hidden, width, bias=True)
    read.tensor(f"{prefix}.gamma", (width,))


def _conv_block(read: LayoutReader, prefix: str, width: int) -> ConvBlock:
    kernel = read.shape(f"{prefix}.conv_dw.weight", rank=4, dims={0: width, 1: 1})[2]
    read.tensor(f"{prefix}.conv_dw.weight", (width, 1, kernel, kernel))
    read.tensor(f"{prefix}.conv_dw.bias", (width,))
    _mlp(read, prefix, width)
    return ConvBlock(prefix, kernel)


def _split_transpose_block(read: LayoutReader, prefix: str, width: int) -> SplitTransposeBlock:
    convs = len(indexed_blocks(read.ckpt, rf"^{re.escape(prefix)}\.convs\.(\d+)\."))
    chunk = read.shape(f"{prefix}.convs.0.weight", rank=4)[0]
    # timm splits with x.chunk(convs + 1): chunks of ceil(width / (convs + 1)) channels, the last one less.
    if chunk != math.ceil(width / (convs + 1)) or width - convs * chunk <= 0:
        raise CheckpointError(
            f"{read.arch}: {prefix}.convs.0.weight splits {width} channels into chunks of {chunk}, not into "
            f"{convs + 1} chunks as timm's x.chunk does"
        )
    for k in range(convs):
        read.tensor(f"{prefix}.convs.{k}.weight", (chunk, 1, 3, 3))
        read.tensor(f"{prefix}.convs.{k}.bias", (chunk,))
    positions = f"{prefix}.pos_embd.token_projection.weight" in read
    if positions:  # a 1x1 projection of sines and cosines of the rows, then of the columns
        projection = f"{prefix}.pos_embd.token_projection"
        features = read.shape(f"{projection}.weight", rank=4)[1]
        if features % 2:
            raise CheckpointError(
                f"{read.arch}: {projection}.weight reads {features} features, not as many for rows as for columns"
            )
        read.conv(projection, features, bias=True, dims={0: width, 2: 1, 3: 1})
    read.layer_norm(f"{prefix}.norm_xca", width)
    heads = read.shape(f"{prefix}.xca.temperature", rank=3, dims={1: 1, 2: 1})[0]
    if width % heads:
        raise CheckpointError(f"{read.arch}: {prefix} is {width} wide, which does not split into {heads} heads")
    read.tensor(f"{prefix}.xca.temperature", (heads, 1, 1))
    read.linear(f"{prefix}.xca.qkv", width, 3 * width, bias=True)
    read.linear(f"{prefix}.xca.proj", width, width, bias=True)
    read.tensor(f"{prefix}.gamma_xca", (width,))
    _mlp(read, prefix, width)
    return SplitTransposeBlock(prefix, (chunk,) * convs + (width - convs * chunk,), heads, positions)


def _stage(read: LayoutReader, prefix: str, depth: int, width: int) -> tuple[StageSpec, int]:
    downsample = 0
    if f"{prefix}.downsample.1.weight" in read:
        read.layer_norm(f"{prefix}.downsample.0", width)
        downsample = read.shape(f"{prefix}.downsample.1.weight", rank=4)[2]
        width = read.conv(f"{prefix}.downsample.1", width, bias=True, dims={2: downsample, 3: downsample})
    blocks: list[ConvBlock | SplitTransposeBlock] = []
    for j in range(depth):
        block = f"{prefix}.blocks.{j}"
        if f"{block}.xca.qkv.weight" in read:
            blocks.append(_split_transpose_block(read, block, width))
        else:
            blocks.append(_conv_block(read, block, width))
    return StageSpec(prefix, downsample, tuple(blocks)), width


def derive_layout(ckpt: Checkpoint, arch: EdgeNeXtConfig) -> Layout:
    """Stages, block kinds, widths and splits from names and shapes; names and shapes only."""
    read = LayoutReader(ckpt)
    in_chans = ckpt.config.pretrained.input_size[0]
    patch = read.shape("stem.0.weight", rank=4, dims={1: in_chans})[2]
    width = read.conv("stem.0", in_chans, bias=True, dims={2: patch, 3: patch})
    read.layer_norm("stem.1", width)
    indices = indexed_blocks(ckpt, _BLOCK)
    if not indices:
        raise CheckpointError(f"{read.arch}: no stages.<i>.blocks.<j> tensors; not an EdgeNeXt checkpoint")
    stages = []
    for stage in sorted({s for s, _ in indices}):
        spec, width = _stage(read, f"stages.{stage}", sum(s == stage for s, _ in indices), width)
        stages.append(spec)
    read.layer_norm("head.norm", width)
    read.classifier("head.fc", width, bias=True)
    read.finish()
    return Layout(patch, tuple(stages))


def fourier_positions(features: int, height: int, width: int, temperature: float) -> np.ndarray:
    """PositionalEncodingFourier's input [2 * features, height, width] (before its 1x1 projection), in
    float64: each pixel's row and column, scaled to (0, 2 pi], through sines and cosines of
    `features` frequencies, the row's first."""
    eps, scale = 1e-6, 2 * math.pi
    rows = np.arange(1, height + 1, dtype=np.float64)[:, None].repeat(width, 1) / (height + eps) * scale
    cols = np.arange(1, width + 1, dtype=np.float64)[None, :].repeat(height, 0) / (width + eps) * scale
    frequencies = temperature ** (2 * (np.arange(features) // 2) / features)

    def encode(position: np.ndarray) -> np.ndarray:
        angles = position[:, :, None] / frequencies  # [height, width, features]
        return np.stack((np.sin(angles[:, :, 0::2]), np.cos(angles[:, :, 1::2])), axis=3).reshape(height, width, -1)

    return np.concatenate((encode(rows), encode(cols)), axis=2).transpose(2, 0, 1)


def _positions(ckpt: Checkpoint, prefix: str, height: int, width: int, arch: EdgeNeXtConfig) -> np.ndarray:
    """The block's positional encoding as tokens [1, height * width, C]: timm computes it from the map's
    size alone on every call, so it is computed here once, projection included."""
    weight = ckpt.tensor(f"{prefix}.token_projection.weight").astype(np.float64)[:, :, 0, 0]
    bias = ckpt.tensor(f"{prefix}.token_projection.bias").astype(np.float64)
    fourier = fourier_positions(weight.shape[1] // 2, height, width, arch.temperature).reshape(weight.shape[1], -1)
    return (weight @ fourier + bias[:, None]).T[None]


def _layer_scale(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, name: str) -> Tensor:
    # Its own op rather than folded into fc2: trained layer scales start at 1e-6, and gamma * fc2
    # would push fp16 weights into the subnormal range.
    gamma = ckpt.tensor(name)
    return g.scale(x, name, gamma, np.zeros_like(gamma), axis=-1)


def _emit_mlp(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, arch: EdgeNeXtConfig) -> Tensor:
    """gamma * fc2(act(fc1(norm(x)))) on channels-last tokens, as timm runs both kinds of block."""
    y = layer_norm(g, x, ckpt, f"{prefix}.norm", arch.norm_eps)
    y = g.activation(linear(g, y, ckpt, f"{prefix}.mlp.fc1"), arch.act, f"{prefix}.mlp.act")
    return _layer_scale(g, linear(g, y, ckpt, f"{prefix}.mlp.fc2"), ckpt, f"{prefix}.gamma")


def _cross_covariance_attention(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: SplitTransposeBlock, arch: EdgeNeXtConfig
) -> Tensor:
    """XCA: attention across each head's channels rather than across tokens. Each channel's values over
    the tokens are a row; q and k rows are L2-normalized and the scores multiplied by the head's learned
    temperature. As one ATTENTION op, the channels are its tokens and the image's tokens its head_dim;
    the temperature scales q per head, and the op's own scale is 1."""
    p = f"{block.prefix}.xca"
    _, tokens, width = x.shape
    heads, head_dim = block.heads, width // block.heads
    qkv = g.transpose(linear(g, x, ckpt, f"{p}.qkv"), (0, 2, 1), f"{p}.split_heads")  # [N, (q|k|v, head, d), T]
    qkv = g.reshape(qkv, (3 * heads, head_dim, tokens), f"{p}.split_heads")
    q, k, v = (g.slice(qkv, 1, i * heads, (i + 1) * heads, f"{p}.{part}") for i, part in enumerate("qkv"))
    temperature = g.constant(f"{p}.temperature", ckpt.tensor(f"{p}.temperature").reshape(1, heads, 1, 1))
    q = g.mul(l2_normalize(g, q, arch.normalize_eps, f"{p}.q_norm"), temperature, f"{p}.temperature")
    k = l2_normalize(g, k, arch.normalize_eps, f"{p}.k_norm")
    y = g.attention(q, k, v, p, scale=1.0)  # [N, heads, d, T]
    y = g.transpose(g.reshape(y, (width, tokens), f"{p}.merge_heads"), (0, 2, 1), f"{p}.merge_heads")
    return linear(g, y, ckpt, f"{p}.proj")


def _emit_split_transpose_block(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: SplitTransposeBlock, arch: EdgeNeXtConfig
) -> Tensor:
    p, (_, _, height, width) = block.prefix, x.shape
    starts = np.cumsum((0,) + block.chunks)
    chunks = [g.slice(x, 1, a, b, f"{p}.chunk") for a, b in zip(starts, starts[1:])]
    mixed, y = [], None
    for k, chunk in enumerate(chunks[:-1]):
        y = chunk if y is None else g.add(y, chunk, f"{p}.convs.{k}.add")
        y = conv(g, y, ckpt, f"{p}.convs.{k}")
        mixed.append(y)
    t = to_tokens(g, g.concat(mixed + chunks[-1:], 1, f"{p}.cat"), f"{p}.tokens")
    if block.positions:
        positions = g.constant(f"{p}.pos_embd", _positions(ckpt, f"{p}.pos_embd", height, width, arch))
        t = g.add(t, positions, f"{p}.pos_embd.add")
    y = _cross_covariance_attention(g, layer_norm(g, t, ckpt, f"{p}.norm_xca", arch.norm_eps), ckpt, block, arch)
    t = g.add(t, _layer_scale(g, y, ckpt, f"{p}.gamma_xca"), f"{p}.xca.add")
    return g.add(x, to_map(g, _emit_mlp(g, t, ckpt, p, arch), height, width, f"{p}.map"), f"{p}.add")


def _emit_conv_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: ConvBlock, arch: EdgeNeXtConfig) -> Tensor:
    p, (_, _, height, width) = block.prefix, x.shape
    y = to_tokens(g, conv(g, x, ckpt, f"{p}.conv_dw"), f"{p}.tokens")
    return g.add(x, to_map(g, _emit_mlp(g, y, ckpt, p, arch), height, width, f"{p}.map"), f"{p}.add")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: EdgeNeXtConfig) -> Tensor:
    x = conv(g, image_input(g, ckpt), ckpt, "stem.0", stride=layout.patch, padding=0)
    x = layer_norm(g, x, ckpt, "stem.1", arch.norm_eps, axis=1)
    for stage in layout.stages:
        if stage.downsample:
            x = layer_norm(g, x, ckpt, f"{stage.prefix}.downsample.0", arch.norm_eps, axis=1)
            x = conv(g, x, ckpt, f"{stage.prefix}.downsample.1", stride=stage.downsample, padding=0)
        for block in stage.blocks:
            if isinstance(block, SplitTransposeBlock):
                x = _emit_split_transpose_block(g, x, ckpt, block, arch)
            else:
                x = _emit_conv_block(g, x, ckpt, block, arch)
    # NormMlpClassifierHead: pool, then the norm, then the classifier.
    x = layer_norm(g, g.global_avg_pool(x, "head.global_pool"), ckpt, "head.norm", arch.norm_eps)
    return linear(g, x, ckpt, "head.fc")


FAMILY = Family(
    name="edgenext",
    summary="EdgeNeXt: ConvNeXt-like blocks, then split depth-wise transpose attention across channels",
    architectures={
        "edgenext_xx_small": EdgeNeXtConfig(),
        "edgenext_x_small": EdgeNeXtConfig(),
        "edgenext_small": EdgeNeXtConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
