"""ViT / DeiT: heads from the config, one attention op per block that fp16 builds run in fp16, refusals
before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import torch

from support import assert_refused_before_weights_load, forbid_weight_reads, reconfigured_checkpoint, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.vit import FAMILY, derive_layout
from trtmc.graph import AttentionAttrs, DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "vit_tiny_patch16_224"


def test_heads_come_from_the_config_and_the_rest_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    ckpt = Checkpoint(timm_checkpoint("deit_small_patch16_224"))
    layout = derive_layout(ckpt, FAMILY.architectures["deit_small_patch16_224"])
    assert (layout.width, layout.depth, layout.patch, layout.hidden, layout.tokens) == (384, 12, 16, 1536, 197)
    assert (layout.heads, layout.head_dim) == (6, 64)


def test_each_block_attends_with_one_attention_op_over_the_configured_heads(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)))
    attention = graph.node("blocks.0.attn")
    assert attention.kind is OpKind.ATTENTION and attention.type.shape == (1, 3, 197, 64)
    assert attention.attrs == AttentionAttrs(scale=64**-0.5, bias=None)  # timm's scale, applied by the op
    assert graph.node("blocks.0.attn.merge_heads#2").type.shape == (1, 197, 192)
    assert graph.node("pool.flatten").type.shape == (1, 192)  # only the class token reaches the final norm
    kinds = {n.kind for n in graph.nodes}
    assert OpKind.SOFTMAX not in kinds and OpKind.MATMUL not in kinds


def test_fp16_runs_attention_in_fp16_and_keeps_the_norms_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    for name in ("blocks.0.attn", "blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc1"):
        assert typed[name] is DType.F16, name
    assert typed["blocks.0.norm1"] is DType.F32 and typed["norm"] is DType.F32


def test_mis_shaped_qkv_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_a_head(state):
        state["blocks.3.attn.qkv.weight"] = state["blocks.3.attn.qkv.weight"][:-64]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", drop_a_head)
    assert_refused_before_weights_load(folder, monkeypatch, CheckpointError, r"blocks\.3\.attn\.qkv\.weight.*\(512, 192\)")


def test_other_input_size_is_refused_without_resampling_pos_embed(timm_checkpoint, tmp_path, monkeypatch):
    folder = reconfigured_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "384", input_size=384)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"pos_embed \(1, 197, 192\) has 197 positions.*576 patches"
    )


def test_layer_scale_tensors_are_refused_rather_than_ignored(timm_checkpoint, tmp_path, monkeypatch):
    def add_layer_scale(state):
        state["blocks.0.ls1.gamma"] = torch.ones(192)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "ls", add_layer_scale)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"blocks\.0\.ls1\.gamma")
