"""MobileNetV4 (https://arxiv.org/abs/2404.10518), its convolutional models: Universal Inverted Bottleneck
blocks (`uir`, whose depthwise convs before, inside and after the expansion are each optional), fused-IB and
conv stages, then MobileNetV3's pooled head with a batch norm. It reads `conv_stem`/`bn1`, every
`blocks.<stage>.<block>` (efficientnet.py's blocks), `conv_head`, `norm_head` and `classifier`.
"""

from __future__ import annotations

from ..graph import Activation
from . import Family
from .efficientnet import ArchConfig, decode_stages
from .mobilenetv3 import derive_layout, emit

# timm's _gen_mobilenet_v4 arch_def for the conv models: five stages, the first four halving (the
# stride sits on the depthwise conv the tensors show), the last a 1x1 ConvBnAct. No block is marked
# `skip`/`noskip`, and the conv models have no squeeze-excite and no layer scale.
MOBILENETV4_STAGES = decode_stages("s2 s2 s2 s2 s1")

# The hybrid models add multi-query attention blocks and layer scale: their tensors are refused as
# ones this layout does not use.
_CONV = ArchConfig(MOBILENETV4_STAGES, Activation.RELU)

ARCHITECTURES = {
    "mobilenetv4_conv_small_050": _CONV,
    "mobilenetv4_conv_small": _CONV,
    "mobilenetv4_conv_medium": _CONV,
}

FAMILY = Family(
    name="mobilenetv4",
    summary="MobileNetV4 conv small (0.5x, 1.0x) and medium: universal inverted bottlenecks, fused-IB, norm head",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
