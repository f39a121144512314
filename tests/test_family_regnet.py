"""RegNetX and RegNetY: timm's plain configuration, layout from the tensors, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import torch

from support import assert_refused_before_weights_load, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel
from trtmc.families.regnet import FAMILY, derive_layout
from trtmc.graph import OpKind

SMALLEST = "regnetx_002"


def _layout(timm_checkpoint, arch):
    return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])


def test_every_served_regnet_is_a_plain_relu_batchnorm_regnet_in_timm():
    """The ArchConfig rows assume timm's RegNetCfg defaults; regnety_040_sgn (SiLU, GroupNorm) and
    the pre-activation regnetv differ and are not served."""
    from timm.models.regnet import model_cfgs

    for arch, config in FAMILY.architectures.items():
        cfg = model_cfgs[arch]
        assert (cfg.act_layer, cfg.norm_layer, cfg.downsample) == ("relu", "batchnorm", "conv1x1"), arch
        assert not (cfg.preact or cfg.linear_out or cfg.num_features), arch
        assert (config.act.value, config.eps, config.stage_strides) == ("relu", 1e-5, (2, 2, 2, 2)), arch


def test_layout_comes_from_the_tensors(timm_checkpoint):
    x, y = _layout(timm_checkpoint, "regnetx_002"), _layout(timm_checkpoint, "regnety_002")
    # Same widths and depths (w0=24, wa=36.44, wm=2.49, depth=13); only RegNetY has SE.
    assert [b.prefix for b in x.blocks] == [b.prefix for b in y.blocks]
    assert [b.prefix for b in x.blocks if b.stride == 2] == ["s1.b1", "s2.b1", "s3.b1", "s4.b1"]
    assert [b.prefix for b in x.blocks if b.projects] == ["s1.b1", "s2.b1", "s3.b1", "s4.b1"]
    assert not any(b.se for b in x.blocks) and all(b.se for b in y.blocks)
    graph = FAMILY.build(Checkpoint(timm_checkpoint("regnety_002")), FAMILY.architectures["regnety_002"])
    # Group width 8: the group count is the conv2 width over the 8 input channels each group reads.
    conv2 = [n for n in graph.nodes if n.kind is OpKind.CONV2D and n.name.endswith(".conv2.conv")]
    assert all(n.attrs.groups == n.type.shape[1] // 8 for n in conv2)
    # The SE squeezes to a quarter of the block's input width: s1.b1 reads the 32-channel stem.
    assert graph.node("s1.b1.se.fc1").type.shape[1] == 8


def test_wrong_squeeze_excite_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        state["s3.b2.se.fc2.weight"] = state["s3.b2.se.fc2.weight"][:, :4].contiguous()

    folder = rewritten_checkpoint(timm_checkpoint("regnety_002"), tmp_path / "y002", narrow)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"regnety_002: tensor 's3\.b2\.se\.fc2\.weight' has shape \(152, 4, 1, 1\); expected rank 4 with dim 0 = 152, dim 1 = 38",
    )


def test_a_final_conv_is_refused_rather_than_dropped(timm_checkpoint, tmp_path, monkeypatch):
    """RegNetZ-style heads add `final_conv`; building without it would silently compute another net."""
    def extend(state):
        state["final_conv.conv.weight"] = torch.zeros(1280, 368, 1, 1)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "x002", extend)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"regnetx_002: the checkpoint holds tensors this layout does not use: final_conv\.conv\.weight"
    )
