"""PP-LCNet: `dsa` blocks (an activation after the pointwise conv, no block adds its input), MobileNetV3's
squeeze-excite and pooled head, a head without its bias refused before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.efficientnet import BlockKind, decode_stages
from trtmc.families.lcnet import ARCHITECTURES, FAMILY, derive_layout
from trtmc.graph import Activation

SMALLEST = "lcnet_050"


def test_dsa_blocks_activate_after_the_pointwise_conv_and_never_add_their_input(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    layout = derive_layout(Checkpoint(folder), ARCHITECTURES[SMALLEST])
    assert all(b.kind is BlockKind.DEPTHWISE_SEPARABLE and all(s.act for s in b.steps) for b in layout.blocks)
    # blocks.4.* keep 128 channels at stride 1, where a plain `ds` block would add its input.
    same_shape = [b.prefix for b in layout.blocks if b.stride == 1 and b.in_width == b.out_width]
    assert "blocks.4.0" in same_shape and not any(b.skip for b in layout.blocks)
    graph = FAMILY.build(Checkpoint(folder), ARCHITECTURES[SMALLEST])
    assert graph.node("blocks.4.0.bn2.act").attrs.fn is Activation.HARD_SWISH
    plain_ds = dataclasses.replace(ARCHITECTURES[SMALLEST], stages=decode_stages("s1 s2 s2 s2 s1 s2"))
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), plain_ds)) > 1e-2


def test_se_gates_with_hard_sigmoid_and_the_head_pools_before_conv_head(timm_checkpoint):
    graph = FAMILY.build(Checkpoint(timm_checkpoint(SMALLEST)), ARCHITECTURES[SMALLEST])
    assert graph.node("blocks.5.0.se.act1").attrs.fn is Activation.RELU
    assert graph.node("blocks.5.0.se.gate").attrs.fn is Activation.HARD_SIGMOID
    head = graph.node("conv_head")
    assert head.type.shape == (1, 1280, 1, 1) and head.attrs.bias is not None
    assert graph.node("act2").attrs.fn is Activation.HARD_SWISH


def test_a_head_without_its_bias_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "l", lambda state: state.pop("conv_head.bias"))
    assert_refused_before_weights_load(folder, monkeypatch, CheckpointError, r"tensor 'conv_head\.bias' is missing for lcnet_050")
