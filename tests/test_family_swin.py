"""Swin: windows, heads and shifts from the tensors, the bias and mask timm computes, one attention op
per block with the batch first, eps from the config, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import numpy as np
import torch

from support import (
    assert_refused_before_weights_load,
    forbid_weight_reads,
    fp32_relative_error,
    reconfigured_checkpoint,
    rewritten_checkpoint,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.swin import FAMILY, SwinConfig, derive_layout, relative_position_bias, shifted_window_mask
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "swin_tiny_patch4_window7_224"


def test_windows_heads_and_shifts_come_from_the_tensors_and_the_input_size(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    found = {}
    for arch in (SMALLEST, "swin_s3_tiny_224"):
        layout = derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])
        found[arch] = [(s.width, s.depth, s.resolution[0], s.window, s.heads, s.shift) for s in layout.stages]
    assert found == {
        # The last stage's 7x7 grid is one window: nothing to shift.
        SMALLEST: [(96, 2, 56, 7, 3, (3, 3)), (192, 2, 28, 7, 6, (3, 3)), (384, 6, 14, 7, 12, (3, 3)), (768, 2, 7, 7, 24, (0, 0))],
        # Swin-S3's third stage attends over its whole 14x14 grid at once.
        "swin_s3_tiny_224": [(96, 2, 56, 7, 3, (3, 3)), (192, 2, 28, 7, 6, (3, 3)), (384, 6, 14, 14, 12, (0, 0)), (768, 2, 7, 7, 24, (0, 0))],
    }


def test_relative_position_bias_and_shifted_window_mask_are_timms():
    from timm import create_model
    from timm.models.swin_transformer import get_relative_position_index

    table = np.random.default_rng(0).standard_normal((13 * 13, 3)).astype(np.float32)
    index = get_relative_position_index(7, 7).numpy()
    np.testing.assert_array_equal(relative_position_bias(table, 7), table[index].transpose(2, 0, 1))
    timm_model = create_model(SMALLEST, pretrained=False)
    for stage, resolution in ((0, 56), (2, 14)):
        mask = timm_model.layers[stage].blocks[1].attn_mask.numpy()
        np.testing.assert_array_equal(shifted_window_mask((resolution,) * 2, 7, (3, 3)), mask)


def test_each_block_attends_once_over_all_windows_and_heads_with_the_batch_first(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)))
    for name, windows, heads in (("layers.0.blocks.1.attn", 64, 3), ("layers.3.blocks.0.attn", 1, 24)):
        node = graph.node(name)
        assert node.kind is OpKind.ATTENTION and node.type.shape == (1, windows * heads, 49, 32)
        assert graph.weights[node.attrs.bias].shape == (1, windows * heads, 49, 49)
    # The shifted block's bias holds the mask on top of the relative position bias; the unshifted one's does not.
    shifted = graph.weights[graph.node("layers.0.blocks.1.attn").attrs.bias]
    plain = graph.weights[graph.node("layers.0.blocks.0.attn").attrs.bias]
    assert shifted.min() < -90 and plain.min() > -10
    kinds = {n.kind for n in graph.nodes}
    assert OpKind.SOFTMAX not in kinds and OpKind.MATMUL not in kinds


def test_norms_use_torchs_eps_1e5_and_a_wrong_eps_moves_the_logits(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    ckpt, stated = Checkpoint(folder), FAMILY.architectures[SMALLEST]
    assert stated.norm_eps == 1e-5
    right = fp32_relative_error(folder, FAMILY.build(ckpt, stated), batch=2)
    # Measured at batch 2: 4.2e-7 with the stated eps, 1.7e-5 with 1e-6.
    assert fp32_relative_error(folder, FAMILY.build(ckpt, SwinConfig(norm_eps=1e-6)), batch=2) > 10 * right


def test_fp16_runs_attention_in_fp16_and_keeps_the_norms_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    for name in ("layers.0.blocks.1.attn", "layers.0.blocks.1.attn.qkv", "layers.1.downsample.reduction"):
        assert typed[name] is DType.F16, name
    for name in ("layers.0.blocks.1.norm1", "layers.1.downsample.norm", "norm"):
        assert typed[name] is DType.F32, name


def test_mis_shaped_bias_table_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_a_head(state):
        table = "layers.2.blocks.3.attn.relative_position_bias_table"
        state[table] = state[table][:, :-1]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", drop_a_head)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"layers\.2\.blocks\.3\.attn\.relative_position_bias_table.*\(169, 11\)"
    )


def test_input_size_the_windows_do_not_tile_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    # 192 px make a 48x48 grid: timm pads 7x7 windows over it, trtmc does not.
    folder = reconfigured_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "192", input_size=192)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"48x48 token grid that 7x7 windows")


def test_swin_v2_tensors_are_refused_rather_than_ignored(timm_checkpoint, tmp_path, monkeypatch):
    # Swin V2's cosine attention carries a logit scale and a continuous position bias MLP.
    def add_v2_attention(state):
        state["layers.0.blocks.0.attn.logit_scale"] = torch.zeros(3, 1, 1)
        state["layers.0.blocks.0.attn.cpb_mlp.0.weight"] = torch.zeros(512, 2)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "v2", add_v2_attention)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"attn\.cpb_mlp\.0\.weight.*attn\.logit_scale")
