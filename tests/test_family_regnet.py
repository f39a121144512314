"""RegNetX and RegNetY against timm; layout and refusals."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from support import check_parity, load_timm, random_pixels, relative_error, save_photo_calibrated_checkpoint, trtmc_module
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.regnet import FAMILY, derive_layout
from trtmc.graph import OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "regnetx_002"


def _layout(timm_checkpoint, arch):
    return derive_layout(Checkpoint(timm_checkpoint(arch)), FAMILY.architectures[arch])


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
    with torch.no_grad():
        error = relative_error(trtmc_module(folder)(x), load_timm(folder)(x))
    record_property("fp32_rel_err", error)
    assert error <= 1e-4, f"{arch}: max |Δlogit| / max |logit| = {error:.3g}"


def test_regnetx_002_keeps_top1_in_fp16_and_bf16(timm_checkpoint, tmp_path, record_property):
    report = check_parity(save_photo_calibrated_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "photo"))
    record_property("parity", report)
    assert report["fp32_rel_err"] <= 1e-4, report
    # timm's own model cast to bf16 reaches KL 4.2e-3 on these logits (fp16: 2.8e-5).
    for precision, kl in (("fp16", 1e-3), ("bf16", 1e-2)):
        got = report[precision]
        assert got["finite"] and got["top1_agree"] == 1.0 and got["kl"] < kl, f"{precision}: {report}"


def test_bf16_graph_runs_every_convolution_and_linear_in_bf16(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint("regnety_002")), "bf16")
    nodes = assign_precision(graph, PrecisionPolicy("bf16")).nodes
    math = [n for n in nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR, OpKind.MATMUL)]
    assert math and all(n.type.dtype.value == "bf16" for n in math), [str(n) for n in math if n.type.dtype.value != "bf16"]


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


def test_missing_key_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    folder = _rewrite(timm_checkpoint(SMALLEST), tmp_path / "x002", lambda s: s.pop("s2.b1.downsample.bn.running_var"))
    _refuse_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"tensor 's2\.b1\.downsample\.bn\.running_var' is missing"):
        build_graph(Checkpoint(folder))


def test_wrong_squeeze_excite_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        state["s3.b2.se.fc2.weight"] = state["s3.b2.se.fc2.weight"][:, :4].contiguous()

    folder = _rewrite(timm_checkpoint("regnety_002"), tmp_path / "y002", narrow)
    _refuse_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"regnety_002: tensor 's3\.b2\.se\.fc2\.weight' has shape \(152, 4, 1, 1\); expected rank 4 with dim 0 = 152, dim 1 = 38"):
        build_graph(Checkpoint(folder))


def test_a_final_conv_is_refused_rather_than_dropped(timm_checkpoint, tmp_path, monkeypatch):
    """RegNetZ-style heads add `final_conv`; building without it would silently compute another net."""
    def extend(state):
        state["final_conv.conv.weight"] = torch.zeros(1280, 368, 1, 1)

    folder = _rewrite(timm_checkpoint(SMALLEST), tmp_path / "x002", extend)
    _refuse_weight_reads(monkeypatch)
    with pytest.raises(UnsupportedModel, match=r"regnetx_002: the checkpoint holds tensors this layout does not use: final_conv\.conv\.weight"):
        build_graph(Checkpoint(folder))
