"""FBNet (https://arxiv.org/abs/1812.03443): the network found by differentiable architecture search, timm's
`fbnetc_100`, built by its EfficientNet builder from ReLU inverted residuals with 3x3 and 5x5 kernels. It
reads what efficientnet.py reads: `conv_stem`/`bn1`, every `blocks.<stage>.<block>`, `conv_head`/`bn2` and
`classifier`.
"""

from __future__ import annotations

from ..graph import Activation
from . import Family
from .efficientnet import ArchConfig, decode_stages, derive_layout, emit

# timm's _gen_fbnetc arch_def: seven stages halving at 1, 2, 3 and 5; its first block maps the stem's
# 16 channels to 16 and adds its input. timm's EfficientNet defaults to ReLU.
_FBNETC = ArchConfig(decode_stages("s1 s2 s2 s2 s1 s2 s1"), Activation.RELU)

ARCHITECTURES = {
    "fbnetc_100": _FBNETC,
}

FAMILY = Family(
    name="fbnet",
    summary="FBNet-C: ReLU inverted residuals with expansion 1, 3 or 6 and 3x3/5x5 kernels, no SE",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
