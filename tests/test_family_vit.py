"""ViT / DeiT: parity with timm for every served variant, heads from the config, refusals before weights load."""

from __future__ import annotations

import json

import pytest
import torch

from support import (
    TIE_MARGIN,
    check_parity,
    forbid_weight_reads,
    load_timm,
    random_pixels,
    relative_error,
    rewritten_checkpoint,
    trtmc_module,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.vit import FAMILY, derive_layout
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "vit_tiny_patch16_224"


def test_tiny_matches_timm_in_fp32_and_agrees_in_fp16_and_bf16(timm_checkpoint, record_property):
    report = check_parity(timm_checkpoint(SMALLEST))
    record_property("parity", report)
    assert report["fp32_rel_err"] <= 1e-4, report
    for precision in ("fp16", "bf16"):
        result = report[precision]
        assert result["finite"] and result["kl"] < 1e-3, (precision, result)
        # Random weights leave near-ties among the logits; only those may flip.
        assert all(m < TIE_MARGIN[precision] for m in result["flip_margins"]), (precision, result)


# vit_base (86M parameters) is the slowest of the file; at batch 1 it stays within seconds.
@pytest.mark.parametrize("arch", ["vit_small_patch16_224", "deit_small_patch16_224", "vit_base_patch16_224"])
def test_variant_matches_timm_in_fp32(timm_checkpoint, arch, record_property):
    folder = timm_checkpoint(arch)
    x = random_pixels(folder, batch=1)
    with torch.no_grad():
        error = relative_error(trtmc_module(folder)(x), load_timm(folder)(x))
    record_property("fp32_rel_err", error)
    assert error <= 1e-4


def test_heads_come_from_the_config_and_the_rest_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    ckpt = Checkpoint(timm_checkpoint("deit_small_patch16_224"))
    layout = derive_layout(ckpt, FAMILY.architectures["deit_small_patch16_224"])
    assert (layout.width, layout.depth, layout.patch, layout.hidden, layout.tokens) == (384, 12, 16, 1536, 197)
    assert (layout.heads, layout.head_dim) == (6, 64)


def test_attention_splits_into_the_configured_heads(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)))
    assert graph.node("blocks.0.attn.scores").type.shape == (1, 3, 197, 197)
    assert graph.node("blocks.0.attn.merge_heads#2").type.shape == (1, 197, 192)
    assert graph.node("pool.flatten").type.shape == (1, 192)  # only the class token reaches the final norm


def test_fp16_keeps_attention_products_softmax_and_norms_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    for name in ("blocks.0.attn.scores", "blocks.0.attn.softmax", "blocks.0.attn.mix", "blocks.0.norm1"):
        assert typed[name] is DType.F32, name
    assert typed["blocks.0.attn.qkv"] is DType.F16 and typed["blocks.0.mlp.fc1"] is DType.F16


def test_bf16_graph_has_no_fp32_or_fp16_convolution_or_matmul(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "bf16")
    typed = assign_precision(graph, PrecisionPolicy("bf16"))
    math = [n for n in typed.nodes if n.kind in (OpKind.CONV2D, OpKind.MATMUL, OpKind.LINEAR)]
    assert math and all(n.type.dtype is DType.BF16 for n in math)


def test_mis_shaped_qkv_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_a_head(state):
        state["blocks.3.attn.qkv.weight"] = state["blocks.3.attn.qkv.weight"][:-64]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", drop_a_head)
    forbid_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"blocks\.3\.attn\.qkv\.weight.*\(512, 192\)"):
        build_graph(Checkpoint(folder))


def test_other_input_size_is_refused_without_resampling_pos_embed(timm_checkpoint, tmp_path, monkeypatch):
    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "384", lambda state: None)
    config = json.loads((folder / "config.json").read_text())
    config["pretrained_cfg"]["input_size"] = [3, 384, 384]
    (folder / "config.json").write_text(json.dumps(config))
    forbid_weight_reads(monkeypatch)
    with pytest.raises(UnsupportedModel, match=r"pos_embed \(1, 197, 192\) has 197 positions.*576 patches"):
        build_graph(Checkpoint(folder))


def test_layer_scale_tensors_are_refused_rather_than_ignored(timm_checkpoint, tmp_path, monkeypatch):
    def add_layer_scale(state):
        state["blocks.0.ls1.gamma"] = torch.ones(192)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "ls", add_layer_scale)
    forbid_weight_reads(monkeypatch)
    with pytest.raises(UnsupportedModel, match=r"blocks\.0\.ls1\.gamma"):
        build_graph(Checkpoint(folder))
