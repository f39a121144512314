"""MobileOne: depthwise and pointwise blocks, several 3x3 branches folded into one convolution, refusals
before weights load. The folding itself lives in families/_reparam.py, shared with RepVGG (whose test
file checks the folded checkpoint form).

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

from support import assert_refused_before_weights_load, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.mobileone import FAMILY


def _layout(timm_checkpoint, arch):
    return FAMILY.derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])


def test_every_served_mobileone_is_a_plain_relu_network_in_timm():
    from timm.models.byobnet import model_cfgs

    for arch, config in FAMILY.architectures.items():
        cfg = model_cfgs[arch]
        assert (cfg.stem_type, cfg.act_layer, cfg.norm_layer, cfg.attn_layer) == ("one", "relu", "batchnorm", None), arch
        # _mobileone_bcfg: each stage is alternating depthwise and pointwise blocks, none with attention.
        assert all(b.attn_layer is None for stage in cfg.blocks for b in stage), arch
        assert tuple(stage[0].s for stage in cfg.blocks) == config.stage_strides, arch


def test_branch_count_groups_and_strides_come_from_the_tensors(timm_checkpoint):
    s0, s1 = _layout(timm_checkpoint, "mobileone_s0"), _layout(timm_checkpoint, "mobileone_s1")
    # num_conv_branches: 4 in s0's stages, 1 in s1 and in every stem; the 1x1 scale branch only beside 3x3 kernels.
    assert s0.blocks[1].branches == ("conv_kxk.0", "conv_kxk.1", "conv_kxk.2", "conv_kxk.3", "conv_scale")
    assert s0.blocks[0].branches == s1.blocks[0].branches == s1.blocks[1].branches == ("conv_kxk.0", "conv_scale")
    assert s1.blocks[2].branches == ("conv_kxk.0",)  # stages.0.1, a pointwise block
    assert [b.prefix for b in s1.blocks if b.stride == 2] == ["stem", "stages.0.0", "stages.1.0", "stages.2.0", "stages.3.0"]
    graph = FAMILY.build(Checkpoint(timm_checkpoint("mobileone_s1")))
    # Stage 1 opens with a strided depthwise block on stage 0's 96 channels, then widens to 192 pointwise.
    depthwise, pointwise = graph.node("stages.1.0.reparam_conv"), graph.node("stages.1.1.reparam_conv")
    assert depthwise.attrs.groups == depthwise.type.shape[1] == 96
    assert pointwise.attrs.groups == 1 and graph.weights[pointwise.attrs.weight].shape == (192, 96, 1, 1)


def test_a_gap_in_the_conv_branches_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def drop_branch(state):
        for name in [n for n in state if n.startswith("stages.1.4.conv_kxk.2.")]:
            del state[name]

    folder = rewritten_checkpoint(timm_checkpoint("mobileone_s0"), tmp_path / "m", drop_branch)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"mobileone_s0: the indices \[0, 1, 3\] .* are not contiguous from 0"
    )
