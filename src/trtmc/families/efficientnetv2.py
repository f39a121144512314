"""EfficientNetV2 (https://arxiv.org/abs/2104.00298): EfficientNet's builder with fused-MBConv (`er`) blocks in
the early stages and ConvBnAct blocks that add their input in the first, trained for speed. It reads what
efficientnet.py reads: `conv_stem`/`bn1`, every `blocks.<stage>.<block>`, `conv_head`/`bn2` and `classifier`.
"""

from __future__ import annotations

from dataclasses import replace

from ..graph import Activation
from . import Family
from .efficientnet import TF_EPS, ArchConfig, decode_stages, derive_layout, emit

# timm's _gen_efficientnetv2_base and _gen_efficientnetv2_s arch_def (grammar: efficientnet.decode_stages):
# six stages; the ConvBnAct blocks of the first add their input (`skip`: timm's ConvBnAct has none
# unless told), and resolution halves at stages 1, 2, 3 and 5.
EFFICIENTNETV2_STAGES = decode_stages("s1_skip s2 s2 s2 s1 s2")

# timm's re-trained models (`efficientnetv2_rw_*`) keep PyTorch's padding and eps; the `tf_` ports of
# Google's weights pad TF "SAME" and keep TF's eps.
_TIMM = ArchConfig(EFFICIENTNETV2_STAGES, Activation.SILU)
_TF = replace(_TIMM, eps=TF_EPS, tf_same=True)

ARCHITECTURES = {
    "tf_efficientnetv2_b0": _TF,
    "tf_efficientnetv2_b1": _TF,
    "tf_efficientnetv2_s": _TF,
    "efficientnetv2_rw_t": _TIMM,
}

FAMILY = Family(
    name="efficientnetv2",
    summary="EfficientNetV2 B0/B1/S and rw-T: fused-MBConv early stages, inverted residuals with SE later",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
