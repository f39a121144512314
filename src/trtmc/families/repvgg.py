"""RepVGG classifiers as timm builds them (Ding et al., "RepVGG: Making VGG-style ConvNets Great Again",
https://arxiv.org/abs/2101.03697): a plain stack of 3x3 convolutions and ReLUs, trained with a 1x1 and an
identity branch beside each 3x3 and folded into it at build time. Reads the blocks `stem` and
`stages.S.B`, each as `conv_kxk.{conv,bn}`, `conv_1x1.{conv,bn}` and, where width and resolution are
kept, `identity`, or as the folded `reparam_conv`; and the classifier `head.fc`.
"""

from __future__ import annotations

from functools import partial

from . import Family, _reparam
from ._layout import LayoutReader
from ._reparam import ArchConfig

# RepVggBlock always builds both convolution branches.
_BRANCHES = ("conv_kxk", "conv_1x1")


def _branch_names(read: LayoutReader, prefix: str) -> tuple[str, ...]:
    return tuple(name for name in _BRANCHES if f"{prefix}.{name}.conv.weight" in read)


# The A and B sizes differ in depth and width, both in the tensors; the grouped (b1g4, ...) sizes
# would read the same way, repvgg_d2se adds squeeze-excite, which this layout refuses.
_TIMM_REPVGG = ArchConfig()

FAMILY = Family(
    name="repvgg",
    summary="RepVGG A0/A1/B0 (timm byobnet.py): 3x3 + 1x1 + identity branches folded into one 3x3 at build time",
    architectures={
        "repvgg_a0": _TIMM_REPVGG,
        "repvgg_a1": _TIMM_REPVGG,
        "repvgg_b0": _TIMM_REPVGG,
    },
    derive_layout=partial(_reparam.derive_layout, branch_names=_branch_names),
    emit=_reparam.emit,
)
