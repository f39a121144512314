"""ResNeSt: radix and cardinality from the tensors, the strided block's average pool the tensors cannot show,
the softmax over branches kept in fp32 for fp16, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.resnest import FAMILY, derive_layout
from trtmc.graph import DType, PoolMode
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "resnest14d"


def test_every_served_resnest_pools_after_its_split_attention_in_timm():
    import timm

    for arch, config in FAMILY.architectures.items():
        block = timm.create_model(arch).layer2[0]
        assert block.avd_first is None and block.avd_last is not None, arch
        assert (config.avd, config.avd_first) == (True, False), arch


@pytest.mark.parametrize("wrong", [{"avd": False}, {"avd_first": True}])
def test_where_a_strided_block_pools_moves_the_logits(timm_checkpoint, wrong):
    """avd moves the stride from the split attention's 3x3 to a 3x3 average pool after it; the pool
    holds no tensors, so only the config places it."""
    folder = timm_checkpoint(SMALLEST)
    config = replace(FAMILY.architectures[SMALLEST], **wrong)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-3


def test_radix_and_cardinality_come_from_the_tensors(timm_checkpoint):
    layout = derive_layout(Checkpoint(timm_checkpoint("resnest26d")), FAMILY.architectures["resnest26d"])
    assert {(b.radix, b.cardinality) for b in layout.blocks} == {(2, 1)}
    assert [b.prefix for b in layout.blocks if b.stride == 2] == ["layer2.0", "layer3.0", "layer4.0"]
    graph = FAMILY.build(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    # The 3x3 writes both branches (2 x 128) in 2 groups and does not stride; the pool after it does.
    conv = graph.node("layer2.0.conv2.conv")
    assert (conv.type.shape[1], conv.attrs.groups, conv.attrs.stride) == (256, 2, (1, 1))
    pool = graph.node("layer2.0.avd_last").attrs
    assert (pool.mode, pool.kernel, pool.stride, pool.count_include_pad) == (PoolMode.AVG, (3, 3), (2, 2), True)


def test_fp16_keeps_the_softmax_over_branches_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    assert typed["layer3.0.conv2.softmax"] is DType.F32
    assert typed["layer3.0.conv2.fc2"] is DType.F16


def test_branches_that_conv3_cannot_read_are_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def widen(state):
        state["layer1.0.conv3.weight"] = torch.zeros(256, 96, 1, 1)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", widen)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"resnest14d: layer1\.0\.conv2\.conv writes 128 channels, not a multiple of conv3's 96",
    )


def test_a_squeeze_excite_is_refused_rather_than_dropped(timm_checkpoint, tmp_path, monkeypatch):
    def add_se(state):
        state["layer2.0.se.fc1.weight"] = torch.zeros(32, 512, 1, 1)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "se", add_se)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"resnest14d: the checkpoint holds tensors this layout does not use: layer2\.0\.se\.fc1\.weight"
    )
