"""DenseNet: dense blocks and transitions from the tensors, PyTorch's eps, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import torch

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel
from trtmc.families.densenet import FAMILY, derive_layout
from trtmc.graph import OpKind

SMALLEST = "densenet121"


def test_blocks_layers_and_growth_come_from_the_tensors(timm_checkpoint):
    def layout(arch):
        return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])

    # timm's block_config: densenet121 (6, 12, 24, 16), densenet169 (6, 12, 32, 32).
    assert [len(b.layers) for b in layout("densenet121").blocks] == [6, 12, 24, 16]
    assert [len(b.layers) for b in layout("densenet169").blocks] == [6, 12, 32, 32]
    blocks = layout(SMALLEST).blocks
    assert [b.transition for b in blocks] == ["features.transition1", "features.transition2", "features.transition3", None]
    graph = FAMILY.build(Checkpoint(timm_checkpoint(SMALLEST)))
    # Growth rate 32: the first block's concatenation grows 64 -> 64 + 6 * 32, and its transition halves it.
    assert graph.node("features.denseblock1").type.shape[1] == 256
    assert graph.node("features.transition1.conv").type.shape[1] == 128
    # Every layer but the first of a block reads the concatenation of all the maps before it.
    layer = graph.node("features.denseblock2.denselayer12.norm1")
    assert layer.inputs == ("features.denseblock2.denselayer12.cat",) and layer.type.shape[1] == 128 + 11 * 32
    assert graph.node("features.transition3.pool").type.shape[2:] == (7, 7)


def test_norms_use_pytorchs_default_eps(timm_checkpoint):
    """timm's BatchNormAct2d keeps nn.BatchNorm2d's eps=1e-5; the 1e-3 of Inception or Xception moves the logits."""
    folder = timm_checkpoint(SMALLEST)
    config = dataclasses.replace(FAMILY.architectures[SMALLEST], eps=1e-3)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-3


def test_every_conv_is_preceded_by_its_norm_and_relu(timm_checkpoint):
    """DenseNet is pre-activation inside its blocks: norm, ReLU, then the convolution."""
    graph = FAMILY.build(Checkpoint(timm_checkpoint(SMALLEST)))
    producers = {n.name: n for n in graph.nodes}
    for node in graph.nodes:
        if node.kind is OpKind.CONV2D and node.name != "features.conv0":
            relu = producers[node.inputs[0]]
            assert relu.kind is OpKind.ACTIVATION and producers[relu.inputs[0]].kind is OpKind.SCALE, node.name


def test_a_missing_dense_layer_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_layer(state):
        for name in [n for n in state if n.startswith("features.denseblock3.denselayer7.")]:
            del state[name]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "d", drop_layer)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"indices \[1, 2, 3, 4, 5, 6, 8, .* under 3 .* are not contiguous from 1"
    )


def test_a_deep_stem_variant_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    """densenetblur121d's stem is three 3x3 convs (conv0, conv1, conv2) with blur pooling."""
    def deepen(state):
        state["features.conv1.weight"] = torch.zeros(64, 64, 3, 3)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "d", deepen)
    assert_refused_before_weights_load(folder, monkeypatch, UnsupportedModel, r"densenet121: features\.conv1 belongs to a deep stem")
