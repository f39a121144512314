"""EfficientNetV2: fused-MBConv blocks and the first stage's skipping ConvBnAct blocks, TF padding and
eps, a global-context variant refused before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

from support import assert_refused_before_weights_load, fp32_relative_error, reconfigured_checkpoint
from trtmc.checkpoint import Checkpoint
from trtmc.families import UnsupportedModel
from trtmc.families.efficientnet import TF_EPS, TIMM_EPS, BlockKind, decode_stages
from trtmc.families.efficientnetv2 import ARCHITECTURES, FAMILY, derive_layout


def test_fused_blocks_stride_on_their_expansion_conv(timm_checkpoint):
    layout = derive_layout(Checkpoint(timm_checkpoint("tf_efficientnetv2_b1")), ARCHITECTURES["tf_efficientnetv2_b1"])
    kinds = {b.prefix.rsplit(".", 1)[0]: b.kind for b in layout.blocks}
    assert list(kinds.values()) == [BlockKind.CONV_BN_ACT] + [BlockKind.EDGE_RESIDUAL] * 2 + [BlockKind.INVERTED_RESIDUAL] * 3
    fused = next(b for b in layout.blocks if b.prefix == "blocks.1.0")
    assert [(s.conv, s.stride, s.act) for s in fused.steps] == [
        ("blocks.1.0.conv_exp", 2, True), ("blocks.1.0.conv_pwl", 1, False),
    ]
    assert not any(b.se for b in layout.blocks if b.kind is BlockKind.EDGE_RESIDUAL)
    assert all(b.se for b in layout.blocks if b.kind is BlockKind.INVERTED_RESIDUAL)


def test_first_stage_conv_blocks_add_their_input_because_the_arch_def_says_skip(timm_checkpoint):
    """timm's ConvBnAct adds its input only when told (`skip`); without the token the logits move."""
    arch = "tf_efficientnetv2_b1"
    folder = timm_checkpoint(arch)
    layout = derive_layout(Checkpoint(folder), ARCHITECTURES[arch])
    # blocks.0.0 maps the stem's 32 channels to 16, blocks.0.1 keeps 16.
    assert [b.skip for b in layout.blocks[:2]] == [False, True]
    unskipped = dataclasses.replace(ARCHITECTURES[arch], stages=decode_stages("s1 s2 s2 s2 s1 s2"))
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), unskipped)) > 1e-2


def test_tf_variant_pads_same_and_uses_eps_1e3(timm_checkpoint):
    arch = "tf_efficientnetv2_b0"
    tf, timm_own = ARCHITECTURES[arch], ARCHITECTURES["efficientnetv2_rw_t"]
    assert (tf.eps, tf.tf_same) == (TF_EPS, True) and (timm_own.eps, timm_own.tf_same) == (TIMM_EPS, False)
    folder = timm_checkpoint(arch)
    graph = FAMILY.build(Checkpoint(folder), tf)
    # 192 -> 96 with a 3x3 stride-2 kernel: TF puts the one pixel of padding after.
    assert graph.node("conv_stem").attrs.padding == (0, 0, 1, 1)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), timm_own)) > 1e-3


def test_global_context_variant_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    """gc_efficientnetv2_rw_t swaps squeeze-excite for global-context attention: building it as the
    plain model would drop that attention."""
    folder = reconfigured_checkpoint(
        timm_checkpoint("gc_efficientnetv2_rw_t"), tmp_path / "gc", architecture="efficientnetv2_rw_t"
    )
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel,
        r"efficientnetv2_rw_t: the checkpoint holds tensors this layout does not use: blocks\.3\.0\.se\.conv_attn\.bias",
    )
