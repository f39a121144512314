"""ConvNeXt (Liu et al., "A ConvNet for the 2020s", https://arxiv.org/abs/2201.03545) as timm builds it.

It reads `stem.{0,1}`, `stages.<i>.downsample.{0,1}`, `stages.<i>.blocks.<j>.{conv_dw, norm, mlp.fc1,
mlp.fc2, gamma}` and `head.{norm, fc}`; widths, depths, kernel sizes, the patch size and whether the MLP
is stored as 1x1 convolutions (atto, nano) or as linears (tiny, small) all come from their shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Graph
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._parts import block_indices, classifier_head, conv, expect_shape, expect_tensors, image_input

_BLOCK = r"^stages\.(\d+)\.blocks\.(\d+)\."


@dataclass(frozen=True)
class ConvNeXtConfig:
    # timm's LayerNorm and LayerNorm2d default to eps=1e-6, and no variant served here sets norm_eps.
    norm_eps: float = 1e-6
    # The block MLPs use nn.GELU: the exact erf form, not the tanh approximation.
    act: Activation = Activation.GELU


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # stages.<i>.blocks.<j>
    hidden: int  # MLP width
    layer_scale: bool  # a per-channel `gamma` multiplies the branch before the residual sum


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


def derive_layout(ckpt: Checkpoint, arch: ConvNeXtConfig) -> Layout:
    """Stages and blocks from the key names, widths and kernels from the shapes; names and shapes only."""
    name = ckpt.config.architecture
    names = set(ckpt.names)
    in_chans = ckpt.config.pretrained.input_size[0]
    stem_width, _, patch, patch_w = expect_shape(ckpt, "stem.0.weight", rank=4, dims={1: in_chans})
    if patch != patch_w:
        raise CheckpointError(f"{name}: stem.0.weight {(stem_width, in_chans, patch, patch_w)} is not a square patch")
    expected = {"stem.0.weight": (stem_width, in_chans, patch, patch)}
    expected.update({key: (stem_width,) for key in ("stem.0.bias", "stem.1.weight", "stem.1.bias")})

    indices = block_indices(ckpt, _BLOCK)
    stage_ids = sorted({s for s, _ in indices})
    if stage_ids != list(range(len(stage_ids))) or not stage_ids:
        raise CheckpointError(f"{name}: stage indices {stage_ids} in stages.<i>.blocks.<j> are not 0, 1, 2, ...")
    stages, width_in = [], stem_width
    for s in stage_ids:
        prefix = f"stages.{s}"
        block_ids = [j for t, j in indices if t == s]
        if block_ids != list(range(len(block_ids))):
            raise CheckpointError(f"{name}: block indices {block_ids} of {prefix} are not 0, 1, 2, ...")
        width = expect_shape(ckpt, f"{prefix}.blocks.0.conv_dw.weight", rank=4)[0]
        downsample = 0
        if f"{prefix}.downsample.1.weight" in names:
            downsample = expect_shape(ckpt, f"{prefix}.downsample.1.weight", rank=4)[2]
            expected[f"{prefix}.downsample.1.weight"] = (width, width_in, downsample, downsample)
            expected[f"{prefix}.downsample.1.bias"] = (width,)
            expected[f"{prefix}.downsample.0.weight"] = expected[f"{prefix}.downsample.0.bias"] = (width_in,)
        elif width != width_in:
            raise CheckpointError(f"{name}: {prefix} widens {width_in} -> {width} channels without a downsample")
        blocks = []
        for j in block_ids:
            bp = f"{prefix}.blocks.{j}"
            kernel = expect_shape(ckpt, f"{bp}.conv_dw.weight", rank=4)[2]
            fc1 = expect_shape(ckpt, f"{bp}.mlp.fc1.weight")
            hidden, pointwise = fc1[0], fc1[2:]  # (1, 1) for a conv MLP, () for linears
            if pointwise not in ((), (1, 1)):
                raise CheckpointError(f"{name}: {bp}.mlp.fc1.weight {fc1} is neither a linear nor a 1x1 convolution")
            blocks.append(BlockSpec(bp, hidden, f"{bp}.gamma" in names))
            expected[f"{bp}.conv_dw.weight"] = (width, 1, kernel, kernel)
            expected[f"{bp}.mlp.fc1.weight"] = (hidden, width, *pointwise)
            expected[f"{bp}.mlp.fc2.weight"] = (width, hidden, *pointwise)
            expected[f"{bp}.mlp.fc1.bias"] = (hidden,)
            for leaf in ("conv_dw.bias", "norm.weight", "norm.bias", "mlp.fc2.bias", "gamma"):
                if leaf != "gamma" or blocks[-1].layer_scale:
                    expected[f"{bp}.{leaf}"] = (width,)
        stages.append(StageSpec(prefix, width, downsample, tuple(blocks)))
        width_in = width

    expected["head.norm.weight"] = expected["head.norm.bias"] = (width_in,)
    expected["head.fc.weight"] = (ckpt.config.num_classes, width_in)
    expected["head.fc.bias"] = (ckpt.config.num_classes,)
    expect_tensors(ckpt, expected)
    return Layout(patch, stem_width, tuple(stages))


def _norm(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, eps: float, axis: int = 1) -> Tensor:
    return g.layer_norm(x, prefix, ckpt.tensor(f"{prefix}.weight"), ckpt.tensor(f"{prefix}.bias"), eps, axis=axis)


def _pointwise(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str) -> Tensor:
    """An MLP layer as a 1x1 convolution, whether timm stored it as one or as a linear."""
    weight = ckpt.tensor(f"{prefix}.weight")
    return g.conv2d(x, prefix, weight.reshape(*weight.shape[:2], 1, 1), ckpt.tensor(f"{prefix}.bias"))


def _block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: BlockSpec, arch: ConvNeXtConfig) -> Tensor:
    # The whole block stays NCHW: the norm reduces over axis 1 and the MLP runs as 1x1 convolutions,
    # so the linear variants need none of timm's two permutes per block.
    p = block.prefix
    y = conv(g, x, ckpt, f"{p}.conv_dw")
    y = _norm(g, y, ckpt, f"{p}.norm", arch.norm_eps)
    y = _pointwise(g, y, ckpt, f"{p}.mlp.fc1")
    y = g.activation(y, arch.act, f"{p}.mlp.act")
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
    x = _norm(g, x, ckpt, "stem.1", arch.norm_eps)
    for stage in layout.stages:
        if stage.downsample:
            x = _norm(g, x, ckpt, f"{stage.prefix}.downsample.0", arch.norm_eps)
            # timm pads the 2x2 stride-2 downsample with 0, not with its usual (k - 1 + s - 1) // 2.
            x = conv(g, x, ckpt, f"{stage.prefix}.downsample.1", stride=stage.downsample, padding=0)
        for block in stage.blocks:
            x = _block(g, x, ckpt, block, arch)
    # timm's default ConvNeXt head pools first and normalizes after (head_norm_first=False).
    x = g.global_avg_pool(x, "head.global_pool")
    x = _norm(g, x, ckpt, "head.norm", arch.norm_eps, axis=-1)
    return classifier_head(g, x, ckpt, "head.fc")


def build(ckpt: Checkpoint, arch: ConvNeXtConfig) -> Graph:
    layout = derive_layout(ckpt, arch)
    g = GraphBuilder()
    g.output(emit(g, ckpt, layout, arch))
    return g.finish()


FAMILY = Family(
    name="convnext",
    summary="ConvNeXt: patchify stem, depthwise 7x7 + LayerNorm + GELU MLP blocks with layer scale",
    architectures={
        "convnext_atto": ConvNeXtConfig(),
        "convnext_nano": ConvNeXtConfig(),
        "convnext_tiny": ConvNeXtConfig(),
        "convnext_small": ConvNeXtConfig(),
    },
    build=build,
)
