"""RepVGG: training-form branches folded into one 3x3 per block at build time, the folded form accepted,
refusals before weights load. The folding itself lives in families/_reparam.py, shared with MobileOne.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import torch

from support import (
    assert_refused_before_weights_load,
    load_timm,
    random_pixels,
    relative_error,
    rewritten_checkpoint,
    trtmc_module,
)
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.repvgg import FAMILY
from trtmc.graph import OpKind

SMALLEST = "repvgg_a0"


def test_every_served_repvgg_is_a_plain_relu_rep_network_in_timm():
    """The shared ArchConfig assumes timm's defaults: ReLU, batch norm, no attention, every stage
    striding by 2 after a strided stem block."""
    from timm.models.byobnet import model_cfgs

    for arch, config in FAMILY.architectures.items():
        cfg = model_cfgs[arch]
        assert (cfg.stem_type, cfg.act_layer, cfg.norm_layer, cfg.attn_layer) == ("rep", "relu", "batchnorm", None), arch
        assert tuple(b.s for b in cfg.blocks) == config.stage_strides and config.stem_stride == 2, arch
        assert not cfg.num_features, arch  # no final_conv before the head


def test_each_block_folds_into_one_convolution_and_relu(timm_checkpoint):
    ckpt = Checkpoint(timm_checkpoint(SMALLEST))
    layout = FAMILY.derive_layout(ckpt, FAMILY.architectures[SMALLEST])
    # repvgg_a0: d=(2, 4, 14, 1) after the stem; identity branches wherever width and resolution are kept.
    assert len(layout.blocks) == 1 + 2 + 4 + 14 + 1
    assert [b.prefix for b in layout.blocks if not b.identity] == ["stem", "stages.0.0", "stages.1.0", "stages.2.0", "stages.3.0"]
    assert all(b.branches == ("conv_kxk", "conv_1x1") for b in layout.blocks)
    graph = FAMILY.build(ckpt)
    kinds = [n.kind for n in graph.nodes if n.kind not in (OpKind.INPUT, OpKind.REDUCE, OpKind.LINEAR)]
    assert kinds == [OpKind.CONV2D, OpKind.ACTIVATION] * len(layout.blocks)
    assert graph.node("stages.1.0.reparam_conv").attrs.stride == (2, 2)
    assert graph.node("stages.1.0.reparam_conv").attrs.padding == (1, 1, 1, 1)


def test_a_checkpoint_saved_folded_builds_the_same_network(timm_checkpoint, tmp_path):
    """timm.utils.reparameterize_model replaces each block's branches by `reparam_conv` (weight and
    bias); such a checkpoint builds as is and agrees with timm's training-form model."""
    from safetensors.torch import save_file
    from timm.utils import reparameterize_model

    folder = timm_checkpoint(SMALLEST)
    model = load_timm(folder)
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file({k: v.contiguous() for k, v in reparameterize_model(model).state_dict().items()}, str(fused / "model.safetensors"))
    (fused / "config.json").write_text((folder / "config.json").read_text())

    layout = FAMILY.derive_layout(Checkpoint(fused), FAMILY.architectures[SMALLEST])
    assert all(b.fused and not b.identity for b in layout.blocks)
    x = random_pixels(folder)
    with torch.no_grad():
        assert relative_error(trtmc_module(fused)(x), model(x)) <= 1e-4


def test_a_block_in_both_forms_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def half_fused(state):
        state["stages.2.3.reparam_conv.weight"] = torch.zeros(192, 192, 3, 3)
        state["stages.2.3.reparam_conv.bias"] = torch.zeros(192)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "r", half_fused)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError,
        r"repvgg_a0: stages\.2\.3 holds both the folded reparam_conv and training-form branches \['conv_kxk', 'conv_1x1', 'identity'\]",
    )


def test_branches_that_cannot_be_summed_are_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def wide_1x1(state):
        state["stages.1.2.conv_1x1.conv.weight"] = torch.zeros(96, 96, 2, 2)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "r", wide_1x1)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"repvgg_a0: the branches of stages\.1\.2 cannot be summed into one convolution"
    )


def test_an_identity_branch_on_a_strided_block_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def add_identity(state):
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            state[f"stages.1.0.identity.{leaf}"] = torch.ones(96)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "r", add_identity)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"repvgg_a0: stages\.1\.0 has an identity branch but maps 48 channels to 96 with stride 2"
    )
