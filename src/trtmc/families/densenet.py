"""DenseNet-BC classifiers as timm builds them (Huang et al., "Densely Connected Convolutional Networks",
https://arxiv.org/abs/1608.06993): every layer of a dense block reads the concatenation of all the
maps before it and appends `growth` channels. Reads the stem `features.conv0`/`norm0`, the layers
`features.denseblockB.denselayerL.{norm1,conv1,norm2,conv2}`, the transitions
`features.transitionB.{norm,conv}`, the final `features.norm5` and the classifier `classifier`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint
from ..graph import Activation, PoolMode
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import batch_norm, conv, conv_norm_act, image_input, linear, max_pool

_LAYER = r"^features\.denseblock(\d+)\.denselayer(\d+)\."
# timm's stem conv0 is a 7x7 convolution with stride 2 and padding 3, then pool0 max-pools
# (kernel, stride, padding) = (3, 2, 1); without anti-aliasing, for every size served here.
STEM_STRIDE = 2
STEM_POOL = (3, 2, 1)
# DenseTransition: nn.AvgPool2d(kernel_size=2, stride=2) halves the map after its 1x1 conv.
TRANSITION_POOL = 2


@dataclass(frozen=True)
class ArchConfig:
    """What the tensors of a timm DenseNet do not say."""

    # DenseNet builds every norm with get_norm_act_layer('batchnorm2d', 'relu'): BatchNormAct2d with
    # PyTorch's default eps, ReLU after each, norm5 included.
    eps: float = 1e-5
    act: Activation = Activation.RELU


@dataclass(frozen=True)
class DenseBlockSpec:
    prefix: str  # "features.denseblock2"
    layers: tuple[str, ...]  # "features.denseblock2.denselayer1", ...: each appends its conv2 output
    transition: str | None  # "features.transition2" after every block but the last


@dataclass(frozen=True)
class Layout:
    blocks: tuple[DenseBlockSpec, ...]


def _dense_layer(read: LayoutReader, prefix: str, channels: int) -> int:
    """norm1 -> 1x1 conv1 (the bottleneck) -> norm2 -> 3x3 conv2; the growth it appends."""
    read.batch_norm(f"{prefix}.norm1", channels)
    bottleneck = read.conv(f"{prefix}.conv1", channels, bias=False, dims={1: channels, 2: 1, 3: 1})
    read.batch_norm(f"{prefix}.norm2", bottleneck)
    return read.conv(f"{prefix}.conv2", bottleneck, bias=False, dims={1: bottleneck, 2: 3, 3: 3})


def _transition(read: LayoutReader, prefix: str, channels: int) -> int:
    read.batch_norm(f"{prefix}.norm", channels)
    return read.conv(f"{prefix}.conv", channels, bias=False, dims={1: channels, 2: 1, 3: 1})


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    """Dense blocks, their layers and the transitions between them, from key names and shapes.

    The growth rate and bottleneck width come from each layer's convolutions, and each layer must
    read exactly the channels the stem and the layers before it concatenated, so a missing or
    mis-shaped layer is refused before any weight is read.
    """
    read = LayoutReader(ckpt)
    if "features.conv1.weight" in read:
        raise UnsupportedModel(
            f"{read.arch}: features.conv1 belongs to a deep stem (timm's stem_type='deep', as in densenetblur121d "
            f"and densenet264d), which this family does not build"
        )
    in_chans = ckpt.config.pretrained.input_size[0]
    channels = read.conv("features.conv0", in_chans, norm="features.norm0", bias=False, dims={1: in_chans})
    # Blocks are numbered from denseblock1, their layers from denselayer1.
    found = indexed_blocks(ckpt, _LAYER, start=1)
    if not found:
        raise UnsupportedModel(f"{read.arch}: no features.denseblockB.denselayerL tensors; is this a DenseNet checkpoint?")
    count = found[-1][0]
    blocks = []
    for number in range(1, count + 1):
        prefix = f"features.denseblock{number}"
        layers = tuple(f"{prefix}.denselayer{layer}" for block, layer in found if block == number)
        for layer in layers:
            channels += _dense_layer(read, layer, channels)
        transition = f"features.transition{number}" if number < count else None
        if transition is not None:
            channels = _transition(read, transition, channels)
        blocks.append(DenseBlockSpec(prefix, layers, transition))
    read.batch_norm("features.norm5", channels)
    read.classifier("classifier", channels)
    read.finish()
    return Layout(tuple(blocks))


def _norm_act_conv(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, norm: str, conv_prefix: str, arch: ArchConfig) -> Tensor:
    """DenseNet's pre-activation order: BatchNormAct2d, then the convolution (timm's padding)."""
    x = g.activation(batch_norm(g, x, ckpt, norm, arch.eps), arch.act, f"{norm}.act")
    return conv(g, x, ckpt, conv_prefix)


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: DenseBlockSpec, arch: ArchConfig) -> Tensor:
    features = [x]
    for layer in block.layers:
        # Each layer reads everything before it, concatenated in order: the block input first.
        joined = features[0] if len(features) == 1 else g.concat(features, 1, f"{layer}.cat")
        y = _norm_act_conv(g, joined, ckpt, f"{layer}.norm1", f"{layer}.conv1", arch)
        features.append(_norm_act_conv(g, y, ckpt, f"{layer}.norm2", f"{layer}.conv2", arch))
    x = g.concat(features, 1, block.prefix)
    if block.transition is None:
        return x
    t = block.transition
    x = _norm_act_conv(g, x, ckpt, f"{t}.norm", f"{t}.conv", arch)
    return g.pool2d(x, f"{t}.pool", PoolMode.AVG, TRANSITION_POOL, TRANSITION_POOL)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = image_input(g, ckpt)
    x = conv_norm_act(g, x, ckpt, "features.conv0", "features.norm0", arch.act, eps=arch.eps, stride=STEM_STRIDE)
    x = max_pool(g, x, "features.pool0", *STEM_POOL)
    for block in layout.blocks:
        x = _emit_block(g, x, ckpt, block, arch)
    x = g.activation(batch_norm(g, x, ckpt, "features.norm5", arch.eps), arch.act, "features.norm5.act")
    return linear(g, g.global_avg_pool(x, "global_pool"), ckpt, "classifier")


# The sizes differ in growth rate and layers per block, both in the tensors. densenetblur121d and
# densenet264d have a deep stem (and blur pooling), whose tensors this layout refuses.
_TIMM_DENSENET = ArchConfig()

FAMILY = Family(
    name="densenet",
    summary="DenseNet-BC 121/169/201 (timm densenet.py): dense blocks of concatenated growth, 1x1 transitions",
    architectures={
        "densenet121": _TIMM_DENSENET,
        "densenet169": _TIMM_DENSENET,
        "densenet201": _TIMM_DENSENET,
    },
    derive_layout=derive_layout,
    emit=emit,
)
