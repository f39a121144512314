"""MobileOne classifiers as timm builds them (Vasu et al., "MobileOne: An Improved One millisecond Mobile
Backbone", https://arxiv.org/abs/2206.04040): depthwise 3x3 and pointwise 1x1 blocks, each trained as
several parallel branches and folded into one convolution at build time. Reads the blocks `stem` and
`stages.S.B`, each as `conv_kxk.N.{conv,bn}`, an optional `conv_scale.{conv,bn}` and, where width and
resolution are kept, `identity`, or as the folded `reparam_conv`; and the classifier `head.fc`.
"""

from __future__ import annotations

import re
from functools import partial

from . import Family, _reparam
from ._layout import LayoutReader, indexed_blocks
from ._reparam import ArchConfig

# MobileOneBlock's 1x1 "scale" branch, which it builds beside kernels larger than 1x1.
_SCALE = "conv_scale"


def _branch_names(read: LayoutReader, prefix: str) -> tuple[str, ...]:
    """conv_kxk.0 .. conv_kxk.N-1 (num_conv_branches: 4 in mobileone_s0, 1 in the others), conv_scale."""
    kxk = indexed_blocks(read.ckpt, rf"^{re.escape(prefix)}\.conv_kxk\.(\d+)\.conv\.weight$")
    scale = (_SCALE,) if f"{prefix}.{_SCALE}.conv.weight" in read else ()
    return tuple(f"conv_kxk.{i}" for (i,) in kxk) + scale


# s0 and s1 differ in widths and branch count, both in the tensors; mobileone_s4 adds squeeze-excite,
# which this layout refuses.
_TIMM_MOBILEONE = ArchConfig()

FAMILY = Family(
    name="mobileone",
    summary="MobileOne S0/S1 (timm byobnet.py): depthwise/pointwise blocks, branches folded into one conv",
    architectures={
        "mobileone_s0": _TIMM_MOBILEONE,
        "mobileone_s1": _TIMM_MOBILEONE,
    },
    derive_layout=partial(_reparam.derive_layout, branch_names=_branch_names),
    emit=_reparam.emit,
)
