"""MobileNetV4 conv models: universal inverted bottlenecks whose optional depthwise convs and stride come
from the tensors, the head's batch norm, the hybrid models' attention refused before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

from support import assert_refused_before_weights_load, fp32_relative_error, reconfigured_checkpoint
from trtmc.checkpoint import Checkpoint
from trtmc.families import UnsupportedModel
from trtmc.families.efficientnet import BlockKind
from trtmc.families.mobilenetv4 import ARCHITECTURES, FAMILY, derive_layout
from trtmc.graph import Activation

SMALLEST = "mobilenetv4_conv_small_050"


def test_uib_depthwise_convs_and_stride_come_from_the_tensors(timm_checkpoint):
    layout = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), ARCHITECTURES[SMALLEST])
    blocks = {b.prefix: b for b in layout.blocks}

    def steps(prefix):
        return [(s.conv.removeprefix(f"{prefix}."), s.stride, s.act) for s in blocks[prefix].steps]

    # `uir_a5_k5_s2` (ExtraDW): dw_start, then the stride on dw_mid; dw_start has no activation.
    assert steps("blocks.2.0") == [
        ("dw_start.conv", 1, False), ("pw_exp.conv", 1, True), ("dw_mid.conv", 2, True), ("pw_proj.conv", 1, False),
    ]
    # `uir_a0_k3` (IR): no dw_start; `uir_a3_k0` (ConvNeXt-like): no dw_mid.
    assert [name for name, _, _ in steps("blocks.2.1")] == ["pw_exp.conv", "dw_mid.conv", "pw_proj.conv"]
    assert [name for name, _, _ in steps("blocks.2.5")] == ["dw_start.conv", "pw_exp.conv", "pw_proj.conv"]
    assert blocks["blocks.2.5"].kind is BlockKind.UNIVERSAL_INVERTED_RESIDUAL and blocks["blocks.2.5"].skip
    # The conv stages are ConvBnAct blocks, which timm never lets add their input here.
    assert blocks["blocks.0.1"].kind is BlockKind.CONV_BN_ACT and not blocks["blocks.0.1"].skip


def test_head_normalizes_conv_head_and_the_network_runs_on_relu(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    graph = FAMILY.build(Checkpoint(folder), ARCHITECTURES[SMALLEST])
    assert graph.node("conv_head").attrs.bias is None and graph.node("conv_head").type.shape == (1, 1280, 1, 1)
    assert graph.node("norm_head.act").attrs.fn is Activation.RELU
    hard_swish = dataclasses.replace(ARCHITECTURES[SMALLEST], act=Activation.HARD_SWISH)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), hard_swish)) > 1e-2


def test_hybrid_models_attention_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    """The hybrid models add multi-query attention blocks (and layer scale), which trtmc does not build."""
    folder = reconfigured_checkpoint(
        timm_checkpoint("mobilenetv4_hybrid_medium"), tmp_path / "hybrid", architecture="mobilenetv4_conv_medium"
    )
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel,
        r"mobilenetv4_conv_medium: blocks\.2\.4 holds none of the .* weights of the blocks this layout builds, "
        r"but blocks\.2\.4\.attn\.key\.down_conv\.weight",
    )
