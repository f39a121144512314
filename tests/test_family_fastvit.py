"""FastViT: stages, depths and each part's form (branches or folded) from the tensors, RepMixer folded into
one depthwise convolution as timm's reparameterize does, the folded checkpoint form accepted, attention
mixers refused before weights load. The MobileOne folding itself lives in families/_reparam.py.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from support import (
    assert_refused_before_weights_load,
    forbid_weight_reads,
    load_timm,
    random_pixels,
    reconfigured_checkpoint,
    relative_error,
    trtmc_module,
)
from trtmc.checkpoint import Checkpoint
from trtmc.families import UnsupportedModel
from trtmc.families.fastvit import FAMILY, derive_layout
from trtmc.graph import OpKind

SMALLEST = "fastvit_t8"


def test_every_served_fastvit_is_a_gelu_repmixer_network_without_patch_embedding_activation():
    """The shared ArchConfig holds what timm's tensors cannot say: GELU (the erf form) everywhere and no
    activation after a patch embedding's large-kernel conv (lkc_use_act=False, as the weights were trained)."""
    from timm import create_model
    from timm.models.fastvit import RepMixerBlock

    for arch, config in FAMILY.architectures.items():
        model = create_model(arch, pretrained=False)
        assert all(isinstance(block, RepMixerBlock) for stage in model.stages for block in stage.blocks), arch
        assert all(isinstance(stage.pos_emb, torch.nn.Identity) for stage in model.stages), arch
        gelus = [m for m in model.modules() if isinstance(m, torch.nn.GELU)]
        assert gelus and all(m.approximate == "none" for m in gelus) and config.act.value == "gelu", arch
        embeds = [s.downsample.proj[0] for s in model.stages if not isinstance(s.downsample, torch.nn.Identity)]
        assert embeds and all(isinstance(e.act, torch.nn.Identity) for e in embeds), arch
        assert all(e.stride == config.down_stride for e in embeds), arch


def test_layout_reads_stages_depths_and_branch_forms_from_the_tensors(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    layout = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    # A 3x3 dense and a 3x3 depthwise block each halve the map beside a 1x1 scale branch; the 1x1 keeps
    # width and resolution, so it sums a batch-normed identity.
    assert [(b.prefix, b.stride, b.branches, b.identity) for b in layout.stem] == [
        ("stem.0", 2, ("conv_kxk.0", "conv_scale"), False),
        ("stem.1", 2, ("conv_kxk.0", "conv_scale"), False),
        ("stem.2", 1, ("conv_kxk.0",), True),
    ]
    assert [len(stage.blocks) for stage in layout.stages] == [2, 2, 4, 2]
    # Stage 0 keeps the stem's width: no patch embedding. The others open with a 7x7 + 3x3 strided conv.
    assert layout.stages[0].downsample is None
    for stage in layout.stages[1:]:
        embed, project = stage.downsample
        assert (embed.stride, embed.branches, embed.identity) == (2, ("large_conv", "small_conv"), False)
        assert (project.branches, project.identity) == (("conv_kxk.0",), True)
    mixers = [block.mixer for stage in layout.stages for block in stage.blocks]
    assert all(m.branches == ("conv_kxk.0", "conv_scale") and m.identity for m in mixers)
    assert layout.final_conv.branches == ("conv_kxk.0", "conv_scale") and not layout.final_conv.identity


def test_widths_kernels_and_mlp_ratio_come_from_the_tensors(timm_checkpoint):
    graph = FAMILY.build(Checkpoint(timm_checkpoint(SMALLEST)))
    # fastvit_t8: embed_dims (48, 96, 192, 384), mlp_ratio 3, final_conv widening 2x; a 256 px input.
    for stage, width, size in ((0, 48, 64), (1, 96, 32), (2, 192, 16), (3, 384, 8)):
        assert graph.node(f"stages.{stage}.blocks.0.mlp.fc1").type.shape == (1, 3 * width, size, size)
    embed = graph.node("stages.1.downsample.proj.0.reparam_conv")
    assert graph.weights[embed.attrs.weight].shape == (96, 1, 7, 7) and embed.attrs.padding == (3, 3, 3, 3)
    assert graph.node("final_conv.reparam_conv").type.shape == (1, 768, 8, 8)


def test_repmixer_is_one_depthwise_convolution_equal_to_timms_reparameterized_kernel(timm_checkpoint):
    folder = timm_checkpoint(SMALLEST)
    graph = FAMILY.build(Checkpoint(folder))
    node = graph.node("stages.2.blocks.3.token_mixer.reparam_conv")
    assert node.kind is OpKind.CONV2D and node.attrs.groups == 192
    # Residual, norm and layer scale are inside the kernel: nothing is added or scaled around the mixer.
    assert not any(n.name.startswith("stages.2.blocks.3.token_mixer.") and n is not node for n in graph.nodes)
    mixer = copy.deepcopy(load_timm(folder).stages[2].blocks[3].token_mixer)
    mixer.reparameterize()
    np.testing.assert_allclose(graph.weights[node.attrs.weight], mixer.reparam_conv.weight.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(graph.weights[node.attrs.bias], mixer.reparam_conv.bias.detach().numpy(), atol=1e-6)


def test_a_checkpoint_saved_reparameterized_builds_the_same_network(timm_checkpoint, tmp_path):
    """timm.utils.reparameterize_model folds every MobileOne block, large-kernel conv and RepMixer into its
    `reparam_conv`; such a checkpoint builds into the same ops and agrees with timm's training-form model."""
    from safetensors.torch import save_file
    from timm.utils import reparameterize_model

    folder = timm_checkpoint(SMALLEST)
    model = load_timm(folder)
    fused = tmp_path / "fused"
    fused.mkdir()
    state = reparameterize_model(copy.deepcopy(model)).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(fused / "model.safetensors"))
    (fused / "config.json").write_text((folder / "config.json").read_text())

    layout = derive_layout(Checkpoint(fused), FAMILY.architectures[SMALLEST])
    assert all(block.mixer is None for stage in layout.stages for block in stage.blocks)
    assert all(b.fused for b in (*layout.stem, layout.final_conv))
    nodes = [(n.name, n.kind) for n in FAMILY.build(Checkpoint(fused)).nodes]
    assert nodes == [(n.name, n.kind) for n in FAMILY.build(Checkpoint(folder)).nodes]
    x = random_pixels(folder)
    with torch.no_grad():
        assert relative_error(trtmc_module(fused)(x), model(x)) <= 1e-4


def test_fastvit_sa12_is_refused_by_its_attention_mixer_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    # SA12 is S12 with attention blocks and a conditional positional encoding in the last stage.
    folder = reconfigured_checkpoint(timm_checkpoint("fastvit_sa12"), tmp_path / "sa12", architecture="fastvit_s12")
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"fastvit_s12: stages\.3\.blocks\.0 mixes tokens with attention"
    )
