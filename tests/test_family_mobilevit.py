"""MobileViT: block kinds and depths from the tensors, the head count and patch size they cannot say, one
attention op for every patch position, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import torch

from support import (
    DispatchedOps,
    assert_refused_before_weights_load,
    forbid_weight_reads,
    fp32_relative_error,
    reconfigured_checkpoint,
    rewritten_checkpoint,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.backends.torch_lowering import to_fx
from trtmc.families.mobilevit import FAMILY, InvertedResidual, MobileViTBlock, derive_layout
from trtmc.graph import OpKind

SMALLEST = "mobilevit_xxs"


def test_layout_reads_block_kinds_residuals_and_transformer_depths_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    layout = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    rows = [
        (b.prefix, b.stride, b.residual) if isinstance(b, InvertedResidual) else (b.prefix, "mobilevit", b.depth)
        for b in layout.blocks
    ]
    assert rows == [
        ("stages.0.0", 1, True),  # 16 -> 16 channels at stride 1: the only first block with a residual sum
        ("stages.1.0", 2, False), ("stages.1.1", 1, True), ("stages.1.2", 1, True),
        ("stages.2.0", 2, False), ("stages.2.1", "mobilevit", 2),
        ("stages.3.0", 2, False), ("stages.3.1", "mobilevit", 4),
        ("stages.4.0", 2, False), ("stages.4.1", "mobilevit", 3),
    ]


def test_one_attention_op_serves_every_patch_position(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)))
    attention = graph.node("stages.2.1.transformer.0.attn")
    # stage 2 of a 256px input: a 32x32 map of 64-wide features, 2x2 patches -> 4 positions x 4 heads
    # attending over 256 patches with 16-wide heads.
    assert attention.kind is OpKind.ATTENTION and attention.type.shape == (1, 16, 256, 16)
    assert attention.attrs.scale == 16**-0.5
    assert graph.node("stages.2.1.fold#3").type.shape == (1, 64, 32, 32)


def test_heads_are_padded_to_a_multiple_of_8_and_keep_their_own_scale(timm_checkpoint):
    # Stage 3's 80-wide tokens make 20-wide heads; attention kernels read 24 (the padding is zero weights,
    # so timm's logits hold: test_parity_every_architecture.py), the scale stays 20 ** -0.5.
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)))
    attention = graph.node("stages.3.1.transformer.0.attn")
    assert attention.type.shape == (1, 16, 64, 24) and attention.attrs.scale == 20**-0.5
    assert graph.node("stages.3.1.transformer.0.attn.proj").type.shape == (1, 64, 4, 80)


def test_attention_reads_its_heads_and_writes_its_output_as_views_of_the_tokens(timm_checkpoint):
    # Only the unfold and the fold of each MobileViT block copy; the positions joining the heads axis cost
    # none (two copies per attention before the token layout put the positions inside the patches).
    ckpt = Checkpoint(timm_checkpoint(SMALLEST))
    _, graph = build_graph(ckpt)
    blocks = [b for b in derive_layout(ckpt, FAMILY.architectures[SMALLEST]).blocks if isinstance(b, MobileViTBlock)]
    module = to_fx(graph).eval()
    with torch.no_grad(), DispatchedOps() as ops:
        module(torch.rand(1, *graph.inputs[0].type.shape[1:]))
    assert (len(blocks), len(ops.named("aten::clone"))) == (3, 2 * 3)


def _sharpen_attention(state):
    # timm initializes the transformers' qkv with std 0.01: random scores stay near 0.03, every head
    # attends uniformly, and neither the head count nor the q/k split would move the logits. Ten times
    # larger weights give scores of order 1.
    for name in [n for n in state if n.endswith("attn.qkv.weight")]:
        state[name] = 10 * state[name]


def test_four_heads_and_2x2_patches_are_timms_and_others_would_move_the_logits(timm_checkpoint, tmp_path):
    """No tensor holds MobileVitBlock's head count or patch size; timm builds every model with 4 and 2x2."""
    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "sharp", _sharpen_attention)
    arch = FAMILY.architectures[SMALLEST]
    assert (arch.heads, arch.patch) == (4, 2)
    assert fp32_relative_error(folder) <= 1e-4
    for other in (dataclasses.replace(arch, heads=2), dataclasses.replace(arch, patch=4)):
        assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), other)) > 1e-2, other


def test_a_map_that_patches_do_not_tile_is_refused(timm_checkpoint, tmp_path, monkeypatch):
    # At 224 px the last stage's map is 7x7; timm would resize it to 8x8 and back, which trtmc does not.
    folder = reconfigured_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "224", input_size=224)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"stages\.4\.1 would unfold a 7x7 map")


def test_mobilevit_v2_checkpoint_is_refused_by_its_convolutional_transformer(timm_checkpoint, tmp_path, monkeypatch):
    # MobileViTv2's transformer runs on the unfolded map with 1x1 convolutions (its separable linear
    # attention's `qkv_proj`, its MLP), where MobileViT's has linears.
    folder = reconfigured_checkpoint(timm_checkpoint("mobilevitv2_050"), tmp_path / "v2", architecture=SMALLEST)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"'stages\.2\.1\.transformer\.0\.mlp\.fc1\.weight' has shape \(128, 64, 1, 1\); expected rank 2",
    )
