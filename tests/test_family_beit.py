"""BEiT: heads from the bias table, the bias timm gathers, q and v biases around a zero k bias, eps from
the config, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from support import (
    assert_refused_before_weights_load,
    forbid_weight_reads,
    fp32_relative_error,
    reconfigured_checkpoint,
    rewritten_checkpoint,
)
from trtmc.checkpoint import Checkpoint
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.beit import FAMILY, derive_layout, relative_position_bias
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "beit_base_patch16_224"


def test_heads_come_from_the_bias_table_and_the_rest_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    for arch in FAMILY.architectures:
        layout = derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])
        assert (layout.width, layout.depth, layout.patch, layout.grid, layout.heads, layout.hidden) == (
            768, 12, 16, (14, 14), 12, 3072
        ), arch
        assert layout.layer_scale and layout.tokens == 197


def test_relative_position_bias_is_gathered_as_timm_numbers_the_pairs():
    from timm.models.beit import gen_relative_position_index

    table = np.random.default_rng(0).standard_normal((27 * 27 + 3, 12)).astype(np.float32)
    index = gen_relative_position_index((14, 14)).numpy()
    np.testing.assert_array_equal(relative_position_bias(table, (14, 14)), table[index].transpose(2, 0, 1)[None])


def test_attention_has_q_and_v_biases_around_a_zero_k_bias_and_the_block_bias(timm_checkpoint):
    ckpt = Checkpoint(timm_checkpoint(SMALLEST))
    _, graph = build_graph(ckpt)
    bias = graph.weights[graph.node("blocks.4.attn.qkv").attrs.bias]
    np.testing.assert_array_equal(bias[:768], ckpt.tensor("blocks.4.attn.q_bias"))
    assert not bias[768:1536].any()
    np.testing.assert_array_equal(bias[1536:], ckpt.tensor("blocks.4.attn.v_bias"))
    attention = graph.node("blocks.4.attn")
    assert attention.kind is OpKind.ATTENTION and attention.type.shape == (1, 12, 197, 64)
    assert graph.weights[attention.attrs.bias].shape == (1, 12, 197, 197)
    assert graph.node("pool").type.shape == (1, 768)  # the mean of the 196 patches, without the class token


def test_norms_use_eps_1e6_and_a_wrong_eps_moves_the_logits(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    ckpt, stated = Checkpoint(folder), FAMILY.architectures[SMALLEST]
    assert stated.norm_eps == 1e-6
    right = fp32_relative_error(folder, FAMILY.build(ckpt, stated))
    assert fp32_relative_error(folder, FAMILY.build(ckpt, replace(stated, norm_eps=1e-5))) > 10 * right


def test_fp16_runs_attention_and_layer_scale_in_fp16_and_keeps_the_norms_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    for name in ("blocks.0.attn", "blocks.0.attn.qkv", "blocks.0.gamma_1", "blocks.0.mlp.fc1"):
        assert typed[name] is DType.F16, name
    assert typed["blocks.0.norm1"] is DType.F32 and typed["fc_norm"] is DType.F32


def test_other_input_size_is_refused_without_resizing_the_bias_tables(timm_checkpoint, tmp_path, monkeypatch):
    folder = reconfigured_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "384", input_size=384)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"relative_position_bias_table has 732 rows, but a 24x24 patch grid takes 2212"
    )


def test_shared_bias_and_absolute_position_embeddings_are_refused_rather_than_ignored(timm_checkpoint, tmp_path, monkeypatch):
    # BEiT variants built with use_abs_pos_emb or use_shared_rel_pos_bias carry tensors this layout has no place for.
    def add_variant_tensors(state):
        state["pos_embed"] = torch.zeros(1, 197, 768)
        state["rel_pos_bias.relative_position_bias_table"] = torch.zeros(732, 12)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "variant", add_variant_tensors)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"pos_embed .*rel_pos_bias\.relative_position_bias_table"
    )
