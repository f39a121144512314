"""ResNet, ResNet-D, SE-ResNet, ResNeXt and Wide ResNet: layout from the tensors, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import torch

from support import assert_refused_before_weights_load, reconfigured_checkpoint, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel
from trtmc.families.resnet import FAMILY, derive_layout
from trtmc.graph import PoolMode


def _layout(timm_checkpoint, arch):
    return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])


def test_basic_blocks_stride_conv1_and_bottlenecks_stride_conv2(timm_checkpoint):
    basic, bottleneck = _layout(timm_checkpoint, "resnet18"), _layout(timm_checkpoint, "resnet50")
    assert [(b.prefix, b.convs, b.strided_conv) for b in basic.blocks if b.stride == 2] == [
        ("layer2.0", 2, 1), ("layer3.0", 2, 1), ("layer4.0", 2, 1),
    ]
    assert [(b.prefix, b.convs, b.strided_conv) for b in bottleneck.blocks if b.stride == 2] == [
        ("layer2.0", 3, 2), ("layer3.0", 3, 2), ("layer4.0", 3, 2),
    ]
    # A bottleneck's first block projects 64 -> 256 without striding; a basic block's needs nothing.
    assert basic.blocks[0].shortcut is None and bottleneck.blocks[0].shortcut.conv == "layer1.0.downsample.0"
    assert len(_layout(timm_checkpoint, "resnet101").blocks) == 3 + 4 + 23 + 3


def test_d_variant_has_a_deep_stem_and_pools_before_projecting(timm_checkpoint):
    d = _layout(timm_checkpoint, "resnet50d")
    assert [(s.conv, s.norm, s.stride) for s in d.stem] == [
        ("conv1.0", "conv1.1", 2), ("conv1.3", "conv1.4", 1), ("conv1.6", "bn1", 1),
    ]
    # layer1 projects without striding: timm's downsample_avg has no pool there, only the 1x1 conv.
    assert [(b.shortcut.pool, b.shortcut.conv) for b in d.blocks if b.shortcut] == [
        (None, "layer1.0.downsample.1"),
        ("layer2.0.downsample.0", "layer2.0.downsample.1"),
        ("layer3.0.downsample.0", "layer3.0.downsample.1"),
        ("layer4.0.downsample.0", "layer4.0.downsample.1"),
    ]
    graph = FAMILY.build(Checkpoint(timm_checkpoint("resnet50d")), FAMILY.architectures["resnet50d"])
    pool = graph.node("layer2.0.downsample.0").attrs
    assert (pool.mode, pool.kernel, pool.stride, pool.count_include_pad) == (PoolMode.AVG, (2, 2), (2, 2), False)


def test_groups_and_squeeze_excite_come_from_the_tensors(timm_checkpoint):
    resnext = FAMILY.build(Checkpoint(timm_checkpoint("resnext50_32x4d")), FAMILY.architectures["resnext50_32x4d"])
    assert {resnext.node(f"layer{s}.0.conv2").attrs.groups for s in range(1, 5)} == {32}
    se = _layout(timm_checkpoint, "seresnet50")
    assert all(b.se for b in se.blocks) and not any(b.se for b in _layout(timm_checkpoint, "wide_resnet50_2").blocks)


def test_d_variant_refuses_an_input_size_whose_pooled_map_is_odd(timm_checkpoint, tmp_path, monkeypatch):
    """176 -> 88 -> 44 -> 44 -> 22 -> 11: layer4's ceil-mode average pool would keep an odd last row."""
    d = reconfigured_checkpoint(timm_checkpoint("resnet50d"), tmp_path / "resnet50d", input_size=176)
    plain = reconfigured_checkpoint(timm_checkpoint("resnet50"), tmp_path / "resnet50", input_size=176)
    assert_refused_before_weights_load(
        d, monkeypatch, UnsupportedModel, r"resnet50d: layer4\.0\.downsample\.0 average-pools a 11x11 map with ceil_mode"
    )
    # Strided 1x1 projections floor like the 3x3 beside them: nothing to refuse without the pool.
    assert len(derive_layout(Checkpoint(plain), FAMILY.architectures["resnet50"]).blocks) == 16


def test_wrong_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        state["layer2.1.conv1.weight"] = state["layer2.1.conv1.weight"][:, :96].contiguous()

    folder = rewritten_checkpoint(timm_checkpoint("resnet18"), tmp_path / "r18", narrow)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"resnet18: tensor 'layer2\.1\.conv1\.weight' has shape \(128, 96, 3, 3\), which cannot be a conv reading 128 channels",
    )


def test_tensors_of_another_variant_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    """An anti-aliased or otherwise extended ResNet must not build as if its extra layers were absent."""
    def extend(state):
        state["layer2.0.aa.weight"] = torch.ones(128)

    folder = rewritten_checkpoint(timm_checkpoint("resnet18"), tmp_path / "r18", extend)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel,
        r"resnet18: the checkpoint holds tensors this layout does not use: layer2\.0\.aa\.weight",
    )
