"""ConvNeXt: parity with timm for every served variant, layout from the tensors, refusals before weights load."""

from __future__ import annotations

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
from trtmc.families.convnext import FAMILY, derive_layout
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "convnext_atto"


def test_atto_matches_timm_in_fp32_and_agrees_in_fp16_and_bf16(timm_checkpoint, record_property):
    report = check_parity(timm_checkpoint(SMALLEST))
    record_property("parity", report)
    assert report["fp32_rel_err"] <= 1e-4, report
    for precision in ("fp16", "bf16"):
        result = report[precision]
        assert result["finite"] and result["kl"] < 1e-3, (precision, result)
        # Random weights leave near-ties among the logits; only those may flip.
        assert all(m < TIE_MARGIN[precision] for m in result["flip_margins"]), (precision, result)


# convnext_small (50M parameters) is the slowest of the file; at batch 1 it stays within seconds.
@pytest.mark.parametrize("arch", ["convnext_nano", "convnext_tiny", "convnext_small"])
def test_variant_matches_timm_in_fp32(timm_checkpoint, arch, record_property):
    folder = timm_checkpoint(arch)
    x = random_pixels(folder, batch=1)
    with torch.no_grad():
        error = relative_error(trtmc_module(folder)(x), load_timm(folder)(x))
    record_property("fp32_rel_err", error)
    assert error <= 1e-4


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
    # convnext_tiny stores its MLP as linears on channels-last tensors; the graph stays NCHW.
    _, graph = build_graph(Checkpoint(timm_checkpoint("convnext_tiny")))
    assert graph.node("stages.0.blocks.0.mlp.fc1").kind is OpKind.CONV2D
    assert graph.node("stages.0.blocks.0.norm").attrs.axis == 1
    assert not [n for n in graph.nodes if n.kind is OpKind.TRANSPOSE]


def test_bf16_graph_has_no_fp32_or_fp16_convolution_or_matmul(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "bf16")
    typed = assign_precision(graph, PrecisionPolicy("bf16"))
    math = [n for n in typed.nodes if n.kind in (OpKind.CONV2D, OpKind.MATMUL, OpKind.LINEAR)]
    assert math and all(n.type.dtype is DType.BF16 for n in math)


def test_mis_shaped_mlp_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def shrink(state):
        state["stages.1.blocks.0.mlp.fc2.weight"] = state["stages.1.blocks.0.mlp.fc2.weight"][:, :100]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", shrink)
    forbid_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"stages\.1\.blocks\.0\.mlp\.fc2\.weight.*\(80, 100, 1, 1\)"):
        build_graph(Checkpoint(folder))


def test_convnext_v2_style_extra_tensors_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    # A global-response-norm MLP (ConvNeXt-V2) carries tensors this layout would otherwise ignore.
    def add_grn(state):
        state["stages.0.blocks.0.mlp.grn.weight"] = torch.zeros(1, 1, 1, 160)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "grn", add_grn)
    forbid_weight_reads(monkeypatch)
    with pytest.raises(UnsupportedModel, match=r"stages\.0\.blocks\.0\.mlp\.grn\.weight"):
        build_graph(Checkpoint(folder))
