"""MixNet (https://arxiv.org/abs/1907.09595): EfficientNet's builder with MixConv, depthwise and pointwise
convolutions whose channel groups each have their own kernel size. It reads what efficientnet.py reads,
a MixedConv2d as its parts `conv_dw.0`, `conv_dw.1`, ... (kernel sizes from their shapes).
"""

from __future__ import annotations

from dataclasses import replace

from ..graph import Activation
from . import Family
from .efficientnet import TF_EPS, ArchConfig, decode_stages, derive_layout, emit

# timm's _gen_mixnet_s / _gen_mixnet_m arch_def: six stages halving at 1, 2, 3 and 5; the first two
# run on the network's ReLU, the others on SiLU (their `nsw` blocks), inside squeeze-excite too.
MIXNET_STAGES = decode_stages("s1 s2 s2_nsw s2_nsw s1_nsw s2_nsw")

# timm's EfficientNet defaults to ReLU, which MixNet keeps for the stem, the first stages and the head.
_TIMM = ArchConfig(MIXNET_STAGES, Activation.RELU)
# The TF port pads every kernel of a MixConv TF "SAME" (each for its own size) and keeps TF's eps.
_TF = replace(_TIMM, eps=TF_EPS, tf_same=True)

ARCHITECTURES = {
    "mixnet_s": _TIMM,
    "mixnet_m": _TIMM,
    "tf_mixnet_s": _TF,
}

FAMILY = Family(
    name="mixnet",
    summary="MixNet S/M: inverted residuals whose MixConv layers give each channel group its own kernel size",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
