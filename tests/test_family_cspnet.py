"""CSPNet: cross-stage splits from the tensors, stem and strides from timm's configs, LeakyReLU's slope,
refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.cspnet import FAMILY, derive_layout
from trtmc.graph import Activation, OpKind

SMALLEST = "cspresnext50"


def _layout(timm_checkpoint, arch):
    return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])


def test_every_served_cspnet_matches_timms_model_config():
    """The ArchConfig restates what timm's model_cfgs say and the tensors cannot: stem stride and pool,
    stage strides, cross_linear; all three use timm's default LeakyReLU and batch norm."""
    from timm.models.cspnet import model_cfgs

    for arch, config in FAMILY.architectures.items():
        cfg = model_cfgs[arch]
        assert (cfg.act_layer, cfg.norm_layer, cfg.aa_layer) == ("leaky_relu", "batchnorm", None), arch
        # create_csp_stem: the conv strides 2 when the stem does, and a pool takes the stem to 4.
        assert (config.stem_stride, config.stem_pool) == ((2, True) if cfg.stem.stride == 4 else (1, False)), arch
        # CspStagesCfg pads every per-stage field to one value per stage.
        assert config.stage_strides == tuple(cfg.stages.stride), arch
        assert set(cfg.stages.cross_linear) == {config.cross_linear}, arch


def test_stages_blocks_and_splits_come_from_the_tensors(timm_checkpoint):
    resnext, darknet = _layout(timm_checkpoint, "cspresnext50"), _layout(timm_checkpoint, "cspdarknet53")
    assert [len(s.blocks) for s in resnext.stages] == [3, 3, 5, 2]
    assert [len(s.blocks) for s in darknet.stages] == [1, 2, 8, 8, 4]
    assert all(b.bottleneck for s in resnext.stages for b in s.blocks)
    assert not any(b.bottleneck for s in darknet.stages for b in s.blocks)
    # cspresnext50: expand_ratio 1 on out_chs (256, 512, 1024, 2048) splits in halves; cspdarknet53's
    # first stage expands 64 -> 128 (expand_ratio 2) and splits 64 / 64.
    assert [s.split for s in resnext.stages] == [128, 256, 512, 1024]
    assert [s.split for s in darknet.stages] == [64, 64, 128, 256, 512]
    graph = FAMILY.build(Checkpoint(timm_checkpoint(SMALLEST)))
    assert graph.node("stages.1.conv_down.conv").attrs.groups == 32  # groups=32 from the weight shape
    assert graph.node("stages.0.blocks.0.conv2.conv").attrs.groups == 32


def test_leaky_relu_keeps_timms_slope_and_another_moves_the_logits(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    graph = FAMILY.build(Checkpoint(folder))
    activations = [n for n in graph.nodes if n.kind is OpKind.ACTIVATION]
    assert activations and {(n.attrs.fn, n.attrs.negative_slope) for n in activations} == {(Activation.LEAKY_RELU, 0.01)}
    config = dataclasses.replace(FAMILY.architectures[SMALLEST], negative_slope=0.1)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-3


def test_cross_linear_expansion_has_no_activation_and_the_config_decides_it(timm_checkpoint):
    """cspresnext50's conv_exp is linear (cross_linear=True); cspdarknet53's is activated."""
    folder = timm_checkpoint(SMALLEST)
    graph = FAMILY.build(Checkpoint(folder))
    assert "stages.0.conv_exp.bn.act" not in {n.name for n in graph.nodes}
    activated = FAMILY.build(Checkpoint(folder), dataclasses.replace(FAMILY.architectures[SMALLEST], cross_linear=False))
    assert activated.node("stages.0.conv_exp.bn.act").attrs.fn is Activation.LEAKY_RELU
    assert fp32_relative_error(folder, activated) > 1e-3


def test_a_stage_that_strides_without_conv_down_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_down(state):
        for name in [n for n in state if n.startswith("stages.2.conv_down.")]:
            del state[name]

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "c", drop_down)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"cspresnext50: stages\.2 lacks conv_down but strides by 2"
    )
