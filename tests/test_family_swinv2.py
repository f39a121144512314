"""Swin V2: widths and heads from the tensors, windows from the config clamped to each grid, the continuous
position bias and clamped logit scale timm computes, one attention op per block, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from support import (
    assert_refused_before_weights_load,
    forbid_weight_reads,
    fp32_relative_error,
    load_timm,
    reconfigured_checkpoint,
    rewritten_checkpoint,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph, swinv2
from trtmc.families.swinv2 import FAMILY, continuous_position_bias, derive_layout
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "swinv2_tiny_window8_256"
WINDOW16 = "swinv2_tiny_window16_256"


def test_widths_and_heads_come_from_the_tensors_and_windows_from_the_config_clamped_to_the_grid(
    timm_checkpoint, monkeypatch
):
    forbid_weight_reads(monkeypatch)
    found = {}
    for arch in (SMALLEST, WINDOW16):
        layout = derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])
        found[arch] = [(s.width, s.depth, s.resolution[0], s.window, s.heads, s.shift) for s in layout.stages]
    assert found == {
        SMALLEST: [
            (96, 2, 64, 8, 3, (4, 4)), (192, 2, 32, 8, 6, (4, 4)),
            (384, 6, 16, 8, 12, (4, 4)), (768, 2, 8, 8, 24, (0, 0)),
        ],
        # A 16x16 window covers the third stage's whole grid and is cut down to the last stage's 8x8 one.
        WINDOW16: [
            (96, 2, 64, 16, 3, (8, 8)), (192, 2, 32, 16, 6, (8, 8)),
            (384, 6, 16, 16, 12, (0, 0)), (768, 2, 8, 8, 24, (0, 0)),
        ],
    }


def test_continuous_position_bias_is_the_one_timms_mlp_computes_at_the_stages_window(timm_checkpoint):
    folder = timm_checkpoint(WINDOW16)
    ckpt, model = Checkpoint(folder), load_timm(folder)
    for stage, window in ((0, 16), (3, 8)):
        attn = model.layers[stage].blocks[1].attn
        with torch.no_grad():
            table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
        tokens = window * window
        expected = 16 * torch.sigmoid(table[attn.relative_position_index.view(-1)].view(tokens, tokens, -1))
        ours = continuous_position_bias(ckpt, f"layers.{stage}.blocks.1.attn", window)
        np.testing.assert_allclose(ours, expected.permute(2, 0, 1).numpy(), rtol=0, atol=1e-5)


def test_each_block_attends_once_over_all_windows_and_heads_with_the_head_scale_on_q(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)))
    for name, windows, heads in (("layers.0.blocks.1.attn", 64, 3), ("layers.3.blocks.0.attn", 1, 24)):
        node = graph.node(name)
        assert node.kind is OpKind.ATTENTION and node.type.shape == (1, windows * heads, 64, 32)
        # Cosine attention: the per-head scale multiplies the normalized q, the op itself scales by 1.
        assert node.attrs.scale == 1.0
        assert graph.weights[node.attrs.bias].shape == (1, windows * heads, 64, 64)
    shifted = graph.weights[graph.node("layers.0.blocks.1.attn").attrs.bias]
    plain = graph.weights[graph.node("layers.0.blocks.0.attn").attrs.bias]
    # 16 * sigmoid keeps the position bias in (0, 16); the shifted block adds the -100 mask on top.
    assert shifted.min() < -80 and 0 < plain.min() and plain.max() < 16


def test_logit_scales_are_clamped_at_100_as_timm_clamps_them(timm_checkpoint, monkeypatch):
    folder = timm_checkpoint(SMALLEST)
    ckpt, stated = Checkpoint(folder), FAMILY.architectures[SMALLEST]
    assert (ckpt.tensor("layers.3.blocks.1.attn.logit_scale") > math.log(100)).any()
    right = fp32_relative_error(folder, FAMILY.build(ckpt, stated))
    monkeypatch.setattr(swinv2, "_MAX_LOGIT_SCALE", math.inf)
    # Measured at batch 1: 5.2e-7 with the clamp, 5.1e-3 without.
    assert fp32_relative_error(folder, FAMILY.build(ckpt, stated)) > 100 * right


def test_fp16_keeps_q_and_k_normalization_and_the_norms_in_fp32_and_attends_in_fp16(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    for name in ("layers.0.blocks.1.attn", "layers.0.blocks.1.attn.qkv", "layers.1.downsample.reduction"):
        assert typed[name] is DType.F16, name
    for name in ("layers.0.blocks.1.attn.q_norm", "layers.0.blocks.1.attn.k_norm", "layers.1.downsample.norm"):
        assert typed[name] is DType.F32, name


def test_input_size_the_windows_do_not_tile_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    # 224 px make a 56x56 grid, then 28x28 after the first merge: timm pads 8x8 windows over it, trtmc does not.
    folder = reconfigured_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "224", input_size=224)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"layers\.1 sees a 28x28 token grid that 8x8"
    )


def test_mis_shaped_logit_scale_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_a_head(state):
        name = "layers.2.blocks.3.attn.logit_scale"
        state[name] = state[name][:-1]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", drop_a_head)
    assert_refused_before_weights_load(folder, monkeypatch, CheckpointError, r"layers\.2\.blocks\.3\.attn\.logit_scale")


def test_swin_v1_tensors_are_refused_rather_than_ignored(timm_checkpoint, tmp_path, monkeypatch):
    # Swin V1's attention learns a table of position biases where V2 runs an MLP over coordinates.
    def add_v1_table(state):
        state["layers.0.blocks.0.attn.relative_position_bias_table"] = torch.zeros(225, 3)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "v1", add_v1_table)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"attn\.relative_position_bias_table")
