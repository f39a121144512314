"""Dual Path Networks: timm's conv names, eps 1e-3, layout from the tensors, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from support import assert_refused_before_weights_load, fp32_relative_error, load_timm, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel
from trtmc.families.dpn import FAMILY, derive_layout
from trtmc.graph import OpKind

SMALLEST = "dpn68"


def _build(folder, config=None):
    arch = Checkpoint(folder).config.architecture
    return FAMILY.build(Checkpoint(folder), config or FAMILY.architectures[arch])


@pytest.mark.parametrize("arch", sorted(FAMILY.architectures))
def test_every_conv_is_named_after_timms_module(arch, timm_checkpoint):
    folder = timm_checkpoint(arch)
    convs = sorted(n.name for n in _build(folder).nodes if n.kind is OpKind.CONV2D)
    # The classifier is a 1x1 convolution in timm's DPN as well.
    assert convs == sorted(name for name, m in load_timm(folder).named_modules() if isinstance(m, torch.nn.Conv2d))


def test_norms_use_timms_eps_1e3(timm_checkpoint):
    """timm builds every DPN norm with eps=0.001; PyTorch's default 1e-5 moves the logits."""
    folder = timm_checkpoint(SMALLEST)
    config = dataclasses.replace(FAMILY.architectures[SMALLEST], eps=1e-5)
    assert fp32_relative_error(folder, _build(folder, config)) > 1e-3


def test_stride_groups_and_split_convs_come_from_the_tensors(timm_checkpoint):
    def layout(arch):
        return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])

    dpn68, dpn68b, dpn107 = layout("dpn68"), layout("dpn68b"), layout("dpn107")
    heads = [(b.prefix, b.projection, b.stride) for b in dpn68.blocks if b.projection]
    assert heads == [
        ("features.conv2_1", "c1x1_w_s1", 1),
        ("features.conv3_1", "c1x1_w_s2", 2),
        ("features.conv4_1", "c1x1_w_s2", 2),
        ("features.conv5_1", "c1x1_w_s2", 2),
    ]
    assert len(dpn68.blocks) == 3 + 4 + 12 + 3 and len(dpn107.blocks) == 4 + 8 + 20 + 3
    # dpn68: small, k_r=128, inc_sec=(16, 32, 32, 64); dpn107: inc_sec=(20, 64, 64, 128).
    assert [(b.residual, b.inc) for b in dpn68.blocks if b.projection] == [(64, 16), (128, 32), (256, 32), (512, 64)]
    assert [b.inc for b in dpn107.blocks if b.projection] == [20, 64, 64, 128]
    assert not any(b.split_convs for b in dpn68.blocks) and all(b.split_convs for b in dpn68b.blocks)
    graph = _build(timm_checkpoint("dpn107"))
    assert graph.node("features.conv1_1.conv").attrs.padding == (3, 3, 3, 3)  # 7x7 stem, not dpn68's 3x3
    assert {graph.node(f"features.conv{s}_1.c3x3_b.conv").attrs.groups for s in range(2, 6)} == {50}


def test_grouped_conv_of_the_wrong_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        key = "features.conv3_2.c3x3_b.conv.weight"
        state[key] = state[key][:, :3].contiguous()  # 256 inputs no longer split into groups of 3

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "d", narrow)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"dpn68: features\.conv3_2\.c3x3_b\.conv\.weight \(256, 3, 3, 3\) does not split"
    )


def test_a_projection_inside_a_stage_is_refused(timm_checkpoint, tmp_path, monkeypatch):
    def project(state):
        for leaf in ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "conv.weight"):
            state[f"features.conv3_3.c1x1_w_s1.{leaf}"] = state[f"features.conv3_1.c1x1_w_s2.{leaf}"].clone()

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "d", project)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"dpn68: features\.conv3_3 has projections \['c1x1_w_s1'\]"
    )


def test_tensors_the_layout_does_not_use_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    folder = rewritten_checkpoint(
        timm_checkpoint(SMALLEST), tmp_path / "d", lambda s: s.update({"head.fc.weight": torch.zeros(10, 832)})
    )
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"dpn68: the checkpoint holds tensors this layout does not use: head\.fc\.weight"
    )
