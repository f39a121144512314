"""Selective Kernel ResNets: the split input and the dilated path the tensors cannot show, the softmax over
paths kept in fp32 for fp16, layout from the tensors, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.skresnet import FAMILY, derive_layout
from trtmc.graph import DType
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "skresnet18"


def test_every_served_sknet_has_timms_selective_kernel_settings():
    """The ArchConfig rows mirror each model's sk_kwargs in timm: its split_input and the default
    kernel_size=[3, 5] with keep_3x3, which makes the second path a 3x3 dilated by 2."""
    import timm

    for arch, config in FAMILY.architectures.items():
        block = timm.create_model(arch).layer1[0]
        sk = block.conv1 if hasattr(block.conv1, "paths") else block.conv2
        assert sk.split_input == config.split_input, arch
        assert tuple(path.conv.dilation[0] for path in sk.paths) == config.path_dilations, arch


@pytest.mark.parametrize("wrong", [{"split_input": False}, {"path_dilations": (1, 1)}])
def test_what_the_tensors_cannot_say_moves_the_logits(timm_checkpoint, wrong):
    """skresnet18's paths read 32 of 64 channels each; unsplit, the same weights form a valid conv with
    2 groups over all 64. Both paths store 3x3 weights whether dilated or not."""
    folder = timm_checkpoint(SMALLEST)
    config = replace(FAMILY.architectures[SMALLEST], **wrong)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-3


def test_blocks_and_attention_widths_come_from_the_tensors(timm_checkpoint):
    basic = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    assert [(b.prefix, b.before, b.sk.prefix, b.after) for b in basic.blocks[:1]] == [
        ("layer1.0", None, "layer1.0.conv1", "layer1.0.conv2")
    ]
    assert [b.sk.path_input for b in basic.blocks if b.prefix.endswith(".1")] == [32, 64, 128, 256]
    graph = FAMILY.build(Checkpoint(timm_checkpoint("skresnext50_32x4d")), FAMILY.architectures["skresnext50_32x4d"])
    # Unsplit bottleneck paths: each reads conv1's 128 channels in 32 groups and strides in layer2.0.
    path = graph.node("layer2.0.conv2.paths.1.conv")
    assert (path.attrs.groups, path.attrs.dilation, path.attrs.stride, path.attrs.padding) == (32, (2, 2), (2, 2), (2, 2, 2, 2))
    # rd_ratio 1/16 with rd_divisor 32: 256 channels attend through 32.
    assert graph.node("layer2.0.conv2.attn.fc_reduce").type.shape[1] == 32


def test_fp16_keeps_the_softmax_over_paths_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    assert typed["layer1.0.conv1.softmax"] is DType.F32
    assert typed["layer1.0.conv1.attn.fc_select"] is DType.F16


def test_a_third_path_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def add_path(state):
        for leaf in ("conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"):
            state[f"layer2.1.conv1.paths.2.{leaf}"] = state[f"layer2.1.conv1.paths.1.{leaf}"].clone()

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "three", add_path)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"skresnet18: layer2\.1\.conv1 has 3 paths\.N convs; its SelectiveKernel has 2"
    )


def test_a_squeeze_excite_is_refused_rather_than_dropped(timm_checkpoint, tmp_path, monkeypatch):
    def add_se(state):
        state["layer3.0.se.fc1.weight"] = torch.zeros(16, 256, 1, 1)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "se", add_se)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"skresnet18: the checkpoint holds tensors this layout does not use: layer3\.0\.se\.fc1\.weight"
    )
