"""MobileNetV3 (https://arxiv.org/abs/1905.02244): timm's EfficientNet blocks with hard-swish, ReLU in
the early stages and hard-sigmoid squeeze-excite, then a pooled 1x1 `conv_head`, the "efficient head"
that timm's MobileNetV3 class also gives HardCoReNAS, LCNet and MobileNetV4, whose families share it.
It reads `conv_stem`/`bn1`, every `blocks.<stage>.<block>` (efficientnet.py's blocks), `conv_head` with
its bias or, where it has none, `norm_head`, and `classifier`.
"""

from __future__ import annotations

from dataclasses import replace

from ..checkpoint import Checkpoint
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, efficientnet
from ._parts import conv, conv_norm_act, linear
from .efficientnet import TF_EPS, ArchConfig, Layout, decode_stages, emit_block, emit_stem

# timm's MobileNetV3(head_norm=True) (MobileNetV4) follows conv_head with this batch norm and no bias;
# otherwise conv_head has a bias and no norm.
HEAD_NORM = "norm_head"


def derive_layout(ckpt: Checkpoint, arch: ArchConfig) -> Layout:
    head_norm = HEAD_NORM if f"{HEAD_NORM}.weight" in ckpt else None
    return efficientnet.derive_layout(ckpt, arch, head_norm=head_norm)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ArchConfig) -> Tensor:
    x = emit_stem(g, ckpt, arch)
    for block in layout.blocks:
        x = emit_block(g, x, ckpt, block, arch)
    # MobileNetV3 pools first and runs conv_head on the 1x1 map (timm's forward_head).
    x = g.global_avg_pool(x, "global_pool", keepdim=True)
    if layout.head_norm is None:
        x = conv(g, x, ckpt, "conv_head")
        x = g.activation(x, arch.act, "act2")
    else:
        x = conv_norm_act(g, x, ckpt, "conv_head", layout.head_norm, arch.act, eps=arch.eps, tf_same=arch.tf_same)
    x = g.flatten(x, "flatten")
    return linear(g, x, ckpt, "classifier")


# Stage tables from timm's _gen_mobilenet_v3 arch_def (grammar: efficientnet.decode_stages): where
# each stage's first block strides, and the early stages its `nre` token runs on ReLU instead of
# hard-swish. The last stage is the 1x1 ConvBnAct (`cn`) before pooling.
_LARGE = decode_stages("s1_nre s2_nre s2_nre s2 s1 s2 s1")
_SMALL = decode_stages("s2_nre s2_nre s2 s1 s2 s1")

# timm's MobileNetV3 squeeze-excite forces ReLU inside and gates with hard-sigmoid, whatever the
# block's own activation.
_TIMM_SMALL = ArchConfig(_SMALL, Activation.HARD_SWISH, se_act=Activation.RELU, se_gate=Activation.HARD_SIGMOID)
_TIMM_LARGE = replace(_TIMM_SMALL, stages=_LARGE)

ARCHITECTURES = {
    "mobilenetv3_small_100": _TIMM_SMALL,
    "mobilenetv3_large_100": _TIMM_LARGE,
    # The TF port pads "SAME" and keeps TF's batch-norm eps.
    "tf_mobilenetv3_large_100": replace(_TIMM_LARGE, eps=TF_EPS, tf_same=True),
}

FAMILY = Family(
    name="mobilenetv3",
    summary="MobileNetV3 small/large: hard-swish inverted residuals, hard-sigmoid SE, pooled conv head",
    architectures=ARCHITECTURES,
    derive_layout=derive_layout,
    emit=emit,
)
