"""ConvNeXt (Liu et al., "A ConvNet for the 2020s", https://arxiv.org/abs/2201.03545) and ConvNeXt V2
(Woo et al., https://arxiv.org/abs/2301.00808: global response normalization in the MLP, no layer scale)
as timm builds them.

It reads `stem.{0,1}`, `stages.<i>.downsample.{0,1}`, `stages.<i>.blocks.<j>.{conv_dw, norm, mlp.fc1,
mlp.grn, mlp.fc2, gamma}` and `head.{norm, fc}`; widths, depths, kernel sizes, the patch size, whether the
MLP is stored as 1x1 convolutions (atto, nano) or as linears (tiny, small), and whether a block has layer
scale (V1) or a GRN (V2) all come from their names and shapes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Binary, Reduction
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv, image_input, layer_norm, linear

_BLOCK = r"^stages\.(\d+)\.blocks\.(\d+)\."


@dataclass(frozen=True)
class ConvNeXtConfig:
    # timm's LayerNorm and LayerNorm2d default to eps=1e-6, and no variant served here sets norm_eps.
    norm_eps: float = 1e-6
    # The block MLPs use nn.GELU: the exact erf form, not the tanh approximation.
    act: Activation = Activation.GELU
    # V2's GlobalResponseNorm divides by the channels' mean L2 norm plus its default eps, 1e-6.
    grn_eps: float = 1e-6


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # stages.<i>.blocks.<j>
    hidden: int  # MLP width
    layer_scale: bool  # a per-channel `gamma` multiplies the branch before the residual sum
    grn: bool  # V2: a global response norm between the MLP's activation and fc2


@dataclass(frozen=True)
class StageSpec:
    prefix: str  # stages.<i>
    width: int
    downsample: int  # kernel (= stride) of the patchifying downsample conv; 0 keeps the resolution
    blocks: tuple[BlockSpec, ...]


@dataclass(frozen=True)
class Layout:
    patch: int  # the stem is a patch x patch convolution with stride patch
    stem_width: int
    stages: tuple[StageSpec, ...]


def _block(read: LayoutReader, prefix: str, width: int) -> BlockSpec:
    """Depthwise conv, norm, and the MLP as linears or as 1x1 convs, with or without layer scale."""
    kernel = read.shape(f"{prefix}.conv_dw.weight", rank=4)[2]
    read.tensor(f"{prefix}.conv_dw.weight", (width, 1, kernel, kernel))
    read.tensor(f"{prefix}.conv_dw.bias", (width,))
    read.layer_norm(f"{prefix}.norm", width)
    fc1 = read.shape(f"{prefix}.mlp.fc1.weight")
    hidden, pointwise = fc1[0], fc1[2:]  # (1, 1) for a conv MLP, () for linears
    if pointwise not in ((), (1, 1)):
        raise CheckpointError(f"{read.arch}: {prefix}.mlp.fc1.weight {fc1} is neither a linear nor a 1x1 convolution")
    read.tensor(f"{prefix}.mlp.fc1.weight", (hidden, width, *pointwise))
    read.tensor(f"{prefix}.mlp.fc1.bias", (hidden,))
    read.tensor(f"{prefix}.mlp.fc2.weight", (width, hidden, *pointwise))
    read.tensor(f"{prefix}.mlp.fc2.bias", (width,))
    layer_scale = f"{prefix}.gamma" in read
    if layer_scale:
        read.tensor(f"{prefix}.gamma", (width,))
    grn = f"{prefix}.mlp.grn.weight" in read
    if grn:
        read.tensor(f"{prefix}.mlp.grn.weight", (hidden,))
        read.tensor(f"{prefix}.mlp.grn.bias", (hidden,))
    return BlockSpec(prefix, hidden, layer_scale, grn)


def _stage(read: LayoutReader, prefix: str, depth: int, width_in: int) -> StageSpec:
    """A stage: the patchifying downsample (a norm, then a k x k conv of stride k) where it has one,
    then its `depth` blocks."""
    width = read.shape(f"{prefix}.blocks.0.conv_dw.weight", rank=4)[0]
    downsample = 0
    if f"{prefix}.downsample.1.weight" in read:
        downsample = read.shape(f"{prefix}.downsample.1.weight", rank=4)[2]
        read.layer_norm(f"{prefix}.downsample.0", width_in)
        read.tensor(f"{prefix}.downsample.1.weight", (width, width_in, downsample, downsample))
        read.tensor(f"{prefix}.downsample.1.bias", (width,))
    elif width != width_in:
        raise CheckpointError(f"{read.arch}: {prefix} widens {width_in} -> {width} channels without a downsample")
    blocks = tuple(_block(read, f"{prefix}.blocks.{j}", width) for j in range(depth))
    return StageSpec(prefix, width, downsample, blocks)


def derive_layout(ckpt: Checkpoint, arch: ConvNeXtConfig) -> Layout:
    """Stages and blocks from the key names, widths and kernels from the shapes; names and shapes only."""
    read = LayoutReader(ckpt)
    in_chans = ckpt.config.pretrained.input_size[0]
    stem_width, _, patch, patch_w = read.shape("stem.0.weight", rank=4, dims={1: in_chans})
    if patch != patch_w:
        raise CheckpointError(f"{read.arch}: stem.0.weight {(stem_width, in_chans, patch, patch_w)} is not a square patch")
    read.conv("stem.0", in_chans, bias=True)
    read.layer_norm("stem.1", stem_width)
    indices = indexed_blocks(ckpt, _BLOCK)
    if not indices:
        raise CheckpointError(f"{read.arch}: no stages.<i>.blocks.<j> tensors; not a ConvNeXt checkpoint")
    depths = Counter(stage for stage, _ in indices)  # numbered without gaps: blocks 0..depth - 1
    stages, width = [], stem_width
    for stage in sorted(depths):
        stages.append(_stage(read, f"stages.{stage}", depths[stage], width))
        width = stages[-1].width
    read.layer_norm("head.norm", width)
    read.classifier("head.fc", width, bias=True)
    read.finish()
    return Layout(patch, stem_width, tuple(stages))


def _pointwise(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str) -> Tensor:
    """An MLP layer as a 1x1 convolution, whether timm stored it as one or as a linear."""
    weight = ckpt.tensor(f"{prefix}.weight")
    return g.conv2d(x, prefix, weight.reshape(*weight.shape[:2], 1, 1), ckpt.tensor(f"{prefix}.bias"))


def _global_response_norm(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, eps: float) -> Tensor:
    """timm's GlobalResponseNorm on an NCHW map: x + weight * (x * Nx) + bias, where Nx = Gx / (mean over
    channels of Gx + eps) and Gx is each channel's L2 norm over H and W.

    The statistics are sensitive like a norm's: a 56x56 sum of squares passes fp16's largest value
    (65504) while the activations are still small.
    """
    squares = g.binary(x, x, Binary.MUL, f"{prefix}.square", sensitive=True)
    gx = g.reduce(squares, f"{prefix}.sum", Reduction.SUM, (2, 3), keepdim=True, sensitive=True)
    gx = g.activation(gx, Activation.SQRT, f"{prefix}.sqrt", sensitive=True)
    mean = g.reduce(gx, f"{prefix}.mean", Reduction.MEAN, (1,), keepdim=True, sensitive=True)
    eps_ = g.constant(f"{prefix}.eps", np.full((1, 1, 1, 1), eps), sensitive=True)
    mean = g.binary(mean, eps_, Binary.ADD, f"{prefix}.mean_eps", sensitive=True)
    nx = g.binary(gx, mean, Binary.DIV, f"{prefix}.div", sensitive=True)
    y = g.scale(g.mul(x, nx, f"{prefix}.mul"), prefix, ckpt.tensor(f"{prefix}.weight"), ckpt.tensor(f"{prefix}.bias"))
    return g.add(y, x, f"{prefix}.add")


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: BlockSpec, arch: ConvNeXtConfig) -> Tensor:
    # The whole block stays NCHW: the norm reduces over axis 1 and the MLP runs as 1x1 convolutions,
    # so the linear variants need none of timm's two permutes per block.
    p = block.prefix
    y = conv(g, x, ckpt, f"{p}.conv_dw")
    y = layer_norm(g, y, ckpt, f"{p}.norm", arch.norm_eps, axis=1)
    y = _pointwise(g, y, ckpt, f"{p}.mlp.fc1")
    y = g.activation(y, arch.act, f"{p}.mlp.act")
    if block.grn:
        y = _global_response_norm(g, y, ckpt, f"{p}.mlp.grn", arch.grn_eps)
    y = _pointwise(g, y, ckpt, f"{p}.mlp.fc2")
    if block.layer_scale:
        # Kept as its own op rather than folded into fc2: trained gammas are small, and gamma * fc2
        # would push fp16 weights into the subnormal range. Backends fuse it into the convolution.
        gamma = ckpt.tensor(f"{p}.gamma")
        y = g.scale(y, f"{p}.gamma", gamma, np.zeros_like(gamma))
    return g.add(y, x, f"{p}.add")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ConvNeXtConfig) -> Tensor:
    x = image_input(g, ckpt)
    x = conv(g, x, ckpt, "stem.0", stride=layout.patch, padding=0)
    x = layer_norm(g, x, ckpt, "stem.1", arch.norm_eps, axis=1)
    for stage in layout.stages:
        if stage.downsample:
            x = layer_norm(g, x, ckpt, f"{stage.prefix}.downsample.0", arch.norm_eps, axis=1)
            # timm pads the 2x2 stride-2 downsample with 0, not with its usual (k - 1 + s - 1) // 2.
            x = conv(g, x, ckpt, f"{stage.prefix}.downsample.1", stride=stage.downsample, padding=0)
        for block in stage.blocks:
            x = _emit_block(g, x, ckpt, block, arch)
    # timm's default ConvNeXt head pools first and normalizes after (head_norm_first=False).
    x = g.global_avg_pool(x, "head.global_pool")
    x = layer_norm(g, x, ckpt, "head.norm", arch.norm_eps)
    return linear(g, x, ckpt, "head.fc")


FAMILY = Family(
    name="convnext",
    summary="ConvNeXt / ConvNeXt V2: patchify stem, depthwise 7x7 + LayerNorm + GELU MLP blocks with layer "
    "scale (V1) or global response norm (V2)",
    architectures={
        "convnext_atto": ConvNeXtConfig(),
        "convnext_nano": ConvNeXtConfig(),
        "convnext_tiny": ConvNeXtConfig(),
        "convnext_small": ConvNeXtConfig(),
        "convnextv2_atto": ConvNeXtConfig(),
        "convnextv2_nano": ConvNeXtConfig(),
        "convnextv2_tiny": ConvNeXtConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
