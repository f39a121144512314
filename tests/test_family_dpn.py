"""Dual Path Networks against timm: fp32 parity for every size, fp16/bf16 on the photos, layout and refusals."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from support import (
    check_parity,
    forbid_weight_reads,
    load_timm,
    random_pixels,
    relative_error,
    rewritten_checkpoint,
    save_photo_calibrated_checkpoint,
)
from trtmc.backends.torch_lowering import GraphModule
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.dpn import FAMILY, derive_layout
from trtmc.graph import OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "dpn68"


def _build(folder, config=None):
    arch = Checkpoint(folder).config.architecture
    return FAMILY.build(Checkpoint(folder), config or FAMILY.architectures[arch])


def _fp32_error(folder, graph, reference=None) -> float:
    """max |Δlogit| / max |logit| against timm on one random image (the large sizes are slow on CI)."""
    x = random_pixels(folder, batch=1)
    reference = load_timm(folder) if reference is None else reference
    with torch.no_grad():
        return relative_error(GraphModule(graph).eval()(x), reference(x))


@pytest.mark.parametrize("arch", sorted(FAMILY.architectures))
def test_fp32_logits_match_timm_and_every_conv_is_timms(arch, timm_checkpoint, record_property):
    folder = timm_checkpoint(arch)
    graph, reference = _build(folder), load_timm(folder)
    error = _fp32_error(folder, graph, reference)
    record_property("fp32_rel_err", error)
    assert error <= 1e-4, f"{arch}: max |Δlogit| / max |logit| = {error:.3g}"
    # The classifier is a 1x1 convolution in timm's DPN as well.
    convs = sorted(n.name for n in graph.nodes if n.kind is OpKind.CONV2D)
    assert convs == sorted(name for name, m in reference.named_modules() if isinstance(m, torch.nn.Conv2d))


def test_dpn68_keeps_top1_on_every_photo_in_fp16_and_bf16(timm_checkpoint, tmp_path_factory, record_property):
    """On a checkpoint that decides like a trained one (support.save_photo_calibrated_checkpoint):
    with random classifier rows the 1000 logits are near-ties and bf16 flips a few photos.

    The photos go in at 128x128 (the checkpoint's input_size says so; DPN is fully convolutional up
    to its global pool): torch's CPU convolutions in fp16/bf16 run ~10x slower than in fp32, and at
    224x224 this one test would take ~80 s of the CI budget.
    """
    small = tmp_path_factory.mktemp("dpn68_128")
    source = timm_checkpoint(SMALLEST)
    shutil.copy(source / "model.safetensors", small / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["pretrained_cfg"]["input_size"] = [3, 128, 128]
    (small / "config.json").write_text(json.dumps(config))
    folder = save_photo_calibrated_checkpoint(small, tmp_path_factory.mktemp("dpn68_photos"))
    report = check_parity(folder)
    record_property("parity", report)
    assert report["fp32_rel_err"] <= 1e-4, report
    for precision, max_kl in (("fp16", 1e-3), ("bf16", 5e-2)):
        got = report[precision]
        assert got["finite"] and got["top1_agree"] == 1.0 and got["kl"] < max_kl, f"{precision}: {report}"


def test_bf16_graph_runs_every_convolution_in_bf16(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint("dpn68b")), "bf16")
    nodes = assign_precision(graph, PrecisionPolicy("bf16")).nodes
    math = [n for n in nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR, OpKind.MATMUL)]
    assert math and all(n.type.dtype.value == "bf16" for n in math), [str(n) for n in math if n.type.dtype.value != "bf16"]


def test_norms_use_timms_eps_1e3(timm_checkpoint):
    """timm builds every DPN norm with eps=0.001; PyTorch's default 1e-5 moves the logits."""
    folder = timm_checkpoint(SMALLEST)
    config = dataclasses.replace(FAMILY.architectures[SMALLEST], eps=1e-5)
    assert _fp32_error(folder, _build(folder, config)) > 1e-3


def test_stride_groups_and_split_convs_come_from_the_tensors(timm_checkpoint):
    def layout(arch):
        return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])

    dpn68, dpn68b, dpn107 = layout("dpn68"), layout("dpn68b"), layout("dpn107")
    heads = [(b.prefix, b.projection, b.stride) for b in dpn68.blocks if b.projection]
    assert heads == [
        ("features.conv2_1", "c1x1_w_s1", 1),
        ("features.conv3_1", "c1x1_w_s2", 2),
        ("features.conv4_1", "c1x1_w_s2", 2),
        ("features.conv5_1", "c1x1_w_s2", 2),
    ]
    assert len(dpn68.blocks) == 3 + 4 + 12 + 3 and len(dpn107.blocks) == 4 + 8 + 20 + 3
    # dpn68: small, k_r=128, inc_sec=(16, 32, 32, 64); dpn107: inc_sec=(20, 64, 64, 128).
    assert [(b.residual, b.inc) for b in dpn68.blocks if b.projection] == [(64, 16), (128, 32), (256, 32), (512, 64)]
    assert [b.inc for b in dpn107.blocks if b.projection] == [20, 64, 64, 128]
    assert not any(b.split_convs for b in dpn68.blocks) and all(b.split_convs for b in dpn68b.blocks)
    graph = _build(timm_checkpoint("dpn107"))
    assert graph.node("features.conv1_1.conv").attrs.padding == (3, 3, 3, 3)  # 7x7 stem, not dpn68's 3x3
    assert {graph.node(f"features.conv{s}_1.c3x3_b.conv").attrs.groups for s in range(2, 6)} == {50}


def test_missing_key_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    name = "features.conv4_7.c3x3_b.bn.running_var"
    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "d", lambda s: s.pop(name))
    forbid_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' is missing for dpn68"):
        build_graph(Checkpoint(folder))


def test_grouped_conv_of_the_wrong_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        key = "features.conv3_2.c3x3_b.conv.weight"
        state[key] = state[key][:, :3].contiguous()  # 256 inputs no longer split into groups of 3

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "d", narrow)
    forbid_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"dpn68: features\.conv3_2\.c3x3_b\.conv\.weight \(256, 3, 3, 3\) does not split"):
        build_graph(Checkpoint(folder))


def test_a_projection_inside_a_stage_is_refused(timm_checkpoint, tmp_path, monkeypatch):
    def project(state):
        for leaf in ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "conv.weight"):
            state[f"features.conv3_3.c1x1_w_s1.{leaf}"] = state[f"features.conv3_1.c1x1_w_s2.{leaf}"].clone()

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "d", project)
    forbid_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"dpn68: features\.conv3_3 has projections \['c1x1_w_s1'\]"):
        build_graph(Checkpoint(folder))


def test_tensors_the_layout_does_not_use_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    folder = rewritten_checkpoint(
        timm_checkpoint(SMALLEST), tmp_path / "d", lambda s: s.update({"head.fc.weight": torch.zeros(10, 832)})
    )
    forbid_weight_reads(monkeypatch)
    with pytest.raises(UnsupportedModel, match=r"dpn68: the checkpoint holds tensors this layout does not use: head\.fc\.weight"):
        build_graph(Checkpoint(folder))
