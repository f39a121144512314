"""ResNetV2 and BiT: weight standardization, the zero-padded stem pool, group norms and the pooled shortcut
the tensors cannot show, norms kept in fp32 for fp16, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from support import assert_refused_before_weights_load, forbid_weight_reads, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.resnetv2 import FAMILY, derive_layout
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "resnetv2_18"
BIT = "resnetv2_50x1_bit"


def _random_group_norm_affine(state):
    """timm initializes a GroupNorm to the identity affine; random ones show a misplaced weight or bias."""
    gen = torch.Generator().manual_seed(7)
    for name in [n for n in state if n.endswith(".weight") and state[n].ndim == 1]:
        state[name] = torch.rand(state[name].shape, generator=gen) * 0.5 + 0.75
        bias = name.removesuffix("weight") + "bias"
        state[bias] = torch.randn(state[bias].shape, generator=gen) * 0.1


@pytest.fixture(scope="module")
def bit(timm_checkpoint, tmp_path_factory):
    return rewritten_checkpoint(timm_checkpoint(BIT), tmp_path_factory.mktemp("bit") / BIT, _random_group_norm_affine)


def test_bit_matches_timm_with_random_group_norm_affines(bit):
    assert fp32_relative_error(bit) <= 1e-4


def test_every_served_resnetv2_is_configured_as_timm_builds_it():
    """BiT: StdConv2d(eps=1e-8), GroupNormAct(32), the 'fixed' stem; the others plain convs and batch norms."""
    import timm
    from timm.layers import StdConv2d

    for arch, config in FAMILY.architectures.items():
        model = timm.create_model(arch)
        conv = model.stages[0].blocks[0].conv1
        assert (config.std_conv_eps is not None) == isinstance(conv, StdConv2d), arch
        if isinstance(conv, StdConv2d):
            assert (config.std_conv_eps, model.norm.num_groups) == (conv.eps, config.groups), arch
        assert config.zero_padded_stem_pool == hasattr(model.stem, "pad"), arch
        downsample = model.stages[1].blocks[0].downsample
        assert config.avg_down == hasattr(downsample, "pool"), arch


@pytest.mark.parametrize(
    "wrong", [{"std_conv_eps": None}, {"std_conv_eps": 1e-5}, {"zero_padded_stem_pool": False}, {"groups": 16}]
)
def test_what_bit_tensors_cannot_say_moves_the_logits(bit, wrong):
    config = replace(FAMILY.architectures[BIT], **wrong)
    assert fp32_relative_error(bit, FAMILY.build(Checkpoint(bit), config)) > 1e-3


def test_d_variant_pools_before_its_projection(timm_checkpoint):
    """DownsampleAvg and DownsampleConv both store downsample.conv alone; only the config tells them apart."""
    folder = timm_checkpoint("resnetv2_50d")
    config = replace(FAMILY.architectures["resnetv2_50d"], avg_down=False)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-3


def test_blocks_norms_and_stems_come_from_the_tensors(timm_checkpoint):
    basic, d = (derive_layout(Checkpoint(timm_checkpoint(a)), FAMILY.architectures[a]) for a in (SMALLEST, "resnetv2_50d"))
    assert {b.convs for b in basic.blocks} == {2} and {b.convs for b in d.blocks} == {3}
    assert [b.prefix for b in basic.blocks if b.projects] == ["stages.1.blocks.0", "stages.2.blocks.0", "stages.3.blocks.0"]
    assert [b.prefix for b in d.blocks if b.projects] == [f"stages.{s}.blocks.0" for s in range(4)]
    assert basic.stem == ("stem.conv",) and d.stem == ("stem.conv1", "stem.conv2", "stem.conv3")
    assert not basic.group_norm and not d.group_norm
    graph = FAMILY.build(Checkpoint(timm_checkpoint(BIT)), FAMILY.architectures[BIT])
    norms = [n for n in graph.nodes if n.kind is OpKind.GROUP_NORM]
    assert len(norms) == 3 * 16 + 1 and {n.attrs.groups for n in norms} == {32}


def test_fp16_keeps_group_norms_in_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(BIT)), "fp16")
    typed = {n.name: n.type.dtype for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    assert typed["stages.0.blocks.0.norm1"] is DType.F32 and typed["norm"] is DType.F32
    assert typed["stages.0.blocks.0.conv1"] is DType.F16


def test_a_group_count_that_does_not_divide_a_norm_is_refused_before_weights_load(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    config = replace(FAMILY.architectures[BIT], groups=3)
    with pytest.raises(CheckpointError, match=r"stages\.0\.blocks\.0\.norm1 normalizes 64 channels, which do not split into 3 groups"):
        derive_layout(Checkpoint(timm_checkpoint(BIT)), config)


def test_a_post_activation_stem_norm_is_refused_rather_than_dropped(timm_checkpoint, tmp_path, monkeypatch):
    """ViT-hybrid backbones (preact=False) norm the stem; this family serves pre-activation nets only."""
    def add_norm(state):
        state["stem.norm.weight"], state["stem.norm.bias"] = torch.ones(64), torch.zeros(64)

    folder = rewritten_checkpoint(timm_checkpoint(BIT), tmp_path / "post", add_norm)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"resnetv2_50x1_bit: the checkpoint holds tensors this layout does not use: stem\.norm\.bias"
    )
