"""ViT and its options (DeiT, DeiT III, DINOv2, CLIP): heads and eps from the config, tokens, layer scale
and pre-norm from the tensors, position embeddings resampled as timm resamples them, one attention op
per block that fp16 builds run in fp16, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import pytest
import torch

from support import (
    assert_refused_before_weights_load,
    forbid_weight_reads,
    fp32_relative_error,
    random_pixels,
    reconfigured_checkpoint,
    relative_error,
    rewritten_checkpoint,
    trtmc_module,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.vit import FAMILY, ViTConfig, derive_layout
from trtmc.graph import AttentionAttrs, DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "vit_tiny_patch16_224"


def test_heads_come_from_the_config_and_the_rest_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    ckpt = Checkpoint(timm_checkpoint("deit_small_patch16_224"))
    layout = derive_layout(ckpt, FAMILY.architectures["deit_small_patch16_224"])
    assert (layout.width, layout.depth, layout.patch, layout.hidden, layout.tokens) == (384, 12, 16, 1536, 197)
    assert (layout.heads, layout.head_dim) == (6, 64)
    assert (layout.registers, layout.layer_scale, layout.pre_norm) == (0, False, False)


def test_registers_layer_scale_and_pre_norm_are_read_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    found = {}
    for arch in ("vit_small_patch14_reg4_dinov2", "deit3_small_patch16_224", "vit_xsmall_patch16_clip_224"):
        layout = derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])
        found[arch] = (layout.registers, layout.layer_scale, layout.pre_norm, layout.grid, layout.tokens)
    assert found == {
        "vit_small_patch14_reg4_dinov2": (4, True, False, (37, 37), 1 + 4 + 37 * 37),  # 518 px in 14 px patches
        "deit3_small_patch16_224": (0, True, False, (14, 14), 1 + 196),
        "vit_xsmall_patch16_clip_224": (0, False, True, (14, 14), 1 + 196),
    }


def test_clip_towers_normalize_with_eps_1e5_and_a_wrong_eps_or_head_count_moves_the_logits(timm_checkpoint):
    arch = "vit_xsmall_patch16_clip_224"
    folder = timm_checkpoint(arch)
    stated = FAMILY.architectures[arch]
    assert (stated.num_heads, stated.norm_eps) == (4, 1e-5)
    ckpt = Checkpoint(folder)
    assert fp32_relative_error(folder, FAMILY.build(ckpt, stated)) <= 1e-5
    for wrong in (ViTConfig(num_heads=4, norm_eps=1e-6), ViTConfig(num_heads=8, norm_eps=1e-5)):
        # Measured: eps 1e-6 moves the logits by 4e-3 of the largest, 8 heads by 3e-3.
        assert fp32_relative_error(folder, FAMILY.build(ckpt, wrong)) > 1e-3, wrong


@pytest.mark.parametrize("arch", ["deit3_small_patch16_224", "vit_small_patch14_reg4_dinov2"])
def test_position_embeddings_that_do_not_cover_the_stated_tokens_are_refused(arch, timm_checkpoint, monkeypatch):
    # Both add position embeddings to the patches only (no_embed_class); stated otherwise, the class
    # token's position would be missing from pos_embed, whose patch positions then make no grid.
    forbid_weight_reads(monkeypatch)
    ckpt = Checkpoint(timm_checkpoint(arch))
    stated = FAMILY.architectures[arch]
    assert stated.no_embed_class
    with pytest.raises(CheckpointError, match=r"pos_embed \(1, \d+, 384\) holds \d+ patch positions after [15] prefix"):
        derive_layout(ckpt, ViTConfig(num_heads=stated.num_heads, no_embed_class=False))


@pytest.mark.parametrize(
    "arch, size, trained",
    [("vit_small_patch14_reg4_dinov2", 224, 37), ("vit_tiny_patch16_224", 384, 14)],
)
def test_position_embeddings_are_resampled_to_the_input_size_as_timm_loads_them(arch, size, trained, timm_checkpoint, tmp_path):
    """A checkpoint whose config asks for another input size than its pos_embed was trained at: timm
    resamples the embeddings when it loads the weights into a model of that size, and so does the build
    (DINOv2's 37x37 down to 16x16, antialiased; ViT-Ti's 14x14 up to 24x24)."""
    from safetensors.torch import load_file
    from timm import create_model
    from timm.models.vision_transformer import checkpoint_filter_fn

    folder = reconfigured_checkpoint(timm_checkpoint(arch), tmp_path / "resized", input_size=size)
    layout = derive_layout(Checkpoint(folder), FAMILY.architectures[arch])
    assert layout.trained_grid == (trained, trained) and layout.grid == (size // layout.patch,) * 2
    reference = create_model(arch, img_size=size, num_classes=1000).eval()
    reference.load_state_dict(checkpoint_filter_fn(load_file(str(folder / "model.safetensors")), reference))
    x = random_pixels(folder, batch=1)
    with torch.no_grad():
        error = relative_error(trtmc_module(folder)(x), reference(x))
    assert error <= 1e-4, error


def test_each_block_attends_with_one_attention_op_over_the_configured_heads(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)))
    attention = graph.node("blocks.0.attn")
    assert attention.kind is OpKind.ATTENTION and attention.type.shape == (1, 3, 197, 64)
    assert attention.attrs == AttentionAttrs(scale=64**-0.5, bias=None)  # timm's scale, applied by the op
    assert graph.node("blocks.0.attn.merge_heads#2").type.shape == (1, 197, 192)
    assert graph.node("pool.flatten").type.shape == (1, 192)  # only the class token reaches the final norm
    kinds = {n.kind for n in graph.nodes}
    assert OpKind.SOFTMAX not in kinds and OpKind.MATMUL not in kinds


def test_fp16_runs_attention_and_layer_scale_in_fp16_and_keeps_the_norms_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint("deit3_small_patch16_224")), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    for name in ("blocks.0.attn", "blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.ls1", "blocks.0.mlp.fc1"):
        assert typed[name] is DType.F16, name
    assert typed["blocks.0.norm1"] is DType.F32 and typed["norm"] is DType.F32


def test_mis_shaped_qkv_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_a_head(state):
        state["blocks.3.attn.qkv.weight"] = state["blocks.3.attn.qkv.weight"][:-64]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", drop_a_head)
    assert_refused_before_weights_load(folder, monkeypatch, CheckpointError, r"blocks\.3\.attn\.qkv\.weight.*\(512, 192\)")


def test_layer_scale_in_some_blocks_only_is_refused_by_name(timm_checkpoint, tmp_path, monkeypatch):
    folder = rewritten_checkpoint(
        timm_checkpoint("deit3_small_patch16_224"), tmp_path / "ls", lambda state: state.pop("blocks.5.ls2.gamma")
    )
    assert_refused_before_weights_load(folder, monkeypatch, CheckpointError, r"tensor 'blocks\.5\.ls2\.gamma' is missing")


def test_distillation_token_and_head_are_refused_rather_than_ignored(timm_checkpoint, tmp_path, monkeypatch):
    # DeiT's distilled variants add a token and a second head, which this layout has no place for.
    def add_distillation(state):
        state["dist_token"] = torch.zeros(1, 1, 192)
        state["head_dist.weight"] = torch.zeros(1000, 192)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "distilled", add_distillation)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"dist_token .*head_dist\.weight")
