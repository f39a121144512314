"""Inception-v3: block classes from branch names, timm's paddings and eps, the auxiliary head, refusals.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from support import assert_refused_before_weights_load, fp32_relative_error, rewritten_checkpoint
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families.inception_v3 import FAMILY, decode_branch, derive_layout

ARCH = "inception_v3"


def test_block_classes_and_widths_come_from_the_tensors(timm_checkpoint):
    layout = derive_layout(Checkpoint(timm_checkpoint(ARCH)), FAMILY.architectures[ARCH])
    assert [(b.prefix, b.kind) for b in layout.blocks] == [
        ("Mixed_5b", "A"), ("Mixed_5c", "A"), ("Mixed_5d", "A"), ("Mixed_6a", "B"), ("Mixed_6b", "C"),
        ("Mixed_6c", "C"), ("Mixed_6d", "C"), ("Mixed_6e", "C"), ("Mixed_7a", "D"), ("Mixed_7b", "E"), ("Mixed_7c", "E"),
    ]
    graph = FAMILY.build(Checkpoint(timm_checkpoint(ARCH)))
    # InceptionC's channels_7x7 (128, 160, 160, 192) and InceptionA's pool_features (32, 64, 64) are read
    # from the shapes; the blocks' outputs are timm's comments in forward_preaux / forward_postaux.
    assert [graph.node(f"Mixed_6{x}.branch7x7_1.conv").type.shape[1] for x in "bcde"] == [128, 160, 160, 192]
    assert [graph.node(f"Mixed_5{x}").type.shape[1:] for x in "bcd"] == [(256, 35, 35), (288, 35, 35), (288, 35, 35)]
    assert graph.node("Mixed_6e").type.shape[1:] == (768, 17, 17)
    assert graph.node("Mixed_7c").type.shape[1:] == (2048, 8, 8)
    assert graph.node("Mixed_7b.branch3x3_2").type.shape[1] == 768  # the 1x3 and 3x1 pair, concatenated


def test_paddings_follow_timms_modules_not_the_kernels(timm_checkpoint):
    """Conv2d_2a and Conv2d_2b are both 3x3 stride 1, but only 2b pads; strided convs never pad;
    the factorized 1x7 and 7x1 convs pad only along their long axis."""
    graph = FAMILY.build(Checkpoint(timm_checkpoint(ARCH)))
    padding = {name: graph.node(f"{name}.conv").attrs.padding for name in (
        "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "Conv2d_4a_3x3", "Mixed_6a.branch3x3",
        "Mixed_6b.branch7x7_2", "Mixed_6b.branch7x7_3", "Mixed_5b.branch5x5_2",
    )}
    assert padding == {
        "Conv2d_1a_3x3": (0, 0, 0, 0), "Conv2d_2a_3x3": (0, 0, 0, 0), "Conv2d_2b_3x3": (1, 1, 1, 1),
        "Conv2d_4a_3x3": (0, 0, 0, 0), "Mixed_6a.branch3x3": (0, 0, 0, 0),
        "Mixed_6b.branch7x7_2": (0, 3, 0, 3), "Mixed_6b.branch7x7_3": (3, 0, 3, 0), "Mixed_5b.branch5x5_2": (2, 2, 2, 2),
    }
    assert graph.node("Mixed_5b.avg_pool").attrs.count_include_pad  # F.avg_pool2d's default


def test_norms_use_timms_eps_1e3(timm_checkpoint):
    """InceptionV3 builds its ConvNormAct norms with norm_eps=1e-3; PyTorch's default 1e-5 moves the logits."""
    folder = timm_checkpoint(ARCH)
    config = dataclasses.replace(FAMILY.architectures[ARCH], eps=1e-5)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-3


def test_torchvisions_auxiliary_head_is_checked_and_left_out_of_the_graph(timm_checkpoint, tmp_path):
    """inception_v3.tv_in1k carries AuxLogits, which only training runs; the graph is the one without it."""
    import timm

    aux = {k: v for k, v in timm.create_model(ARCH, aux_logits=True).state_dict().items() if k.startswith("AuxLogits.")}
    plain = timm_checkpoint(ARCH)
    with_aux = rewritten_checkpoint(plain, tmp_path / "tv", lambda state: state.update(aux))
    graph = FAMILY.build(Checkpoint(with_aux))
    assert graph.nodes == FAMILY.build(Checkpoint(plain)).nodes
    assert not any(n.name.startswith("AuxLogits") for n in graph.nodes)

    def misshape(state):
        state.update(aux)
        state["AuxLogits.conv1.conv.weight"] = state["AuxLogits.conv1.conv.weight"][:, :64].contiguous()

    with pytest.raises(CheckpointError, match=r"'AuxLogits\.conv1\.conv\.weight' has shape \(768, 64, 5, 5\)"):
        derive_layout(Checkpoint(rewritten_checkpoint(plain, tmp_path / "bad", misshape)), FAMILY.architectures[ARCH])


def test_a_missing_block_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    """Mixed_6c keeps its 768 channels, so the widths alone would not miss it; the class order does."""
    def drop_block(state):
        for name in [n for n in state if n.startswith("Mixed_6c.")]:
            del state[name]

    folder = rewritten_checkpoint(timm_checkpoint(ARCH), tmp_path / "i", drop_block)
    assert_refused_before_weights_load(
        folder, monkeypatch, CheckpointError, r"are of classes AAABCCCDEE; inception_v3 has AAABCCCCDEE"
    )


def test_branch_grammar_rejects_unknown_tokens():
    assert [step.stride for step in decode_branch("a/s2 b/valid c")] == [2, 1, 1]
    with pytest.raises(ValueError, match=r"unknown token 'a/s3' in 'a/s3 b'"):
        decode_branch("a/s3 b")
