"""GhostNet v1: stride-2 blocks and module names as timm's, the hard-sigmoid SE gate, refusals before
weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import torch

from support import (
    assert_refused_before_weights_load,
    fp32_relative_error,
    load_timm,
    reconfigured_checkpoint,
    rewritten_checkpoint,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel
from trtmc.families.ghostnet import FAMILY, derive_layout
from trtmc.graph import Activation, OpKind

SMALLEST = "ghostnet_050"


def test_blocks_with_conv_dw_are_exactly_timms_stride_2_blocks(timm_checkpoint):
    folder = timm_checkpoint("ghostnet_100")
    layout = derive_layout(Checkpoint(folder), FAMILY.architectures["ghostnet_100"])
    timm_blocks = [block for stage in load_timm(folder).blocks[:-1] for block in stage]
    assert [b.stride for b in layout.blocks] == [b.stride for b in timm_blocks]
    assert [b.prefix for b in layout.blocks if b.stride == 2] == ["blocks.1.0", "blocks.3.0", "blocks.5.0", "blocks.7.0"]
    # Shortcuts project exactly where timm's do: a width change or a stride.
    assert [b.conv_shortcut for b in layout.blocks] == [len(b.shortcut) > 0 for b in timm_blocks]
    assert [b.has_se for b in layout.blocks] == [b.se is not None for b in timm_blocks]


def test_node_names_are_timm_module_paths(timm_checkpoint):
    folder = timm_checkpoint("ghostnet_100")
    graph = FAMILY.build(Checkpoint(folder), FAMILY.architectures["ghostnet_100"])
    modules = dict(load_timm(folder).named_modules())
    convs = sorted(n.name for n in graph.nodes if n.kind is OpKind.CONV2D)
    assert convs == sorted(name for name, m in modules.items() if isinstance(m, torch.nn.Conv2d))
    norms = {n.name for n in graph.nodes if n.kind is OpKind.SCALE}
    assert norms == {name for name, m in modules.items() if isinstance(m, torch.nn.BatchNorm2d)}
    gates = [n for n in graph.nodes if n.name.endswith(".se.gate")]
    assert gates and all(n.attrs.fn is Activation.HARD_SIGMOID and n.name in modules for n in gates)


def test_se_gate_is_timms_hard_sigmoid_not_a_sigmoid(timm_checkpoint):
    """The ArchConfig pins the gate the tensors cannot show: a sigmoid gate moves the logits."""
    folder = timm_checkpoint(SMALLEST)
    config = dataclasses.replace(FAMILY.architectures[SMALLEST], se_gate=Activation.SIGMOID)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-2


def test_wrong_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        state["blocks.3.0.ghost1.primary_conv.0.weight"] = state["blocks.3.0.ghost1.primary_conv.0.weight"][:, :8].contiguous()

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "g", narrow)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"ghostnet_050: tensor 'blocks\.3\.0\.ghost1\.primary_conv\.0\.weight' has shape \(18, 8, 1, 1\); "
        r"expected rank 4 with dim 1 = 12",
    )


def test_ghostnet_v2_tensors_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    """A v2 checkpoint under a v1 name must not build as v1 with its attention branches dropped."""
    folder = reconfigured_checkpoint(timm_checkpoint("ghostnetv2_100"), tmp_path / "v2", architecture="ghostnet_100")
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel,
        r"ghostnet_100: the checkpoint holds tensors this layout does not use: blocks\.2\.0\.ghost1\.short_conv",
    )
