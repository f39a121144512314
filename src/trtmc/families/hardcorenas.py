"""HardCoReNAS (https://arxiv.org/abs/2102.11646): networks searched for a latency target inside
MobileNetV3-Large's space, each stage choosing its blocks' kernel, expansion and squeeze-excite. It reads
what mobilenetv3.py reads: `conv_stem`/`bn1`, every `blocks.<stage>.<block>`, `conv_head` with its bias and
`classifier`.
"""

from __future__ import annotations

from . import Family, mobilenetv3
from .mobilenetv3 import derive_layout, emit

# timm's hardcorenas arch_defs keep MobileNetV3-Large's seven stages, strides, ReLU (`nre`) early
# stages and hard-swish later, and build them with MobileNetV3's ReLU/hard-sigmoid squeeze-excite;
# what a variant chose (kernels, expansions, where SE sits) is in its tensors.
_HARDCORENAS = mobilenetv3.ARCHITECTURES["mobilenetv3_large_100"]

ARCHITECTURES = {
    "hardcorenas_a": _HARDCORENAS,
    "hardcorenas_b": _HARDCORENAS,
    "hardcorenas_c": _HARDCORENAS,
}

FAMILY = Family(
    name="hardcorenas",
    summary="HardCoReNAS A-C: latency-searched MobileNetV3-Large blocks, SE where the search put it",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
