"""MixNet: MixConv groups and kernel sizes read from the tensors, TF padding per kernel, SiLU stages,
a missing MixConv part refused before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.efficientnet import decode_stages, split_channels
from trtmc.families.mixnet import ARCHITECTURES, FAMILY, derive_layout
from trtmc.graph import Activation, OpKind

SMALLEST = "mixnet_s"


def test_mixconv_groups_and_kernel_sizes_come_from_the_tensors(timm_checkpoint):
    ckpt = Checkpoint(timm_checkpoint(SMALLEST))
    layout = derive_layout(ckpt, ARCHITECTURES[SMALLEST])
    steps = {s.conv: s for b in layout.blocks for s in b.steps}
    # blocks.2.0 (`k3.5.7`): 144 expanded channels in three groups of 48, each with its kernel size.
    assert steps["blocks.2.0.conv_dw"].splits == (48, 48, 48) == split_channels(144, 3)
    assert steps["blocks.2.0.conv_pw"].splits == ()  # one 1x1 conv where the arch def has no `a1.1`
    # blocks.1.0 (`a1.1_p1.1`): pointwise convs split in two halves.
    assert (steps["blocks.1.0.conv_pw"].splits, steps["blocks.1.0.conv_pwl"].splits) == ((8, 8), (48, 48))
    graph = FAMILY.build(ckpt, ARCHITECTURES[SMALLEST])
    parts = [graph.node(f"blocks.2.0.conv_dw.{i}") for i in range(3)]
    assert [graph.weights[p.attrs.weight].shape[2] for p in parts] == [3, 5, 7]
    assert all(p.attrs.stride == (2, 2) and p.attrs.groups == 48 for p in parts)
    joined = graph.node("blocks.2.0.conv_dw")
    assert joined.kind is OpKind.CONCAT and joined.type.shape == (1, 144, 28, 28)
    # Two halves through 1x1 kernels stay two dense convs and a concat, as timm runs them (not groups=2).
    halves = [graph.node(f"blocks.1.0.conv_pw.{i}") for i in range(2)]
    assert all(h.kind is OpKind.CONV2D and h.attrs.groups == 1 and h.type.shape[1] == 48 for h in halves)
    assert graph.node("blocks.1.0.conv_pw").kind is OpKind.CONCAT
    assert not [n for n in graph.nodes if n.kind is OpKind.CONV2D and 1 < n.attrs.groups < n.type.shape[1]]


def test_tf_variant_pads_every_kernel_same_for_its_size(timm_checkpoint):
    folder = timm_checkpoint("tf_mixnet_s")
    tf, timm_own = ARCHITECTURES["tf_mixnet_s"], ARCHITECTURES[SMALLEST]
    tf_graph, timm_graph = FAMILY.build(Checkpoint(folder), tf), FAMILY.build(Checkpoint(folder), timm_own)
    # Stride 2 on 56x56: TF "SAME" puts the odd pixel after, timm pads each kernel symmetrically.
    for part, same, symmetric in ((0, (0, 0, 1, 1), (1, 1, 1, 1)), (1, (1, 1, 2, 2), (2, 2, 2, 2)), (2, (2, 2, 3, 3), (3, 3, 3, 3))):
        assert tf_graph.node(f"blocks.2.0.conv_dw.{part}").attrs.padding == same
        assert timm_graph.node(f"blocks.2.0.conv_dw.{part}").attrs.padding == symmetric
    assert fp32_relative_error(folder, timm_graph) > 1e-3


def test_late_stages_run_on_silu_and_the_rest_on_relu(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    graph = FAMILY.build(Checkpoint(folder), ARCHITECTURES[SMALLEST])
    fns = {name: graph.node(name).attrs.fn for name in ("bn1.act", "blocks.1.0.bn1.act", "blocks.2.0.bn1.act", "blocks.2.0.se.act1", "bn2.act")}
    assert fns == {
        "bn1.act": Activation.RELU, "blocks.1.0.bn1.act": Activation.RELU,
        "blocks.2.0.bn1.act": Activation.SILU, "blocks.2.0.se.act1": Activation.SILU, "bn2.act": Activation.RELU,
    }
    all_relu = dataclasses.replace(ARCHITECTURES[SMALLEST], stages=decode_stages("s1 s2 s2 s2 s1 s2"))
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), all_relu)) > 1e-2


def test_a_missing_mixconv_part_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    folder = rewritten_checkpoint(
        timm_checkpoint(SMALLEST), tmp_path / "m", lambda state: state.pop("blocks.2.0.conv_dw.1.weight")
    )
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"mixnet_s: the indices \[0, 2\] in the tensor names matching .*blocks\\\.2\\\.0\\\.conv_dw.* are not contiguous from 0",
    )
