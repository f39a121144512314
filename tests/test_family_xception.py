"""Aligned Xception: flows and strides, the exit block, eps 1e-3, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import torch

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel
from trtmc.families.xception import FAMILY, derive_layout

SMALLEST = "xception41"


def test_every_served_xception_matches_timms_block_config():
    """The ArchConfig flows restate timm's block_cfg strides; everything else is in the tensors."""
    import timm

    for arch, config in FAMILY.architectures.items():
        model = timm.create_model(arch, pretrained=False)
        # XceptionModule's third separable conv carries the block's stride.
        strides = [block.stack.conv3.conv_dw.stride[0] for block in model.blocks]
        assert strides[: len(config.entry_strides)] == list(config.entry_strides), arch
        assert strides[len(strides) - len(config.exit_strides) :] == list(config.exit_strides), arch
        assert set(strides[len(config.entry_strides) : -len(config.exit_strides)]) == {1}, arch
        assert {m.eps for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)} == {config.eps}, arch
        assert model.blocks[-1].no_skip and model.blocks[-1].stack.conv1.act_dw.__class__ is torch.nn.ReLU, arch


def test_flows_come_from_the_tensors_and_strides_from_the_config(timm_checkpoint):
    layout = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    assert len(layout.blocks) == 3 + 8 + 2  # entry, middle (8 in xception41), exit
    assert [b.prefix for b in layout.blocks if b.stride == 2] == ["blocks.0", "blocks.1", "blocks.2", "blocks.11"]
    assert [b.prefix for b in layout.blocks if b.projects] == ["blocks.0", "blocks.1", "blocks.2", "blocks.11"]
    *residual, exit_block = layout.blocks
    assert all(b.residual and b.relu_first for b in residual)
    assert not exit_block.residual and not exit_block.relu_first


def test_entry_flow_strides_decide_the_logits(timm_checkpoint):
    """xception71's entry flow (2, 1, 2, 1, 2) differs from xception41's (2, 2, 2) in nothing the tensors
    hold: a block that projects its shortcut may keep the resolution."""
    folder = timm_checkpoint(SMALLEST)
    config = dataclasses.replace(FAMILY.architectures[SMALLEST], entry_strides=(2, 1, 2))
    graph = FAMILY.build(Checkpoint(folder), config)
    assert graph.node("blocks.1.stack.conv3.conv_dw").attrs.stride == (1, 1)
    assert fp32_relative_error(folder, graph) > 1e-3


def test_norms_use_timms_eps_1e3(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    config = dataclasses.replace(FAMILY.architectures[SMALLEST], eps=1e-5)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-3


def test_a_shortcut_on_the_exit_block_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def project(state):
        state["blocks.12.shortcut.conv.weight"] = torch.zeros(2048, 1024, 1, 1)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "x", project)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"xception41: blocks\.12 ends the exit flow without a residual, yet has a shortcut"
    )


def test_a_pre_activation_variant_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    """xception41p normalizes each block's input (`blocks.N.norm`), a layer this layout has no place for."""
    def preact(state):
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            state[f"blocks.3.norm.{leaf}"] = torch.ones(728)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "x", preact)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"xception41: the checkpoint holds tensors this layout does not use: blocks\.3\.norm\.bias"
    )
