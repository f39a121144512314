"""MobileNetV3 small/large (timm-native and TF port): activations and SE gates, TF padding and eps,
refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

from support import assert_refused_before_weights_load, reconfigured_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.efficientnet import TF_EPS, BlockKind
from trtmc.families.mobilenetv3 import ARCHITECTURES, FAMILY, derive_layout
from trtmc.graph import Activation


def test_early_stages_use_relu_and_se_gates_with_hard_sigmoid(timm_checkpoint):
    ckpt = Checkpoint(timm_checkpoint("mobilenetv3_large_100"))
    layout = derive_layout(ckpt, ARCHITECTURES["mobilenetv3_large_100"])
    acts = {b.prefix.rsplit(".", 1)[0]: b.act for b in layout.blocks}
    assert [acts[f"blocks.{s}"] for s in range(7)] == [Activation.RELU] * 3 + [Activation.HARD_SWISH] * 4
    assert layout.blocks[-1].kind is BlockKind.CONV_BN_ACT and layout.head_width == 1280
    assert [b.prefix for b in layout.blocks if b.stride == 2] == ["blocks.1.0", "blocks.2.0", "blocks.3.0", "blocks.5.0"]
    graph = FAMILY.build(ckpt, ARCHITECTURES["mobilenetv3_large_100"])
    assert graph.node("blocks.2.0.se.act1").attrs.fn is Activation.RELU
    assert graph.node("blocks.2.0.se.gate").attrs.fn is Activation.HARD_SIGMOID
    # The head pools before conv_head, which has a bias and no norm.
    head = graph.node("conv_head")
    assert head.type.shape == (1, 1280, 1, 1) and head.attrs.bias is not None


def test_tf_variant_pads_same_and_uses_eps_1e3(timm_checkpoint):
    tf = ARCHITECTURES["tf_mobilenetv3_large_100"]
    assert tf.eps == TF_EPS and tf.tf_same and not ARCHITECTURES["mobilenetv3_large_100"].tf_same
    graph = FAMILY.build(Checkpoint(timm_checkpoint("tf_mobilenetv3_large_100")), tf)
    assert graph.node("conv_stem").attrs.padding == (0, 0, 1, 1)
    assert graph.node("blocks.2.0.conv_dw").attrs.padding == (1, 1, 2, 2)  # 5x5 stride 2 on 56x56


def test_large_tensors_under_a_small_name_are_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    folder = reconfigured_checkpoint(
        timm_checkpoint("mobilenetv3_large_100"), tmp_path / "mislabelled", architecture="mobilenetv3_small_100"
    )
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"mobilenetv3_small_100: the checkpoint has blocks\.<stage> indices \[0, 1, 2, 3, 4, 5, 6\], but mobilenetv3_small_100 has 6 stages",
    )
