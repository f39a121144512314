"""MobileNetV3 small/large (timm-native and TF port) against timm."""

from __future__ import annotations

import pytest
import torch

from parity_extras import assert_top1_kept, calibrated, low_precision_report
from support import load_timm, photos_for, random_pixels, relative_error, trtmc_module
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import build_graph
from trtmc.families.efficientnet import TF_EPS, BlockKind
from trtmc.families.mobilenetv3 import ARCHITECTURES, FAMILY, derive_layout
from trtmc.graph import Activation, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "mobilenetv3_small_100"


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


def test_bf16_graph_runs_every_convolution_and_linear_in_bf16(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "bf16")
    nodes = assign_precision(graph, PrecisionPolicy("bf16")).nodes
    math = [n for n in nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR, OpKind.MATMUL)]
    assert math and all(n.type.dtype.value == "bf16" for n in math), [str(n) for n in math if n.type.dtype.value != "bf16"]


def test_early_stages_use_relu_and_se_gates_with_hard_sigmoid(timm_checkpoint):
    ckpt = Checkpoint(timm_checkpoint("mobilenetv3_large_100"))
    layout = derive_layout(ckpt, ARCHITECTURES["mobilenetv3_large_100"])
    acts = {b.prefix.rsplit(".", 1)[0]: b.act for b in layout.blocks}
    assert [acts[f"blocks.{s}"] for s in range(7)] == [Activation.RELU] * 3 + [Activation.HARD_SWISH] * 4
    assert layout.blocks[-1].kind is BlockKind.CONV_BN_ACT and layout.head_width == 1280
    assert [b.prefix for b in layout.blocks if b.stride == 2] == ["blocks.1.0", "blocks.2.0", "blocks.3.0", "blocks.5.0"]
    graph = FAMILY.build(ckpt, ARCHITECTURES["mobilenetv3_large_100"])
    assert graph.node("blocks.2.0.se.act1").attrs.fn is Activation.RELU
    assert graph.node("blocks.2.0.se.gate").attrs.fn is Activation.HARD_SIGMOID
    # The head pools before conv_head, which has a bias and no norm.
    head = graph.node("conv_head")
    assert head.type.shape == (1, 1280, 1, 1) and head.attrs.bias is not None


def test_tf_variant_pads_same_and_uses_eps_1e3(timm_checkpoint):
    tf = ARCHITECTURES["tf_mobilenetv3_large_100"]
    assert tf.eps == TF_EPS and tf.tf_same and not ARCHITECTURES["mobilenetv3_large_100"].tf_same
    graph = FAMILY.build(Checkpoint(timm_checkpoint("tf_mobilenetv3_large_100")), tf)
    assert graph.node("conv_stem").attrs.padding == (0, 0, 1, 1)
    assert graph.node("blocks.2.0.conv_dw").attrs.padding == (1, 1, 2, 2)  # 5x5 stride 2 on 56x56


def test_large_tensors_under_a_small_name_are_refused_before_weights_load(timm_checkpoint, tmp_path):
    large = timm_checkpoint("mobilenetv3_large_100")
    folder = tmp_path / "mislabelled"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(large / "model.safetensors")
    (folder / "config.json").write_text((large / "config.json").read_text().replace("mobilenetv3_large_100", "mobilenetv3_small_100"))
    ckpt = Checkpoint(folder)
    with pytest.raises(CheckpointError, match=r"mobilenetv3_small_100: the checkpoint has blocks\.<stage> indices \[0, 1, 2, 3, 4, 5, 6\], but mobilenetv3_small_100 has 6 stages"):
        build_graph(ckpt)
    assert ckpt.reads == 0
