"""PP-LCNet (https://arxiv.org/abs/2109.15099): a MobileNetV1-like stack of depthwise-separable blocks with
hard-swish after both convolutions, squeeze-excite in the last stage and MobileNetV3's pooled head. It reads
what mobilenetv3.py reads: `conv_stem`/`bn1`, every `blocks.<stage>.<block>.{conv_dw,bn1,se.*,conv_pw,bn2}`,
`conv_head` with its bias and `classifier`.
"""

from __future__ import annotations

from ..graph import Activation
from . import Family
from .efficientnet import ArchConfig, decode_stages
from .mobilenetv3 import derive_layout, emit

# timm's _gen_lcnet arch_def: six stages of `dsa` blocks (an activation after the pointwise conv too,
# and no block adds its input, even where the shapes would allow it), halving at 1, 2, 3 and 5.
LCNET_STAGES = decode_stages("s1_dsa s2_dsa s2_dsa s2_dsa s1_dsa s2_dsa")

# timm gives LCNet hard-swish and MobileNetV3's squeeze-excite: ReLU inside, a hard-sigmoid gate.
_TIMM = ArchConfig(LCNET_STAGES, Activation.HARD_SWISH, se_act=Activation.RELU, se_gate=Activation.HARD_SIGMOID)

ARCHITECTURES = {
    "lcnet_050": _TIMM,
    "lcnet_075": _TIMM,
    "lcnet_100": _TIMM,
}

FAMILY = Family(
    name="lcnet",
    summary="PP-LCNet 0.5x/0.75x/1.0x: hard-swish depthwise-separable blocks, SE at the end, pooled conv head",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
