"""ConvNeXt: layout from the tensors, a channels-first MLP, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import torch

from support import assert_refused_before_weights_load, forbid_weight_reads, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.convnext import FAMILY, derive_layout
from trtmc.graph import OpKind

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
    # convnext_tiny stores its MLP as linears on channels-last tensors; the graph stays NCHW.
    _, graph = build_graph(Checkpoint(timm_checkpoint("convnext_tiny")))
    assert graph.node("stages.0.blocks.0.mlp.fc1").kind is OpKind.CONV2D
    assert graph.node("stages.0.blocks.0.norm").attrs.axis == 1
    assert not [n for n in graph.nodes if n.kind is OpKind.TRANSPOSE]


def test_mis_shaped_mlp_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def shrink(state):
        state["stages.1.blocks.0.mlp.fc2.weight"] = state["stages.1.blocks.0.mlp.fc2.weight"][:, :100]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", shrink)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"stages\.1\.blocks\.0\.mlp\.fc2\.weight.*\(80, 100, 1, 1\)"
    )


def test_convnext_v2_style_extra_tensors_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    # A global-response-norm MLP (ConvNeXt-V2) carries tensors this layout would otherwise ignore.
    def add_grn(state):
        state["stages.0.blocks.0.mlp.grn.weight"] = torch.zeros(1, 1, 1, 160)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "grn", add_grn)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"stages\.0\.blocks\.0\.mlp\.grn\.weight")
