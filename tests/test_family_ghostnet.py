"""GhostNet v1 against timm: fp32 parity for every width, fp16/bf16 on the photos, layout and refusals."""

from __future__ import annotations

import dataclasses

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
    trtmc_module,
)
from trtmc.backends.torch_lowering import GraphModule
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import UnsupportedModel, build_graph
from trtmc.families.ghostnet import FAMILY, derive_layout
from trtmc.graph import Activation, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "ghostnet_050"


def _fp32_error(folder, graph=None) -> float:
    """max |Δlogit| / max |logit| against timm on two random images; `graph` replaces the family's."""
    x = random_pixels(folder, batch=2)
    ours = trtmc_module(folder) if graph is None else GraphModule(graph).eval()
    with torch.no_grad():
        return relative_error(ours(x), load_timm(folder)(x))


@pytest.mark.parametrize("arch", sorted(FAMILY.architectures))
def test_fp32_logits_match_timm(arch, timm_checkpoint, record_property):
    error = _fp32_error(timm_checkpoint(arch))
    record_property("fp32_rel_err", error)
    assert error <= 1e-4, f"{arch}: max |Δlogit| / max |logit| = {error:.3g}"


def test_ghostnet_050_keeps_top1_on_every_photo_in_fp16_and_bf16(timm_checkpoint, tmp_path_factory, record_property):
    """On a checkpoint that decides like a trained one (support.save_photo_calibrated_checkpoint):
    with the plain random weights, fp16 overflows past blocks.7 and bf16 top-1 is a coin toss."""
    folder = save_photo_calibrated_checkpoint(timm_checkpoint(SMALLEST), tmp_path_factory.mktemp("ghostnet_050_photos"))
    report = check_parity(folder)
    record_property("parity", report)
    assert report["fp32_rel_err"] <= 1e-4, report
    for precision, max_kl in (("fp16", 1e-4), ("bf16", 1e-2)):
        got = report[precision]
        assert got["finite"] and got["top1_agree"] == 1.0 and got["kl"] < max_kl, f"{precision}: {report}"


def test_bf16_graph_runs_every_convolution_and_linear_in_bf16(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint("ghostnet_100")), "bf16")
    nodes = assign_precision(graph, PrecisionPolicy("bf16")).nodes
    math = [n for n in nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR, OpKind.MATMUL)]
    assert math and all(n.type.dtype.value == "bf16" for n in math), [str(n) for n in math if n.type.dtype.value != "bf16"]


def test_blocks_with_conv_dw_are_exactly_timms_stride_2_blocks(timm_checkpoint):
    folder = timm_checkpoint("ghostnet_100")
    layout = derive_layout(Checkpoint(folder), FAMILY.architectures["ghostnet_100"])
    timm_blocks = [block for stage in load_timm(folder).blocks[:-1] for block in stage]
    assert [b.stride for b in layout.blocks] == [b.stride for b in timm_blocks]
    assert [b.prefix for b in layout.blocks if b.stride == 2] == ["blocks.1.0", "blocks.3.0", "blocks.5.0", "blocks.7.0"]
    # Shortcuts project exactly where timm's do: a width change or a stride.
    assert [b.conv_shortcut for b in layout.blocks] == [len(b.shortcut) > 0 for b in timm_blocks]
    assert [b.has_se for b in layout.blocks] == [b.se is not None for b in timm_blocks]


def test_node_names_are_timm_module_paths(timm_checkpoint):
    folder = timm_checkpoint("ghostnet_100")
    graph = FAMILY.build(Checkpoint(folder), FAMILY.architectures["ghostnet_100"])
    modules = dict(load_timm(folder).named_modules())
    convs = sorted(n.name for n in graph.nodes if n.kind is OpKind.CONV2D)
    assert convs == sorted(name for name, m in modules.items() if isinstance(m, torch.nn.Conv2d))
    norms = {n.name for n in graph.nodes if n.kind is OpKind.SCALE}
    assert norms == {name for name, m in modules.items() if isinstance(m, torch.nn.BatchNorm2d)}
    gates = [n for n in graph.nodes if n.name.endswith(".se.gate")]
    assert gates and all(n.attrs.fn is Activation.HARD_SIGMOID and n.name in modules for n in gates)


def test_se_gate_is_timms_hard_sigmoid_not_a_sigmoid(timm_checkpoint):
    """The ArchConfig pins the gate the tensors cannot show: a sigmoid gate moves the logits."""
    folder = timm_checkpoint(SMALLEST)
    config = dataclasses.replace(FAMILY.architectures[SMALLEST], se_gate=Activation.SIGMOID)
    assert _fp32_error(folder, FAMILY.build(Checkpoint(folder), config)) > 1e-2


def test_missing_key_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    name = "blocks.6.3.ghost2.cheap_operation.1.running_var"
    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "g", lambda s: s.pop(name))
    forbid_weight_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' is missing for ghostnet_050"):
        build_graph(Checkpoint(folder))


def test_wrong_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def narrow(state):
        state["blocks.3.0.ghost1.primary_conv.0.weight"] = state["blocks.3.0.ghost1.primary_conv.0.weight"][:, :8].contiguous()

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "g", narrow)
    forbid_weight_reads(monkeypatch)
    with pytest.raises(
        CheckpointError,
        match=r"ghostnet_050: tensor 'blocks\.3\.0\.ghost1\.primary_conv\.0\.weight' has shape \(18, 8, 1, 1\); "
        r"expected rank 4 with dim 1 = 12",
    ):
        build_graph(Checkpoint(folder))


def test_ghostnet_v2_tensors_are_refused(timm_checkpoint, tmp_path, monkeypatch):
    """A v2 checkpoint under a v1 name must not build as v1 with its attention branches dropped."""
    folder = rewritten_checkpoint(timm_checkpoint("ghostnetv2_100"), tmp_path / "v2", lambda state: None)
    config = (folder / "config.json").read_text().replace('"ghostnetv2_100"', '"ghostnet_100"')
    (folder / "config.json").write_text(config)
    forbid_weight_reads(monkeypatch)
    with pytest.raises(UnsupportedModel, match=r"ghostnet_100: the checkpoint holds tensors this layout does not use: blocks\.2\.0\.ghost1\.short_conv"):
        build_graph(Checkpoint(folder))
