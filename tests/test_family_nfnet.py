"""NFNet: parity with live residual branches, the gains and padding the tensors cannot show, beta from the
block count, fp16/bf16 on the photos, refusals before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py. timm starts
every residual branch at zero (conv3's gain, or dm_'s skipinit_gain), so a random checkpoint alone checks
little more than the stem, the projections and the head: the tests here make the branches live first.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from support import (
    assert_keeps_top1,
    assert_refused_before_weights_load,
    check_parity,
    fp32_relative_error,
    load_timm,
    reconfigured_checkpoint,
    rewritten_checkpoint,
    save_photo_calibrated_checkpoint,
)
from trtmc.checkpoint import Checkpoint
from trtmc.families import UnsupportedModel
from trtmc.families.nfnet import FAMILY, Attention, derive_layout

SMALLEST = "eca_nfnet_l0"
# Measured on the live, photo-calibrated eca_nfnet_l0 at 128 px: KL 5.2e-6 in fp16 and 4.1e-4 in bf16,
# where timm's own model cast to bf16 reaches 5.2e-4 (fp16: 7.8e-6).
LIVE_MAX_KL = {"fp16": 1e-4, "bf16": 2e-3}


def _live(state):
    """Random gains (every conv's and skipinit's) and conv biases, where timm starts at 1, 0 or zero."""
    gen = torch.Generator().manual_seed(5)
    for name, value in state.items():
        if name.endswith(".gain") or name.endswith("skipinit_gain"):
            state[name] = torch.rand(value.shape, generator=gen) * 0.5 + 0.75
        elif name.endswith(".bias") and not name.startswith("head."):
            state[name] = torch.randn(value.shape, generator=gen) * 0.1


@pytest.fixture(scope="module")
def live(timm_checkpoint, tmp_path_factory):
    cache = {}

    def make(arch):
        if arch not in cache:
            cache[arch] = rewritten_checkpoint(timm_checkpoint(arch), tmp_path_factory.mktemp("live") / arch, _live)
        return cache[arch]

    return make


@pytest.mark.parametrize("arch", sorted(FAMILY.architectures))
def test_live_residual_branches_match_timm(live, arch):
    folder = live(arch)
    with torch.no_grad():
        model = load_timm(folder)
        assert all(float(block.conv3.gain.abs().min()) > 0.5 for stage in model.stages for block in stage)
    assert fp32_relative_error(folder, reference=model) <= 1e-4


@pytest.mark.parametrize("wrong", [{"gamma_in_act": False}, {"same_padding": False}, {"alpha": 0.1}, {"attn_gain": 1.0}])
def test_what_the_dm_tensors_cannot_say_moves_the_logits(live, wrong):
    folder = live("dm_nfnet_f0")
    config = replace(FAMILY.architectures["dm_nfnet_f0"], **wrong)
    assert fp32_relative_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-3


def test_every_served_nfnet_is_configured_as_timm_builds_it():
    from timm.models.nfnet import model_cfgs

    for arch, config in FAMILY.architectures.items():
        cfg = model_cfgs[arch]
        assert (cfg.act_layer, cfg.gamma_in_act, cfg.same_padding) == (config.act.value, config.gamma_in_act, config.same_padding)
        assert (cfg.std_conv_eps, cfg.alpha, cfg.attn_gain, cfg.stem_type) == (config.std_conv_eps, config.alpha, config.attn_gain, "deep_quad")


def test_beta_follows_the_expected_variance_over_the_blocks_the_tensors_number(timm_checkpoint):
    layout = derive_layout(Checkpoint(timm_checkpoint("nfnet_l0")), FAMILY.architectures["nfnet_l0"])
    model = load_timm(timm_checkpoint("nfnet_l0"))
    timm_betas = [block.beta for stage in model.stages for block in stage]
    assert [b.beta for b in layout.blocks] == pytest.approx(timm_betas, rel=1e-12)
    assert len(set(timm_betas)) > 2  # (1, 2, 6, 3) blocks: the variance grows within each stage


def test_attention_kind_comes_from_the_tensors(timm_checkpoint):
    se = derive_layout(Checkpoint(timm_checkpoint("dm_nfnet_f0")), FAMILY.architectures["dm_nfnet_f0"])
    eca = derive_layout(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    assert {b.attention for b in se.blocks} == {Attention.SQUEEZE_EXCITE} and all(b.skipinit for b in se.blocks)
    assert {b.attention for b in eca.blocks} == {Attention.ECA} and not any(b.skipinit for b in eca.blocks)
    graph = FAMILY.build(Checkpoint(timm_checkpoint(SMALLEST)), FAMILY.architectures[SMALLEST])
    # ECA's kernel follows the width (log2); its weight holds it, and the padding keeps the channel count.
    model = load_timm(timm_checkpoint(SMALLEST))
    for block in eca.blocks:
        stage, index = map(int, block.prefix.split(".")[1:])
        pad = model.stages[stage][index].attn_last.conv.padding[0]
        assert graph.node(f"{block.prefix}.attn_last.conv").attrs.padding == (pad, 0, pad, 0), block.prefix


def test_live_smallest_model_keeps_timms_top1_on_every_photo_in_fp16_and_bf16(live, tmp_path, record_property):
    # 128 px for CPU time, as the shared photo checks do; the net is fully convolutional up to its pool.
    folder = reconfigured_checkpoint(live(SMALLEST), tmp_path / "resized", input_size=128)
    report = check_parity(save_photo_calibrated_checkpoint(folder, tmp_path / "photo-calibrated"))
    record_property("parity", report)
    assert report["fp32_rel_err"] <= 1e-4, report
    assert_keeps_top1(report, LIVE_MAX_KL)


def test_a_mid_block_attention_is_refused_rather_than_dropped(timm_checkpoint, tmp_path, monkeypatch):
    """NF-RegNets put their attention between conv2 and conv3 (`attn`), which this family does not emit."""
    def add_attn(state):
        state["stages.1.0.attn.fc1.weight"] = torch.zeros(64, 128, 1, 1)

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "reg", add_attn)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"eca_nfnet_l0: the checkpoint holds tensors this layout does not use: stages\.1\.0\.attn\.fc1\.weight"
    )


def test_an_odd_map_under_a_ceil_mode_shortcut_pool_is_refused(timm_checkpoint, tmp_path, monkeypatch):
    """176 px: the stem leaves 44, then 22 and 11, which stages.3.0's 2x2 ceil-mode pool cannot halve."""
    folder = reconfigured_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "176", input_size=176)
    assert_refused_before_weights_load(
        folder, monkeypatch, UnsupportedModel, r"eca_nfnet_l0: stages\.3\.0\.downsample\.pool average-pools a 11x11 map with ceil_mode"
    )
