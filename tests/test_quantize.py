"""FP8 / INT8 quantization: the precision rows, Q/DQ in the graph, the recipe's layer choice,
calibration, the pass, and its torch lowering against a fake-quantization reference written here."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from support import photos_for
from trtmc.backends import EngineSpec
from trtmc.backends import tensorrt
from trtmc.backends.torch_lowering import GraphModule, find_quantized_gemms, row_scaled_mm, to_fx
from trtmc.graph import (
    Activation,
    DType,
    Graph,
    GraphError,
    InputAttrs,
    Node,
    OpKind,
    QuantAttrs,
    TensorType,
)
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.fold_batch_norm import fold_batch_norm
from trtmc.passes.precision import PrecisionPolicy, UnmatchedOverride, assign_precision
from trtmc.passes.quantize import choose_layers, quantize
from trtmc.precision import COMPUTE_PRECISIONS, PRECISIONS, QUANTIZED_FORMATS, UnknownPrecision
from trtmc.quantization import (
    FP8_RECIPE,
    INT8_RECIPE,
    CalibrationError,
    CalibrationScales,
    LayerOverride,
    QuantRecipe,
    calibrate,
)

RECIPES = {"fp8": FP8_RECIPE, "int8": INT8_RECIPE}
QUANTIZED_OPS = {"pw1", "pw2", "pw3", "mlp"}  # what the default recipe picks in the small net below


# ---- a small network, as a graph and as plain torch ----------------------------------------------


def small_net_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Weights for a net with every kind of layer the recipe decides on: a stem, pointwise
    convolutions (two reading one tensor), a depthwise one, a squeeze-excite on a 1x1 map, a linear
    op on tokens and a classifier on a pooled vector; batch norms after each convolution."""
    r = np.random.default_rng(seed)
    shapes = {
        "stem": (16, 3, 3, 3), "pw1": (32, 16, 1, 1), "dw": (32, 1, 3, 3), "pw2": (32, 32, 1, 1),
        "pw3": (32, 32, 1, 1), "se.reduce": (8, 32, 1, 1), "se.expand": (32, 8, 1, 1),
        "mlp": (48, 32), "head": (10, 48),
    }
    weights = {}
    for name, shape in shapes.items():
        weights[f"{name}.w"] = (r.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
        weights[f"{name}.b"] = (r.standard_normal(shape[0]) * 0.1).astype(np.float32)
    for name in ("stem", "pw1", "dw", "pw2", "pw3"):
        channels = shapes[name][0]
        weights[f"{name}.bn.scale"] = (r.random(channels) + 0.5).astype(np.float32)
        weights[f"{name}.bn.shift"] = (r.standard_normal(channels) * 0.1).astype(np.float32)
    return weights


def small_net(w: dict[str, np.ndarray]) -> Graph:
    g = GraphBuilder()

    def conv_bn(x, name, **kwargs):
        y = g.conv2d(x, name, w[f"{name}.w"], w[f"{name}.b"], **kwargs)
        return g.activation(g.scale(y, f"{name}.bn", w[f"{name}.bn.scale"], w[f"{name}.bn.shift"]), Activation.RELU, f"{name}.act")

    x = g.input("pixels", (1, 3, 16, 16))
    y = conv_bn(conv_bn(x, "stem", padding=1), "pw1")
    y = conv_bn(y, "dw", padding=1, groups=32)
    y = g.add(conv_bn(y, "pw2"), conv_bn(y, "pw3"), "merge")
    s = g.conv2d(g.global_avg_pool(y, "se.pool", keepdim=True), "se.reduce", w["se.reduce.w"], w["se.reduce.b"])
    s = g.conv2d(g.activation(s, Activation.RELU, "se.act"), "se.expand", w["se.expand.w"], w["se.expand.b"])
    y = g.mul(y, g.activation(s, Activation.SIGMOID, "se.gate"), "se.mul")
    t = g.transpose(g.reshape(y, (32, 256), "tokens"), (0, 2, 1), "tokens.t")
    t = g.activation(g.linear(t, "mlp", w["mlp.w"], w["mlp.b"]), Activation.GELU, "mlp.act")
    pooled = g.reduce(t, "pool", "mean", (1,), keepdim=False)
    g.output(g.linear(pooled, "head", w["head.w"], w["head.b"]))
    return g.finish()


def fold(w: dict[str, np.ndarray], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A convolution with its batch norm folded in, in float64 and stored as float32."""
    scale, shift = w[f"{name}.bn.scale"].astype(np.float64), w[f"{name}.bn.shift"].astype(np.float64)
    weight = w[f"{name}.w"].astype(np.float64) * scale[:, None, None, None]
    bias = w[f"{name}.b"].astype(np.float64) * scale + shift
    return torch.from_numpy(weight.astype(np.float32)), torch.from_numpy(bias.astype(np.float32))


def fake_quantize(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """x on the format's grid and back: E4M3 saturates at +-448 and rounds in its cast; INT8 rounds
    half to even and saturates to [-128, 127]."""
    if fmt == "fp8":
        return (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale
    return torch.round(x / scale).clamp(-128.0, 127.0) * scale


def fake_quantize_weight(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """Per output channel: scale = max |w| over the channel / the format's largest value."""
    largest = 448.0 if fmt == "fp8" else 127.0
    amax = weight.abs().reshape(weight.shape[0], -1).amax(1).double()
    scale = (amax / largest).float().reshape((-1,) + (1,) * (weight.dim() - 1))
    return fake_quantize(weight, scale, fmt)


def reference(x: torch.Tensor, w: dict[str, np.ndarray], amax: dict[str, float] | None = None, fmt: str | None = None):
    """The small net in torch; with `fmt`, its pointwise convolutions and token linear op are fake
    quantized (static per-tensor inputs from `amax`, per-channel folded weights); without, it also
    returns max |x| at the input of every convolution and linear op."""
    seen: dict[str, float] = {}
    largest = {"fp8": 448.0, "int8": 127.0}.get(fmt)

    def op_input(name, x):
        seen[name] = float(x.abs().amax())
        if fmt and name in QUANTIZED_OPS:
            return fake_quantize(x, torch.tensor(np.float32(amax[name] / largest)), fmt)
        return x

    def weight(name, value):
        return fake_quantize_weight(value, fmt) if fmt and name in QUANTIZED_OPS else value

    def conv_bn(x, name, **kwargs):
        kernel, bias = fold(w, name)
        return F.relu(F.conv2d(op_input(name, x), weight(name, kernel), bias, **kwargs))

    def plain(name):
        return torch.from_numpy(w[f"{name}.w"]), torch.from_numpy(w[f"{name}.b"])

    y = conv_bn(conv_bn(x, "stem", padding=1), "pw1")
    y = conv_bn(y, "dw", padding=1, groups=32)
    y = conv_bn(y, "pw2") + conv_bn(y, "pw3")
    s = F.conv2d(op_input("se.reduce", y.mean((2, 3), keepdim=True)), *plain("se.reduce"))
    s = F.conv2d(op_input("se.expand", F.relu(s)), *plain("se.expand"))
    t = (y * torch.sigmoid(s)).reshape(-1, 32, 256).transpose(1, 2)
    mlp_w, mlp_b = plain("mlp")
    t = F.gelu(F.linear(op_input("mlp", t), weight("mlp", mlp_w), mlp_b))
    logits = F.linear(op_input("head", t.mean(1)), *plain("head"))
    return logits if fmt else (logits, seen)


@pytest.fixture(scope="module")
def net():
    w = small_net_weights()
    batches = [torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    folded = fold_batch_norm(small_net(w))
    return w, folded, batches, calibrate(folded, batches)


def quantized(net, fmt: str = "fp8", precision: str = "fp32", recipe: QuantRecipe | None = None) -> Graph:
    _, folded, _, scales = net
    return quantize(assign_precision(folded, PrecisionPolicy(precision)), recipe or RECIPES[fmt], scales)


# ---- the precision table ---------------------------------------------------------------------------


def test_fp8_and_int8_are_quantized_rows_that_no_compute_precision_option_offers():
    fp8, int8 = PRECISIONS["fp8"], PRECISIONS["int8"]
    assert (fp8.dtype, fp8.torch_dtype, fp8.tensorrt_name, fp8.largest) == (DType.F8E4M3, torch.float8_e4m3fn, "FP8", 448.0)
    assert (int8.dtype, int8.torch_dtype, int8.tensorrt_name, int8.largest) == (DType.I8, torch.int8, "INT8", 127.0)
    assert QUANTIZED_FORMATS == ("fp8", "int8") and not set(QUANTIZED_FORMATS) & set(COMPUTE_PRECISIONS)
    with pytest.raises(UnknownPrecision, match="fp32, fp16, bf16"):
        PrecisionPolicy("fp8")
    with pytest.raises(UnknownPrecision, match="fp8, int8"):
        QuantRecipe(format="fp16")


def round_trip_graph(fmt: str, scale: float) -> Graph:
    """pixels -> quantize -> dequantize, per tensor, as the pass writes it."""
    dtype = PRECISIONS[fmt].dtype
    attrs = QuantAttrs("s", None, dtype)
    nodes = [
        Node("x", OpKind.INPUT, (), InputAttrs(), TensorType((1, 4096), DType.F32), "x"),
        Node("x.q", OpKind.QUANTIZE, ("x",), attrs, TensorType((1, 4096), dtype), "x"),
        Node("x.dq", OpKind.DEQUANTIZE, ("x.q",), attrs, TensorType((1, 4096), DType.F32), "x"),
    ]
    return Graph(nodes=nodes, weights={"s": np.array([scale], np.float32)}, outputs=["x.dq"])


@pytest.mark.parametrize("fmt", QUANTIZED_FORMATS)
def test_quantize_then_dequantize_stays_within_half_a_grid_step_and_saturates_past_amax(fmt):
    amax = 6.0
    scale = float(np.float32(amax / PRECISIONS[fmt].largest))
    module = GraphModule(round_trip_graph(fmt, scale))
    x = torch.linspace(-amax, amax, 4096).reshape(1, -1)
    error = (module(x) - x).abs()
    if fmt == "fp8":
        # E4M3 keeps 3 mantissa bits: half a step is 2^-4 of the value; subnormal steps are 2^-9 * scale.
        bound = torch.maximum(x.abs() * 2.0**-4, torch.tensor(scale * 2.0**-10))
    else:
        bound = torch.full_like(x, scale / 2)
    assert bool((error <= bound * (1 + 1e-6)).all())
    assert float((error / bound).max()) > 0.9  # the bound is the real one, not a loose one
    past = module(torch.tensor([[2 * amax, -2 * amax] + [0.0] * 4094]))[0, :2]
    low, high = PRECISIONS[fmt].saturation
    assert past.tolist() == pytest.approx([high * scale, low * scale], rel=1e-6)


# ---- the graph: Q/DQ pairs, the weight path, and what verify refuses --------------------------------


def test_quantized_graph_verifies_prints_its_weight_path_and_survives_json(net):
    graph = quantized(net, "fp8", "fp16")
    graph.verify()
    text = str(graph)
    assert "%pw1.input.q : f8e4m3[1,16,16,16] = quantize(%stem.act, format=f8e4m3)" in text
    assert "%pw1.weight.q : f8e4m3[32,16,1,1] = constant()" in text
    assert "%pw1.weight.dq : f16[32,16,1,1] = dequantize(%pw1.weight.q, axis=0, format=f8e4m3)" in text
    assert "%pw1 : f16[1,32,16,16] = conv2d(%pw1.input.dq, %pw1.weight.dq," in text
    again = Graph.from_json(json.loads(graph.dumps()), graph.weights)
    assert again.nodes == graph.nodes


def with_inputs(graph: Graph, name: str, inputs: tuple[str, ...]) -> Graph:
    nodes = [dataclasses.replace(n, inputs=inputs) if n.name == name else n for n in graph.nodes]
    return Graph(nodes=nodes, weights=graph.weights, outputs=graph.outputs)


def test_verify_refuses_a_dequantize_without_its_quantize(net):
    graph = with_inputs(quantized(net), "pw1.input.dq", ("stem.act",))
    with pytest.raises(GraphError, match=r"dequantize 'pw1.input.dq' reads 'stem.act' \(f32\), not f8e4m3: a dequantize reads the output of its quantize"):
        graph.verify()


def test_verify_refuses_a_quantized_tensor_read_by_a_float_op(net):
    graph = with_inputs(quantized(net, "int8"), "pw1", ("pw1.input.q", "pw1.weight.dq"))
    with pytest.raises(GraphError, match=r"conv2d 'pw1' reads 'pw1.input.q', a quantized i8 tensor: only a dequantize reads"):
        graph.verify()


def test_verify_refuses_a_quantized_convolution_whose_weight_is_not_dequantized(net):
    graph = with_inputs(quantized(net), "pw1", ("pw1.input.dq", "stem.act"))
    with pytest.raises(GraphError, match=r"conv 'pw1' has no weight in its attributes, so it must read its input and a dequantized weight"):
        graph.verify()


def test_verify_refuses_a_per_channel_scale_of_the_wrong_length(net):
    graph = quantized(net)
    graph.weights["pw1.weight_scale"] = graph.weights["pw1.weight_scale"][:16]
    with pytest.raises(GraphError, match=r"'pw1.weight_scale' has shape \(16,\), per index of axis 0 .* needs \(32,\)"):
        graph.verify()


# ---- the recipe: which layers ----------------------------------------------------------------------


def test_default_recipe_keeps_stem_depthwise_squeeze_excite_and_classifier_in_the_compute_precision(net):
    _, folded, _, scales = net
    reasons = {c.name: c.reason for c in choose_layers(folded, FP8_RECIPE, scales)}
    assert {n for n, r in reasons.items() if r == "quantized"} == QUANTIZED_OPS
    assert reasons["stem"] == "stem (3 input channels)"
    assert reasons["dw"] == "grouped (groups=32)"
    assert reasons["se.reduce"] == reasons["se.expand"] == reasons["head"] == "one position per image (a 1x1 map or a pooled vector)"
    classifier_on_tokens = dataclasses.replace(FP8_RECIPE, keep_single_position=False)
    assert {c.name: c.reason for c in choose_layers(folded, classifier_on_tokens, scales)}["head"] == "classifier"


def test_name_glob_overrides_decide_before_the_structure(net):
    _, folded, _, scales = net
    recipe = QuantRecipe(overrides=(LayerOverride("pw[12]", False), LayerOverride("dw", True)))
    chosen = {c.name for c in choose_layers(folded, recipe, scales) if c.quantize}
    assert chosen == {"pw3", "mlp", "dw"}
    with pytest.raises(UnmatchedOverride, match=r"pattern 'blocks\.\*' matches no convolution or linear op; .* e\.g\. "):
        choose_layers(folded, QuantRecipe(overrides=(LayerOverride("blocks.*", False),)), scales)


def test_a_recipe_survives_json_as_study_reports_keep_it():
    recipe = QuantRecipe("int8", per_channel_weights=False, overrides=(LayerOverride("blocks.*.se.*", True),))
    assert QuantRecipe.from_json(json.loads(json.dumps(recipe.to_json()))) == recipe
    assert FP8_RECIPE.to_json()["outlier_ratio"] == 20.0 and FP8_RECIPE.precision.largest == 448.0


def test_a_scale_above_20x_the_median_of_its_kind_stays_in_the_compute_precision(net):
    _, folded, _, scales = net
    amax = dict(scales.input_amax)
    amax["pw3"] = 50 * max(amax[n] for n in QUANTIZED_OPS)  # the median of the four is at most the others' max
    choices = {c.name: c for c in choose_layers(folded, FP8_RECIPE, CalibrationScales(amax))}
    assert not choices["pw3"].quantize and choices["pw3"].reason.startswith("outlier: activation scale")
    assert all(choices[n].quantize for n in QUANTIZED_OPS - {"pw3"})


def test_recipe_picks_the_38_pointwise_convolutions_of_ghostnet_100_that_the_seed_quantized(timm_checkpoint):
    """The seed's GhostNet FP8 study quantized 38 of 95 convolutions: the pointwise ones on maps
    larger than 1x1. The rest: the stem, 41 depthwise convolutions, 15 squeeze-excite and head
    convolutions on 1x1 maps. The classifier, a linear op on the pooled vector, stays too."""
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph

    folder = timm_checkpoint("ghostnet_100")
    folded = fold_batch_norm(build_graph(Checkpoint(folder), "fp32")[1])
    choices = choose_layers(folded, FP8_RECIPE, calibrate(folded, [photos_for(folder)[:2]]))
    convs = [c for c in choices if c.kind is OpKind.CONV2D]
    reasons = [c.reason.split(" (")[0] for c in convs]
    assert len(convs) == 95 and sum(c.quantize for c in convs) == 38
    assert (reasons.count("stem"), reasons.count("grouped"), reasons.count("one position per image")) == (1, 41, 15)
    assert all(folded.node(c.name).attrs.weight is not None and folded.node(c.name).attrs.groups == 1 for c in convs if c.quantize)
    (linear,) = [c for c in choices if c.kind is OpKind.LINEAR]
    assert (linear.name, linear.quantize) == ("classifier", False)


# ---- calibration -----------------------------------------------------------------------------------


def test_calibration_records_max_abs_input_of_every_convolution_and_linear_op(net):
    w, _, batches, scales = net
    expected: dict[str, float] = {}
    for batch in batches:
        for name, value in reference(batch, w)[1].items():
            expected[name] = max(expected.get(name, 0.0), value)
    assert scales.input_amax.keys() == expected.keys()
    for name, value in expected.items():
        assert scales.input_amax[name] == pytest.approx(value, rel=1e-6), name


def test_calibration_scales_survive_json_and_refuse_what_they_cannot_hold(net):
    scales = dataclasses.replace(net[3], images=("a.jpg", "b.jpg"))
    again = CalibrationScales.from_json(json.loads(json.dumps(scales.to_json())))
    assert again == scales and again.images == ("a.jpg", "b.jpg")
    assert again.activation_scale("pw1", PRECISIONS["int8"]) == scales.input_amax["pw1"] / 127
    with pytest.raises(CalibrationError, match="'pw1' is nan: every amax must be finite"):
        CalibrationScales({"pw1": float("nan")})
    with pytest.raises(CalibrationError, match="no scale for op 'pw9': calibrate this graph"):
        scales.amax("pw9")


def test_calibration_runs_the_float32_graph_only(net):
    fp16 = assign_precision(net[1], PrecisionPolicy("fp16"))
    with pytest.raises(CalibrationError, match="calibration runs the float32 graph, but .* is f16: calibrate before"):
        calibrate(fp16, net[2])


# ---- the pass ----------------------------------------------------------------------------------------


def test_quantize_keeps_the_compute_precision_and_casts_of_everything_it_does_not_select(net):
    typed = assign_precision(net[1], PrecisionPolicy("fp16"))
    graph = quantize(typed, FP8_RECIPE, net[3])
    before = {n.name: n for n in typed.nodes}
    for node in graph.nodes:
        if node.name in before and node.name not in QUANTIZED_OPS:
            assert node == before[node.name]
    kinds = [n.kind for n in graph.nodes]
    # pw2 and pw3 read one tensor: one quantize/dequantize pair serves both.
    assert (kinds.count(OpKind.QUANTIZE), kinds.count(OpKind.DEQUANTIZE)) == (3, 3 + 4)
    assert {n.type.dtype for n in graph.nodes if n.kind is OpKind.DEQUANTIZE} == {DType.F16}
    assert not {f"{n}.weight" for n in QUANTIZED_OPS} & set(graph.weights)


def test_quantized_weights_are_on_the_grid_of_the_folded_kernel_with_one_scale_per_output_channel(net):
    w, folded, _, _ = net
    graph = quantized(net, "int8")
    values, scale = graph.weights["pw1.weight_q"], graph.weights["pw1.weight_scale"]
    kernel = fold(w, "pw1")[0].numpy()
    assert np.array_equal(values, np.round(values)) and np.abs(values).max() == 127
    np.testing.assert_allclose(scale, np.abs(kernel).reshape(32, -1).max(1) / 127, rtol=1e-6)
    per_tensor = quantized(net, recipe=QuantRecipe(per_channel_weights=False))
    assert per_tensor.weights["pw1.weight_scale"].shape == (1,) and per_tensor.node("pw1.weight.dq").attrs.axis is None


def test_quantize_refuses_a_batch_norm_it_would_have_to_fold_and_a_graph_quantized_twice(net):
    w, _, _, scales = net
    with pytest.raises(GraphError, match="'pw1' is followed by batch norm 'pw1.bn': .* run fold_batch_norm before quantize"):
        quantize(small_net(w), FP8_RECIPE, scales)
    with pytest.raises(GraphError, match="already quantized"):
        quantize(quantized(net), FP8_RECIPE, scales)


def test_precision_is_assigned_before_quantization_not_after(net):
    with pytest.raises(GraphError, match="precision is assigned once"):
        assign_precision(quantized(net), PrecisionPolicy("fp16"))


# ---- the torch lowering against fake quantization written above ------------------------------------


@pytest.mark.parametrize("fmt", QUANTIZED_FORMATS)
def test_quantized_graph_gives_the_logits_of_an_independent_fake_quantization_to_1e5(net, fmt):
    w, _, batches, scales = net
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(7)) * 1.5  # saturates some inputs
    with torch.no_grad():
        ours = GraphModule(quantized(net, fmt))(x)
        expected = reference(x, w, dict(scales.input_amax), fmt)
        unquantized = reference(x, w)[0]
    error = float((ours - expected).abs().max() / expected.abs().max())
    assert error < 1e-5
    assert float((unquantized - expected).abs().max() / expected.abs().max()) > 100 * max(error, 1e-7)


def test_quantized_graph_traces_to_fx_and_computes_the_same(net):
    graph = quantized(net, "fp8", "fp16")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(to_fx(graph)(x), GraphModule(graph)(x))


# ---- FP8 / INT8 GEMMs for 1x1 convolutions and linear ops (CUDA's path, its numerics on the CPU) -----


@pytest.mark.parametrize("fmt", QUANTIZED_FORMATS)
def test_quantized_gemms_are_the_pointwise_ops_whose_widths_are_multiples_of_16(net, fmt):
    gemms = find_quantized_gemms(quantized(net, fmt))
    assert set(gemms) == {"pw1", "pw2", "pw3", "mlp"}
    assert {g.format for g in gemms.values()} == {PRECISIONS[fmt].dtype}
    everything = quantized(net, fmt, recipe=QuantRecipe(fmt, keep_single_position=False, keep_classifier=False))
    assert set(find_quantized_gemms(everything)) == {"pw1", "pw2", "pw3", "mlp"}  # se.reduce gives 8 channels, head 10


def test_int8_gemms_leave_out_ops_with_too_few_rows_per_image_for_int_mm(net):
    # se.expand (8 -> 16 channels would qualify by width if it had 16 inputs) and the head run on one
    # row per image: torch._int_mm needs more than 16 rows, so only FP8 may take such ops.
    recipe = QuantRecipe("int8", keep_single_position=False, keep_classifier=False)
    graph = quantized(net, "int8", recipe=recipe)
    single = {n.name for n in graph.nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR) and n.attrs.weight is None
              and (n.type.shape[2:] == (1, 1) if n.kind is OpKind.CONV2D else len(n.type.shape) == 2)}
    assert single and not single & set(find_quantized_gemms(graph))


@pytest.mark.parametrize("fmt, gemm_op", [("fp8", row_scaled_mm), ("int8", torch._int_mm)])
def test_quantized_gemms_give_the_logits_of_the_dequantized_convolutions_in_fp32(net, fmt, gemm_op):
    graph = quantized(net, fmt, "fp32")
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    gemms = GraphModule(graph, quantized_gemms=True)
    traced = torch.fx.symbolic_trace(gemms)  # the batch is free: the row-wise scales trace
    with torch.no_grad():
        expected, got = GraphModule(graph)(x), gemms(x)
        assert torch.equal(traced(x), got)
    assert set(gemms._gemms) == {"pw1", "pw2", "pw3", "mlp"}
    assert sum(n.target is gemm_op for n in traced.graph.nodes) == 4
    assert not any(n.target is gemm_op for n in to_fx(graph).graph.nodes)  # off unless asked for
    assert relative(got, expected) < 1e-5


@pytest.mark.parametrize("cpu_scales_rows", [True, False], ids=["row-wise kernel", "per-tensor kernel"])
def test_a_row_scaled_fp8_gemm_gives_the_scaled_product_whichever_scales_the_cpu_kernel_takes(monkeypatch,
                                                                                                cpu_scales_rows):
    from trtmc.backends import torch_lowering

    if cpu_scales_rows and not torch_lowering._cpu_scales_rows():
        cpu_scales_rows = False  # this PyTorch's CPU kernel scales per tensor only (2.11): both cases take the fallback
    monkeypatch.setattr(torch_lowering, "_cpu_scales_rows", lambda: cpu_scales_rows)
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(5, 32, generator=g).to(torch.float8_e4m3fn)
    matrix = torch.randn(24, 32, generator=g).to(torch.float8_e4m3fn).t()
    scale_a, scale_b = torch.full((5, 1), 0.25), torch.rand(1, 24, generator=g) + 0.5
    expected = rows.float() @ matrix.float() * scale_a * scale_b
    got = row_scaled_mm(rows, matrix, scale_a, scale_b, torch.float32)
    assert got.dtype is torch.float32 and relative(got, expected) < 1e-6


@pytest.mark.parametrize("precision, ulp", [("fp16", 2.0**-10), ("bf16", 2.0**-7)])
def test_a_scaled_mm_gemm_rounds_its_half_result_once(net, precision, ulp):
    # pw1 is the first GEMM, so both paths read the same input; later ones differ by what earlier
    # roundings pass through the quantizers between them.
    graph = quantized(net, "fp8", precision)
    first = Graph(nodes=graph.nodes, weights=graph.weights, outputs=["pw1"])
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = GraphModule(first, half_convolutions_in_fp32=True)(x).float()
        got = GraphModule(first, quantized_gemms=True)(x)
    assert got.dtype is PRECISIONS[precision].torch_dtype
    assert relative(got.float(), expected) <= 2 * ulp


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


# ---- TensorRT: every quantized op shape builds (lite0's convolutions: test_quantize_lite0.py) ------


@pytest.mark.skipif(tensorrt.trt is None, reason="neither tensorrt nor tensorrt_rtx imports")
@pytest.mark.parametrize("fmt", QUANTIZED_FORMATS)
@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_tensorrt_plans_build_for_quantized_convolutions_token_and_vector_linear_ops(net, fmt, per_channel):
    recipe = QuantRecipe(fmt, per_channel, keep_single_position=False, keep_classifier=False)
    graph = quantized(net, fmt, "fp16", recipe)
    assert {n.name for n in graph.nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR) and n.attrs.weight is None} == (
        QUANTIZED_OPS | {"se.reduce", "se.expand", "head"}  # 1x1 maps, tokens [1, 256, 32] and a vector [1, 48]
    )
    record = tensorrt.build(graph, EngineSpec("tensorrt", "cuda", "fp16", max_batch=2)).record
    assert record["plan_bytes"] > 0
    assert record["layer_precisions"]["DEQUANTIZE"] == {PRECISIONS[fmt].dtype.value: 6 + 7}  # 7 weights, 6 inputs: pw2 and pw3 share one
