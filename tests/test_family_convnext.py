"""ConvNeXt and ConvNeXt V2: layout from the tensors, a channels-first MLP, GRN statistics in fp32, eps
from the config, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from support import assert_refused_before_weights_load, forbid_weight_reads, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.convnext import FAMILY, derive_layout
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "convnext_atto"


def test_layout_reads_depths_widths_and_mlp_form_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    for arch, depths, widths in (
        ("convnext_nano", (2, 2, 8, 2), (80, 160, 320, 640)),
        ("convnext_small", (3, 3, 27, 3), (96, 192, 384, 768)),
    ):
        layout = derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])
        assert tuple(len(s.blocks) for s in layout.stages) == depths
        assert tuple(s.width for s in layout.stages) == widths
        # Stage 0 keeps the stem's resolution; the others open with a 2x2 stride-2 patchify.
        assert tuple(s.downsample for s in layout.stages) == (0, 2, 2, 2)
        assert layout.patch == 4
        assert all(b.layer_scale and b.hidden == 4 * s.width for s in layout.stages for b in s.blocks)


def test_linear_mlp_runs_as_1x1_convolutions_without_permutes(timm_checkpoint):
    # convnext_tiny stores its MLP as linears on channels-last tensors; the graph stays NCHW (timm's two
    # permutes a block as views on channels-last activations ran convnext_tiny 0.655 ms against 0.579 as
    # 1x1 convolutions at batch 1 on the H200: benchmarks/NOTES.md, runs 7 and 10).
    _, graph = build_graph(Checkpoint(timm_checkpoint("convnext_tiny")))
    assert graph.node("stages.0.blocks.0.mlp.fc1").kind is OpKind.CONV2D
    assert graph.node("stages.0.blocks.0.norm").attrs.axis == 1
    assert not [n for n in graph.nodes if n.kind is OpKind.TRANSPOSE]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["convnext_tiny", "convnextv2_tiny"])
def test_linear_mlps_as_1x1_convolutions_match_timm_in_fp32(arch, timm_checkpoint):
    # The family-wide parity checks run the smallest architectures, whose MLPs timm stores as 1x1
    # convolutions: these two store linears (and V2 a GRN after them), reshaped here into convolutions.
    assert fp32_relative_error(timm_checkpoint(arch)) < 1e-5


def test_mis_shaped_mlp_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def shrink(state):
        state["stages.1.blocks.0.mlp.fc2.weight"] = state["stages.1.blocks.0.mlp.fc2.weight"][:, :100]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", shrink)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"stages\.1\.blocks\.0\.mlp\.fc2\.weight.*\(80, 100, 1, 1\)"
    )


def test_v2_blocks_have_a_grn_and_no_layer_scale_read_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    for arch, grn in (("convnextv2_atto", True), ("convnext_atto", False)):
        layout = derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])
        blocks = [b for s in layout.stages for b in s.blocks]
        assert all(b.grn is grn and b.layer_scale is not grn for b in blocks), arch


def test_v2_norms_use_eps_1e6_and_a_wrong_eps_moves_the_logits(timm_checkpoint):
    folder = timm_checkpoint("convnextv2_atto")
    ckpt, stated = Checkpoint(folder), FAMILY.architectures["convnextv2_atto"]
    assert (stated.norm_eps, stated.grn_eps) == (1e-6, 1e-6)
    graph = FAMILY.build(ckpt, stated)
    assert graph.weights[graph.node("stages.0.blocks.0.mlp.grn.eps").attrs.weight].item() == pytest.approx(1e-6)
    right = fp32_relative_error(folder, graph)
    # Measured: LayerNorm eps 1e-5 moves the logits by 2e-3 of the largest; GRN eps 1e-5 by 2.3e-6,
    # 6x what the stated config leaves (3.9e-7): GRN divides by the channels' mean L2 norm, which is large.
    assert fp32_relative_error(folder, FAMILY.build(ckpt, replace(stated, norm_eps=1e-5))) > 1e-3
    assert fp32_relative_error(folder, FAMILY.build(ckpt, replace(stated, grn_eps=1e-5))) > 4 * right


def test_grn_statistics_stay_fp32_in_fp16_and_bf16_builds(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint("convnextv2_atto")))
    grn = "stages.0.blocks.0.mlp.grn"
    for precision, low in (("fp16", DType.F16), ("bf16", DType.BF16)):
        typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy(precision)).nodes}
        for statistic in ("square", "sum", "sqrt", "mean", "eps", "mean_eps", "div"):
            assert typed[f"{grn}.{statistic}"] is DType.F32, (precision, statistic)
        assert typed[grn] is low and typed[f"{grn}.mul"] is low  # the affine and x * Nx stay in the build's precision


def test_foreign_head_tensors_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    # The *_mlp variants (convnext_large_mlp) add a pre-logits MLP to the head, which this layout has no place for.
    def add_pre_logits(state):
        state["head.pre_logits.fc.weight"] = torch.zeros(320, 320)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "mlp_head", add_pre_logits)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"head\.pre_logits\.fc\.weight")
