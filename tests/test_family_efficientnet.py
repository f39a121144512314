"""EfficientNet, EfficientNet-Lite and MobileNetV2 against timm, and the real Lite0 weights on photos."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from parity_extras import assert_top1_kept, calibrated, low_precision_report
from support import LITE0, REFERENCE, load_timm, photos_for, random_pixels, relative_error, trtmc_module
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.efficientnet import ARCHITECTURES, FAMILY, TF_EPS, TIMM_EPS, BlockKind, decode_stages, derive_layout
from trtmc.graph import OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "mobilenetv2_100"


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_fp32_logits_match_timm(arch, timm_checkpoint, record_property):
    folder = timm_checkpoint(arch)
    x = random_pixels(folder, batch=1)
    with torch.no_grad():
        error = relative_error(trtmc_module(folder)(x), load_timm(folder)(x))
    record_property("fp32_rel_err", error)
    assert error <= 1e-4, f"{arch}: max |Δlogit| / max |logit| = {error:.3g}"


def test_smallest_model_keeps_top1_in_fp16_and_bf16(timm_checkpoint, record_property):
    folder = calibrated(timm_checkpoint(SMALLEST))  # statistics fitted to photos: see parity_extras
    photos = photos_for(folder)
    with torch.no_grad():
        expected = load_timm(folder)(photos)
        report = {p: low_precision_report(trtmc_module(folder, p)(photos).float(), expected) for p in ("fp16", "bf16")}
    record_property("parity", report)
    for precision, got in report.items():
        assert_top1_kept(got, precision)


def test_real_lite0_weights_give_timms_top5_on_every_photo(record_property):
    reference = json.loads(REFERENCE.read_text())["images"]
    photos = photos_for(LITE0)
    with torch.no_grad():
        logits = trtmc_module(LITE0)(photos)
    names = sorted(reference)
    assert len(names) == photos.shape[0] == 22
    worst = 0.0
    for name, row in zip(names, logits):
        want = reference[name]
        top5 = row.topk(5).indices.tolist()
        assert top5[0] == want["top5"][0], f"{name}: top-1 {top5[0]}, timm {want['top5'][0]}"
        assert set(top5) == set(want["top5"]), f"{name}: top-5 {top5}, timm {want['top5']}"
        delta = (row[want["top5"]] - torch.tensor(want["top5_logits"])).abs().max().item()
        worst = max(worst, delta)
        assert delta <= 0.05, f"{name}: top-5 logits differ from timm's by {delta:.4f}"
    record_property("max_top5_logit_delta", worst)


def test_real_lite0_weights_keep_top1_in_fp16_and_bf16(record_property):
    photos = photos_for(LITE0)
    with torch.no_grad():
        expected = load_timm(LITE0)(photos)
        report = {p: low_precision_report(trtmc_module(LITE0, p)(photos).float(), expected) for p in ("fp16", "bf16")}
    record_property("parity", report)
    for precision, got in report.items():
        assert_top1_kept(got, precision)


def test_bf16_graph_runs_every_convolution_and_linear_in_bf16(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint("efficientnet_b0")), "bf16")
    nodes = assign_precision(graph, PrecisionPolicy("bf16")).nodes
    math = [n for n in nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR, OpKind.MATMUL)]
    assert math and all(n.type.dtype.value == "bf16" for n in math), [str(n) for n in math if n.type.dtype.value != "bf16"]


def test_tf_variant_pads_same_and_uses_eps_1e3(timm_checkpoint):
    """efficientnet_b0 and tf_efficientnet_b0 have the same tensors; only the ArchConfig tells them apart."""
    ours, tf = Checkpoint(timm_checkpoint("efficientnet_b0")), Checkpoint(timm_checkpoint("tf_efficientnet_b0"))
    assert {k: ours.shape(k) for k in ours.names} == {k: tf.shape(k) for k in tf.names}
    timm_cfg, tf_cfg = ARCHITECTURES["efficientnet_b0"], ARCHITECTURES["tf_efficientnet_b0"]
    assert (timm_cfg.eps, timm_cfg.tf_same) == (TIMM_EPS, False)
    assert (tf_cfg.eps, tf_cfg.tf_same) == (TF_EPS, True)
    timm_graph, tf_graph = FAMILY.build(tf, timm_cfg), FAMILY.build(tf, tf_cfg)
    # 224 -> 112 with a 3x3 stride-2 kernel: TF puts the one pixel of padding after, timm on both sides.
    assert timm_graph.node("conv_stem").attrs.padding == (1, 1, 1, 1)
    assert tf_graph.node("conv_stem").attrs.padding == (0, 0, 1, 1)
    gamma, var = tf.tensor("bn1.weight"), tf.tensor("bn1.running_var")
    for graph, eps in ((timm_graph, TIMM_EPS), (tf_graph, TF_EPS)):
        scale = graph.weights[graph.node("bn1").attrs.scale]
        np.testing.assert_allclose(scale, gamma / np.sqrt(var + eps), rtol=1e-6)


def test_layout_comes_from_the_tensors(timm_checkpoint):
    """Stage strides come from the config; block classes, SE, widths and skips from the keys."""
    b0 = derive_layout(Checkpoint(timm_checkpoint("efficientnet_b0")), ARCHITECTURES["efficientnet_b0"])
    lite = derive_layout(Checkpoint(timm_checkpoint("tf_efficientnet_lite0")), ARCHITECTURES["tf_efficientnet_lite0"])
    assert [b.prefix for b in b0.blocks if b.stride == 2] == ["blocks.1.0", "blocks.2.0", "blocks.3.0", "blocks.5.0"]
    assert b0.blocks[0].kind is BlockKind.DEPTHWISE_SEPARABLE and not b0.blocks[0].skip  # 32 -> 16 channels
    assert all(b.kind is BlockKind.INVERTED_RESIDUAL for b in b0.blocks[1:])
    assert all(b.se for b in b0.blocks) and not any(b.se for b in lite.blocks)
    assert [b.prefix for b in b0.blocks if b.skip] == [
        "blocks.1.1", "blocks.2.1", "blocks.3.1", "blocks.3.2", "blocks.4.1", "blocks.4.2",
        "blocks.5.1", "blocks.5.2", "blocks.5.3",
    ]
    assert b0.head_width == lite.head_width == 1280


def _edited_copy(source, folder, edit):
    folder.mkdir()
    (folder / "config.json").write_text((source / "config.json").read_text())
    state = load_file(str(source / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"))
    return Checkpoint(folder)


def test_missing_key_is_refused_before_weights_load(timm_checkpoint, tmp_path):
    ckpt = _edited_copy(timm_checkpoint("tf_efficientnet_lite0"), tmp_path / "c", lambda s: s.pop("blocks.2.1.bn2.running_var"))
    with pytest.raises(CheckpointError, match=r"tensor 'blocks\.2\.1\.bn2\.running_var' is missing for tf_efficientnet_lite0"):
        build_graph(ckpt)
    assert ckpt.reads == 0


def test_wrong_width_is_refused_before_weights_load(timm_checkpoint, tmp_path):
    def narrow(state):
        state["blocks.3.0.conv_pwl.weight"] = state["blocks.3.0.conv_pwl.weight"][:72].contiguous()

    ckpt = _edited_copy(timm_checkpoint("tf_efficientnet_lite0"), tmp_path / "c", narrow)
    # blocks.3.0 now writes 72 channels; blocks.3.1 still reads 80.
    with pytest.raises(CheckpointError, match=r"'blocks\.3\.1\.conv_pw\.weight' has shape \(480, 80, 1, 1\); expected rank 4 with dim 1 = 72"):
        build_graph(ckpt)
    assert ckpt.reads == 0


def test_a_module_the_layout_cannot_place_is_unsupported(timm_checkpoint, tmp_path):
    def add_layer_scale(state):
        state["blocks.1.1.layer_scale.gamma"] = torch.ones(24)

    ckpt = _edited_copy(timm_checkpoint("tf_efficientnet_lite0"), tmp_path / "c", add_layer_scale)
    with pytest.raises(UnsupportedModel, match=r"does not use: blocks\.1\.1\.layer_scale\.gamma \(24,\)"):
        build_graph(ckpt)
    assert ckpt.reads == 0


def test_stage_grammar_rejects_unknown_tokens():
    assert decode_stages("s1 s2_nre")[1].stride == 2
    with pytest.raises(ValueError, match=r"unknown token 'k3' in 's1 s2_k3'"):
        decode_stages("s1 s2_k3")
