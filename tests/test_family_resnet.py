"""ResNet, ResNet-D, SE-ResNet, ResNeXt and Wide ResNet against timm; layout and refusals."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from support import check_parity, load_timm, random_pixels, relative_error, save_photo_calibrated_checkpoint, trtmc_module
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.resnet import FAMILY, derive_layout
from trtmc.graph import OpKind, PoolMode
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "resnet18"
# A random batch-normed ResNet is chaotic: rounding grows block by block, and in resnet101 timm's own
# fp32 logits already differ from its fp64 ones by 1.0e-4 of the largest. There the bound is also
# what timm's own fp32 reaches.
DEEPEST = {"resnet101"}
# fp16/bf16 convolutions are ~10x slower than fp32 on CI's CPU: the photos run at 128 px, which a
# fully convolutional net with a global pool takes like 224 (layer4 ends at 4x4).
PHOTO_SIZE = 128


def _layout(timm_checkpoint, arch):
    return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])


def _with_input_size(source, dest, size):
    """The checkpoint at `source` (weights linked, not copied) with another pretrained input size."""
    dest.mkdir()
    os.symlink(source / "model.safetensors", dest / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["pretrained_cfg"]["input_size"] = [3, size, size]
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _rewrite(source, dest, edit):
    dest.mkdir()
    (dest / "config.json").write_text((source / "config.json").read_text())
    state = load_file(str(source / "model.safetensors"))
    edit(state)
    save_file(state, str(dest / "model.safetensors"))
    return dest


def _refuse_weight_reads(monkeypatch):
    def read(self, name):
        raise AssertionError(f"weights were read ({name}) before the layout was checked")

    monkeypatch.setattr(Checkpoint, "tensor", read)


@pytest.mark.parametrize("arch", sorted(FAMILY.architectures))
def test_fp32_logits_match_timm(arch, timm_checkpoint, record_property):
    folder = timm_checkpoint(arch)
    x = random_pixels(folder, batch=1)
    reference = load_timm(folder)
    with torch.no_grad():
        expected = reference(x)
        error = relative_error(trtmc_module(folder)(x), expected)
        bound = 1e-4
        if arch in DEEPEST:
            timm_own = relative_error(expected, reference.double()(x.double()))
            record_property("timm_fp32_vs_fp64", timm_own)
            bound = max(bound, 1.5 * timm_own)
    record_property("fp32_rel_err", error)
    assert error <= bound, f"{arch}: max |Δlogit| / max |logit| = {error:.3g} > {bound:.3g}"


def test_resnet18_keeps_top1_in_fp16_and_bf16(timm_checkpoint, tmp_path, record_property):
    small = _with_input_size(timm_checkpoint(SMALLEST), tmp_path / "small", PHOTO_SIZE)
    report = check_parity(save_photo_calibrated_checkpoint(small, tmp_path / "photo"))
    record_property("parity", report)
    assert report["fp32_rel_err"] <= 1e-4, report
    for precision, kl in (("fp16", 1e-4), ("bf16", 1e-3)):
        got = report[precision]
        assert got["finite"] and got["top1_agree"] == 1.0 and got["kl"] < kl, f"{precision}: {report}"


def test_bf16_graph_runs_every_convolution_and_linear_in_bf16(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint("seresnet50")), "bf16")
    nodes = assign_precision(graph, PrecisionPolicy("bf16")).nodes
    math = [n for n in nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR, OpKind.MATMUL)]
    assert math and all(n.type.dtype.value == "bf16" for n in math), [str(n) for n in math if n.type.dtype.value != "bf16"]


def test_basic_blocks_stride_conv1_and_bottlenecks_stride_conv2(timm_checkpoint):
    basic, bottleneck = _layout(timm_checkpoint, "resnet18"), _layout(timm_checkpoint, "resnet50")
    assert [(b.prefix, b.convs, b.strided_conv) for b in basic.blocks if b.stride == 2] == [
        ("layer2.0", 2, 1), ("layer3.0", 2, 1), ("layer4.0", 2, 1),
    ]
    assert [(b.prefix, b.convs, b.strided_conv) for b in bottleneck.blocks if b.stride == 2] == [
        ("layer2.0", 3, 2), ("layer3.0", 3, 2), ("layer4.0", 3, 2),
    ]
    # A bottleneck's first block projects 64 -> 256 without striding; a basic block's needs nothing.
    assert basic.blocks[0].shortcut is None and bottleneck.blocks[0].shortcut.conv == "layer1.0.downsample.0"
    assert len(_layout(timm_checkpoint, "resnet101").blocks) == 3 + 4 + 23 + 3


def test_d_variant_has_a_deep_stem_and_pools_before_projecting(timm_checkpoint):
    d = _layout(timm_checkpoint, "resnet50d")
    assert [(s.conv, s.norm, s.stride) for s in d.stem] == [
        ("conv1.0", "conv1.1", 2), ("conv1.3", "conv1.4", 1), ("conv1.6", "bn1", 1),
    ]
    # layer1 projects without striding: timm's downsample_avg has no pool there, only the 1x1 conv.
    assert [(b.shortcut.pool, b.shortcut.conv) for b in d.blocks if b.shortcut] == [
        (None, "layer1.0.downsample.1"),
        ("layer2.0.downsample.0", "layer2.0.downsample.1"),
        ("layer3.0.downsample.0", "layer3.0.downsample.1"),
        ("layer4.0.downsample.0", "layer4.0.downsample.1"),
    ]
    graph = FAMILY.build(Checkpoint(timm_checkpoint("resnet50d")), FAMILY.architectures["resnet50d"])
    pool = graph.node("layer2.0.downsample.0").attrs
    assert (pool.mode, pool.kernel, pool.stride, pool.count_include_pad) == (PoolMode.AVG, (2, 2), (2, 2), False)


def test_groups_and_squeeze_excite_come_from_the_tensors(timm_checkpoint):
    resnext = FAMILY.build(Checkpoint(timm_checkpoint("resnext50_32x4d")), FAMILY.architectures["resnext50_32x4d"])
    assert {resnext.node(f"layer{s}.0.conv2").attrs.groups for s in range(1, 5)} == {32}
    se = _layout(timm_checkpoint, "seresnet50")
    assert all(b.se for b in se.blocks) and not any(b.se for b in _layout(timm_checkpoint, "wide_resnet50_2").blocks)


def test_d_variant_refuses_an_input_size_whose_pooled_map_is_odd(timm_checkpoint, tmp_path, monkeypatch):
    """176 -> 88 -> 44 -> 44 -> 22 -> 11: layer4's ceil-mode average pool would keep an odd last row."""
    for arch in ("resnet50d", "resnet50"):
        _with_input_size(timm_checkpoint(arch), tmp_path / arch, 176)
    _refuse_weight_reads(monkeypatch)
    with pytest.raises(UnsupportedModel, match=r"resnet50d: layer4\.0\.downsample\.0 average-pools a 11x11 map with ceil_mode"):
        build_graph(Checkpoint(tmp_path / "resnet50d"))
    # Strided 1x1 projections floor like the 3x3 beside them: nothing to refuse without the pool.
    assert len(derive_layout(Checkpoint(tmp_path / "resnet50"), FAMILY.architectures["resnet50"]).blocks) == 16


def test_missing_key_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    folder = _rewrite(timm_checkpoint("resnet18"), tmp_path / "r18", lambda s: s.pop("layer3.1.bn2.running_var"))
    _refuse_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"tensor 'layer3\.1\.bn2\.running_var' is missing"):
        build_graph(Checkpoint(folder))


def test_wrong_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        state["layer2.1.conv1.weight"] = state["layer2.1.conv1.weight"][:, :96].contiguous()

    folder = _rewrite(timm_checkpoint("resnet18"), tmp_path / "r18", narrow)
    _refuse_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"resnet18: tensor 'layer2\.1\.conv1\.weight' has shape \(128, 96, 3, 3\), which cannot be a conv reading 128 channels"):
        build_graph(Checkpoint(folder))


def test_tensors_of_another_variant_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    """An anti-aliased or otherwise extended ResNet must not build as if its extra layers were absent."""
    def extend(state):
        state["layer2.0.aa.weight"] = torch.ones(128)

    folder = _rewrite(timm_checkpoint("resnet18"), tmp_path / "r18", extend)
    _refuse_weight_reads(monkeypatch)
    with pytest.raises(UnsupportedModel, match=r"resnet18: the checkpoint holds tensors this layout does not use: layer2\.0\.aa\.weight"):
        build_graph(Checkpoint(folder))
