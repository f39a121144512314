"""MnasNet (https://arxiv.org/abs/1807.11626): the mobile network found by platform-aware architecture search,
built by timm's EfficientNet builder on ReLU, with squeeze-excite in some stages of the A1 and small models.
It reads what efficientnet.py reads: `conv_stem`/`bn1`, every `blocks.<stage>.<block>`, `conv_head`/`bn2`
and `classifier`.
"""

from __future__ import annotations

from ..graph import Activation
from . import Family
from .efficientnet import ArchConfig, decode_stages, derive_layout, emit

# timm's _gen_mnasnet_b1 / _a1 / _small arch_def: seven stages halving at 1, 2, 3 and 5. B1 and A1 mark
# their first block `noskip` (B1 its last too); there its input and output widths differ, so
# the token only keeps the layout true to timm's where a width multiplier would make them equal.
_B1 = decode_stages("s1_noskip s2 s2 s2 s1 s2 s1_noskip")
_A1 = decode_stages("s1_noskip s2 s2 s2 s1 s2 s1")
# The small model's first block maps 8 channels to 8 and adds its input.
_SMALL = decode_stages("s1 s2 s2 s2 s1 s2 s1")

# timm's EfficientNet defaults to ReLU, inside squeeze-excite too, with a sigmoid gate.
ARCHITECTURES = {
    "mnasnet_100": ArchConfig(_B1, Activation.RELU),
    "semnasnet_100": ArchConfig(_A1, Activation.RELU),
    "mnasnet_small": ArchConfig(_SMALL, Activation.RELU),
}

FAMILY = Family(
    name="mnasnet",
    summary="MnasNet B1 (mnasnet_100), A1 with SE (semnasnet_100) and small: ReLU inverted residuals",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
