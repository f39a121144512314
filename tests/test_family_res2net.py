"""Res2Net and Res2NeXt: splits, scales and cardinality from the tensors, the block that pools its last split,
the batch-norm eps, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel
from trtmc.families.res2net import FAMILY, derive_layout
from trtmc.graph import OpKind, PoolMode

SMALLEST = "res2next50"


def _layout(timm_checkpoint, arch):
    return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])


def test_split_width_scales_and_cardinality_come_from_the_tensors(timm_checkpoint):
    w26, w14 = _layout(timm_checkpoint, "res2net50_26w_4s"), _layout(timm_checkpoint, "res2net50_14w_8s")
    # floor(planes * base_width / 64) per split: 26 and 14 in layer1, doubling per stage.
    assert [(b.width, b.scales) for b in w26.blocks if b.prefix.endswith(".0")] == [(26, 4), (52, 4), (104, 4), (208, 4)]
    assert [(b.width, b.scales) for b in w14.blocks if b.prefix.endswith(".0")] == [(14, 8), (28, 8), (56, 8), (112, 8)]
    graph = FAMILY.build(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    # Res2NeXt: 8 groups of 4 channels in each split's 3x3.
    assert {n.attrs.groups for n in graph.nodes if n.kind is OpKind.CONV2D and ".convs." in n.name} == {8}


def test_blocks_that_stride_or_project_pool_their_last_split_and_do_not_chain_splits(timm_checkpoint):
    layout = _layout(timm_checkpoint, "res2net50_26w_4s")
    assert [b.prefix for b in layout.blocks if b.first] == ["layer1.0", "layer2.0", "layer3.0", "layer4.0"]
    graph = FAMILY.build(Checkpoint(timm_checkpoint("res2net50_26w_4s")), FAMILY.architectures["res2net50_26w_4s"])
    # layer1.0 projects without striding: timm's pool still runs, at stride 1, counting its padding.
    for name, stride in (("layer1.0.pool", 1), ("layer2.0.pool", 2)):
        pool = graph.node(name).attrs
        assert (pool.mode, pool.kernel, pool.stride, pool.count_include_pad) == (PoolMode.AVG, (3, 3), (stride, stride), True)
    # Elsewhere each split after the first adds the previous scale's output before its 3x3.
    assert graph.node("layer1.1.convs.1.add").inputs[0] == "layer1.1.relu#2"
    assert not [n for n in graph.nodes if n.name.startswith("layer1.0.convs.") and n.name.endswith(".add")]


def test_batch_norm_eps_is_torchs_default(timm_checkpoint):
    """timm builds Res2Net with nn.BatchNorm2d's eps=1e-5; DPN's 1e-3 moves the logits."""
    folder = timm_checkpoint(SMALLEST)
    arch = FAMILY.architectures[SMALLEST]
    assert arch.eps == 1e-5
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), replace(arch, eps=1e-3))) > 1e-3


def test_scales_that_do_not_divide_conv1_are_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_a_scale(state):
        for leaf in ("convs.2.weight", "bns.2.weight", "bns.2.bias", "bns.2.running_mean", "bns.2.running_var"):
            state.pop(f"layer3.1.{leaf}")

    folder = rewritten_checkpoint(timm_checkpoint("res2net50_26w_4s"), tmp_path / "bad", drop_a_scale)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"res2net50_26w_4s: layer3\.1\.conv1 writes 416 channels, which do not split into one more scale of 104 than its 2 convs\.N",
    )


def test_a_squeeze_excite_is_refused_rather_than_dropped(timm_checkpoint, tmp_path, monkeypatch):
    """Bottle2neck can carry an attn_layer; no served Res2Net has one, and building without it would
    compute another network."""
    def add_se(state):
        state["layer1.0.se.fc1.weight"] = torch.zeros(16, 256, 1, 1)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "se", add_se)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"res2next50: the checkpoint holds tensors this layout does not use: layer1\.0\.se\.fc1\.weight"
    )
