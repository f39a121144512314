import json

import numpy as np
import pytest
import torch

from trtmc.backends.torch_lowering import LOWERINGS, TORCH_DTYPES, GraphModule, depthwise_taps_nodes, vector_product_nodes
from trtmc.graph import Activation, DType, Graph, GraphError, OpKind
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, UnmatchedOverride, assign_precision
from trtmc.precision import COMPUTE_PRECISIONS, PRECISIONS, QUANTIZED_FORMATS, precision_of


def small_net() -> Graph:
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.input("pixels", (1, 3, 16, 16))
    y = g.conv2d(x, "stem.conv", rng.standard_normal((8, 3, 3, 3)), stride=2, padding=(0, 0, 1, 1))
    y = g.scale(y, "stem.bn", rng.random(8) + 0.5, rng.standard_normal(8))
    y = g.activation(y, Activation.SILU, "stem.act")
    y = g.conv2d(y, "blocks.0.conv_dw", rng.standard_normal((8, 1, 3, 3)), padding=1, groups=8)
    t = g.reshape(y, (8, 64), "blocks.0.tokens")
    t = g.transpose(t, (0, 2, 1), "blocks.0.tokens")
    attn = g.matmul(t, t, "blocks.0.attn", transpose_b=True, sensitive=True)
    attn = g.softmax(attn, -1, "blocks.0.softmax")
    t = g.matmul(attn, t, "blocks.0.attn_v", sensitive=True)
    t = g.layer_norm(t, "blocks.0.norm", np.ones(8), np.zeros(8), 1e-6)
    y = g.reduce(t, "head.pool", "mean", (1,), keepdim=False)
    y = g.linear(y, "head.fc", rng.standard_normal((5, 8)), rng.standard_normal(5))
    g.output(y)
    return g.finish()


def test_graph_prints_one_line_per_node_like_fx():
    text = str(small_net())
    assert "%blocks.0.conv_dw : f32[1,8,8,8] = conv2d(%stem.act" in text
    assert "groups=8" in text
    assert text.splitlines()[-1] == "return %head.fc"


def test_graph_survives_a_json_round_trip():
    graph = assign_precision(small_net(), PrecisionPolicy("fp16"))
    again = Graph.from_json(json.loads(graph.dumps()), graph.weights)
    assert str(again) == str(graph)


def test_verify_rejects_a_read_before_definition():
    graph = small_net()
    graph.nodes[1], graph.nodes[2] = graph.nodes[2], graph.nodes[1]
    with pytest.raises(GraphError, match="before it is defined"):
        graph.verify()


def test_builder_rejects_a_convolution_whose_weight_does_not_fit_the_input():
    g = GraphBuilder()
    x = g.input("pixels", (1, 3, 8, 8))
    with pytest.raises(GraphError, match="input has 3 channels"):
        g.conv2d(x, "conv", np.zeros((4, 5, 3, 3)))


def test_bf16_build_keeps_convolutions_and_matmuls_in_bf16():
    graph = assign_precision(small_net(), PrecisionPolicy("bf16"))
    math_ops = [n for n in graph.nodes if n.kind in (OpKind.CONV2D, OpKind.MATMUL, OpKind.LINEAR)]
    assert math_ops and all(n.type.dtype is DType.BF16 for n in math_ops)


def test_fp16_build_keeps_sensitive_ops_in_fp32():
    graph = assign_precision(small_net(), PrecisionPolicy("fp16"))
    dtypes = {n.name: n.type.dtype for n in graph.nodes}
    assert dtypes["blocks.0.attn"] is DType.F32
    assert dtypes["blocks.0.softmax"] is DType.F32
    assert dtypes["blocks.0.norm"] is DType.F32
    assert dtypes["stem.conv"] is DType.F16


def test_name_pattern_override_wins_over_the_precision():
    policy = PrecisionPolicy("fp16", overrides=(("stem.*", DType.F32),))
    graph = assign_precision(small_net(), policy)
    dtypes = {n.name: n.type.dtype for n in graph.nodes}
    assert dtypes["stem.conv"] is DType.F32 and dtypes["blocks.0.conv_dw"] is DType.F16


def test_precision_pass_inserts_casts_so_every_edge_is_typed():
    graph = assign_precision(small_net(), PrecisionPolicy("fp16"))
    graph.verify()  # raises on any edge whose dtypes differ without a cast
    assert graph.node(graph.outputs[0]).type.dtype is DType.F32
    assert graph.inputs[0].type.dtype is DType.F32


def test_every_op_kind_has_a_torch_lowering():
    assert set(LOWERINGS) == set(OpKind)


def test_torch_lowering_serves_any_batch_size():
    module = GraphModule(assign_precision(small_net(), PrecisionPolicy("fp32")))
    assert module(torch.randn(3, 3, 16, 16)).shape == (3, 5)


def test_unknown_precision_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="fp32, fp16, bf16"):
        PrecisionPolicy("int8")


def test_batch_norm_folding_removes_the_scale_and_keeps_the_function():
    from trtmc.passes.fold_batch_norm import fold_batch_norm

    graph = small_net()
    folded = fold_batch_norm(graph)
    assert [n.kind for n in folded.nodes].count(OpKind.SCALE) == 0
    assert folded.node("stem.conv").attrs.bias is not None
    x = torch.randn(2, 3, 16, 16)
    policy = PrecisionPolicy("fp32")
    before = GraphModule(assign_precision(graph, policy))(x)
    after = GraphModule(assign_precision(folded, policy))(x)
    assert torch.allclose(before, after, rtol=1e-5, atol=1e-5)


def test_concatenating_a_constant_is_refused_because_it_cannot_follow_the_batch():
    g = GraphBuilder()
    x = g.input("pixels", (1, 4, 8))
    token = g.constant("cls_token", np.zeros((1, 1, 8)))
    with pytest.raises(GraphError, match="cannot follow the batch"):
        g.concat([token, x], 1, "tokens")


def test_asymmetric_average_pooling_without_pad_counting_divides_by_real_windows():
    g = GraphBuilder()
    x = g.input("pixels", (1, 1, 3, 3))
    y = g.pool2d(x, "pool", "avg", 2, 2, (0, 0, 1, 1), count_include_pad=False)
    g.output(y)
    module = GraphModule(assign_precision(g.finish(), PrecisionPolicy("fp32")))
    out = module(torch.ones(1, 1, 3, 3))
    assert out.shape == (1, 1, 2, 2) and torch.allclose(out, torch.ones_like(out))


def test_cpu_reference_half_convolutions_round_like_native_ones():
    graph = assign_precision(small_net(), PrecisionPolicy("bf16"))
    x = torch.randn(2, 3, 16, 16)
    native = GraphModule(graph)(x)
    via_fp32 = GraphModule(graph, half_convolutions_in_fp32=True)(x)
    assert native.dtype == via_fp32.dtype == torch.float32
    assert torch.allclose(native, via_fp32, rtol=2e-2, atol=2e-2 * float(native.abs().max()))


# ---- one precision table, consumed by both lowering tables ---------------------------------------


@pytest.mark.parametrize("precision", list(PRECISIONS.values()), ids=list(PRECISIONS))
def test_every_precision_in_the_table_has_its_torch_and_tensorrt_dtypes_and_host_bytes(precision):
    from trtmc.backends.tensorrt_lowering import host_array, trt, trt_dtype

    assert TORCH_DTYPES[precision.dtype] is precision.torch_dtype
    assert precision_of(precision.dtype) is precision
    if trt is not None:
        assert trt_dtype(precision.dtype) == getattr(trt.DataType, precision.tensorrt_name)
    values = np.array([[0.1, -2.5, 300.0], [3.0e-3, 0.0, -7.75]], np.float32)  # in range of every format
    if precision.quantized:  # a quantized format holds values already scaled onto its grid
        values = np.array([[1.0, -3.0, 96.0], [0.0, 5.0, -7.0]], np.float32)
    host = host_array(values, precision.dtype)
    assert host.nbytes == values.size * precision.torch_dtype.itemsize
    as_torch = torch.from_numpy(host).view(precision.torch_dtype)
    expected = torch.from_numpy(values).to(precision.torch_dtype)
    assert torch.equal(as_torch.float(), expected.float())  # compared in fp32: 8-bit formats lack eq kernels


@pytest.mark.parametrize("name", COMPUTE_PRECISIONS)
def test_every_compute_precision_reaches_the_convolutions_of_both_lowerings(name):
    from trtmc.backends import EngineSpec
    from trtmc.backends import tensorrt as backend

    precision = PRECISIONS[name]
    graph = assign_precision(small_net(), PrecisionPolicy(name))
    module = GraphModule(graph)
    conv_weight = module.get_buffer("w_" + "stem.conv.weight".replace(".", "_"))
    assert conv_weight.dtype is precision.torch_dtype
    if backend.trt is not None:
        definition = backend.define_network(graph, EngineSpec("tensorrt", "cuda", name))
        assert definition.precisions()["CONVOLUTION"] == {precision.dtype.value: 2}


@pytest.mark.parametrize("option, offered, refused", [
    ("--precision", COMPUTE_PRECISIONS + QUANTIZED_FORMATS, "fp4"),  # fp8/int8: quantized builds (test_build_quantized)
    ("--io-dtype", COMPUTE_PRECISIONS, "int8"),
])
def test_the_cli_and_the_build_offer_the_precisions_of_the_table(option, offered, refused, tmp_path):
    from trtmc.build import BuildError, BuildRequest

    from conftest import LITE0_IN_REPO, run_cli

    choices = ", ".join(repr(p) for p in offered)
    result = run_cli("build", LITE0_IN_REPO, "-o", tmp_path / "x.bundle", option, refused, check=False)
    assert result.returncode == 2 and f"(choose from {choices})" in result.stderr
    field = option.removeprefix("--").replace("-", "_")
    with pytest.raises(BuildError, match=", ".join(offered)):
        BuildRequest(model=str(LITE0_IN_REPO), output=tmp_path / "x.bundle", **{field: refused}).validate()
    assert all(not PRECISIONS[n].quantized for n in COMPUTE_PRECISIONS)


def test_importing_the_precision_table_loads_neither_torch_nor_numpy():
    import subprocess
    import sys

    code = "import sys, trtmc.precision, trtmc.cli; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- --fp32-layers patterns must match something (issue 8) ----------------------------------------


def test_an_override_pattern_that_matches_no_op_is_refused_with_its_name_and_real_op_names():
    policy = PrecisionPolicy("fp16", overrides=(("stem.*", DType.F32), ("block.0.*", DType.F32), ("head.fcc", DType.F32)))
    with pytest.raises(UnmatchedOverride) as error:
        assign_precision(small_net(), policy)
    message = str(error.value)
    assert "'block.0.*', 'head.fcc'" in message and "'stem.*'" not in message
    assert "'blocks.0." in message  # a real op name close to the first unmatched pattern
    assert isinstance(error.value, ValueError)


def test_an_unmatched_fp32_layers_pattern_stops_the_build_with_one_line(tmp_path):
    from conftest import LITE0_IN_REPO, run_cli

    out = tmp_path / "lite0.bundle"
    result = run_cli("build", LITE0_IN_REPO, "-o", out, "-q", "--fp32-layers", "blocks.99.*", check=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "'blocks.99.*' matches no op" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_weight_sliced_from_a_longer_tensor_compiles_with_the_strides_a_bundle_loads_it_with(precision):
    # vit's patch positions are pos_embed[:, 1:]: numpy calls that view contiguous, but its batch axis keeps the
    # longer tensor's stride, and Inductor's cache keys hold strides (vit_base's load missed its cache, run 16).
    positions = np.random.default_rng(0).standard_normal((1, 5, 4)).astype(np.float32)

    def module(patch_positions):
        g = GraphBuilder()
        x = g.input("tokens", (1, 4, 4))
        g.output(g.add(x, g.constant("pos_embed", patch_positions), "pos_embed.add"))
        return GraphModule(assign_precision(g.finish(), PrecisionPolicy(precision)))

    def strides(module):
        return {name: tensor.stride() for name, tensor in [*module.named_buffers(), *module.named_parameters()]}

    built, loaded = module(positions[:, 1:]), module(positions[:, 1:].copy())
    assert positions[:, 1:].strides[0] != positions[:, 1:].copy().strides[0]
    assert strides(built) == strides(loaded) and (16, 4, 1) in strides(built).values()


@pytest.mark.parametrize(
    "kernel, stride, padding, dilation, bias",
    [(3, 1, 1, 1, True), (3, 2, (0, 0, 1, 1), 1, False), (5, 2, (1, 1, 2, 2), 1, True), (3, 1, 2, 2, True), (7, 1, 3, 1, False)],
)
def test_depthwise_taps_compute_the_depthwise_convolution(kernel, stride, padding, dilation, bias):
    # The CUDA engine's fusable form of a depthwise convolution: shifted views of the padded input times one
    # weight per channel, summed. TF "SAME" (asymmetric) padding, strides and dilation take every slice branch.
    rng = np.random.default_rng(kernel + stride)
    g = GraphBuilder()
    x = g.input("pixels", (1, 6, 15, 13))
    y = g.conv2d(x, "blocks.0.conv_dw", rng.standard_normal((6, 1, kernel, kernel)),
                 rng.standard_normal(6) if bias else None, stride=stride, padding=padding, dilation=dilation, groups=6)
    g.output(g.conv2d(y, "blocks.0.conv_pw", rng.standard_normal((4, 6, 1, 1))))
    graph = assign_precision(g.finish(), PrecisionPolicy("fp32"))
    pixels = torch.from_numpy(rng.standard_normal((2, 6, 15, 13)).astype(np.float32))
    # The depthwise op only, not the 1x1; a 7x7 kernel the engine leaves to cuDNN, but its taps are still right.
    assert depthwise_taps_nodes(graph, 1) == ({"blocks.0.conv_dw"} if kernel <= 5 else set())
    taps = GraphModule(graph, depthwise_taps=frozenset({"blocks.0.conv_dw"}))
    expected = GraphModule(graph)(pixels)
    assert torch.allclose(taps(pixels), expected, rtol=1e-5, atol=1e-5)


def test_the_cuda_engine_runs_depthwise_convolutions_as_taps_where_the_h200_measured_them_faster():
    # Batch 1: every depthwise convolution but one feeding a squeeze-excite mean (fused into its reduction, the
    # taps ran slowly); larger batches: only the narrow ones cuDNN runs with its slow direct kernel.
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.input("pixels", (1, 8, 16, 16))
    narrow = g.conv2d(x, "narrow_dw", rng.standard_normal((8, 1, 3, 3)), padding=1, groups=8)
    wide = g.conv2d(g.conv2d(narrow, "expand", rng.standard_normal((32, 8, 1, 1))), "wide_dw",
                    rng.standard_normal((32, 1, 3, 3)), padding=1, groups=32)
    excited = g.conv2d(wide, "se_dw", rng.standard_normal((32, 1, 3, 3)), padding=1, groups=32)
    excited = g.activation(excited, Activation.SILU, "se_dw.act")
    gate = g.activation(g.reduce(excited, "se.pool", "mean", (2, 3), keepdim=True), Activation.SIGMOID, "se.gate")
    g.output(g.mul(excited, gate, "se.mul"))
    graph = assign_precision(g.finish(), PrecisionPolicy("fp32"))
    assert depthwise_taps_nodes(graph, 1) == {"narrow_dw", "wide_dw"}
    assert depthwise_taps_nodes(graph, 128) == {"narrow_dw"}


def test_depthwise_kernels_wider_than_5x5_stay_on_cudnn_to_keep_the_build_short():
    # mixnet_s's mixed convolutions split their channels over 3x3 to 9x9 kernels; as taps the 7x7 and 9x9 ones
    # (49 and 81 taps each) took most of its 266 s batch-1 compile (run 15, H100).
    rng = np.random.default_rng(5)
    g = GraphBuilder()
    x = g.input("pixels", (1, 8, 16, 16))
    convs = [g.conv2d(x, f"mixed.{k}x{k}", rng.standard_normal((8, 1, k, k)), padding=k // 2, groups=8)
             for k in (3, 5, 7, 9)]
    g.output(g.concat(convs, 1, "mixed.cat"))
    graph = assign_precision(g.finish(), PrecisionPolicy("fp16"))
    assert depthwise_taps_nodes(graph, 1) == {"mixed.3x3", "mixed.5x5"}
    assert depthwise_taps_nodes(graph, 128) == {"mixed.3x3", "mixed.5x5"}  # 8 channels: narrow at any batch


def test_depthwise_convolutions_feeding_a_layer_norm_stay_convolutions_at_batch_1():
    # ConvNeXt's 7x7 depthwise convolution feeds its layer norm (in fp32, through a cast); as taps Inductor
    # fused them into the norm's reduction loop, 0.835 ms against 0.579 on cuDNN (convnext_tiny, H200).
    rng = np.random.default_rng(4)
    g = GraphBuilder()
    x = g.input("pixels", (1, 16, 14, 14))
    dw = g.conv2d(x, "block.conv_dw", rng.standard_normal((16, 1, 7, 7)), rng.standard_normal(16), padding=3, groups=16)
    normed = g.layer_norm(dw, "block.norm", np.ones(16), np.zeros(16), 1e-6, axis=1)
    permuted = g.transpose(g.conv2d(x, "other_dw", rng.standard_normal((16, 1, 3, 3)), padding=1, groups=16),
                           (0, 2, 3, 1), "other.channels_last")
    tokens = g.layer_norm(permuted, "other.norm", np.ones(16), np.zeros(16), 1e-6, axis=3)
    g.output(g.add(normed, g.transpose(tokens, (0, 3, 1, 2), "other.channels_first"), "sum"))
    for precision in ("fp32", "fp16"):
        graph = assign_precision(g.finish(), PrecisionPolicy(precision))
        assert depthwise_taps_nodes(graph, 1) == set()
        # The rule of runs 9-10, which tools/depthwise_taps_probe.py measures again: only means stop taps.
        assert depthwise_taps_nodes(graph, 1, max_kernel=7, into_norms=True) == {"block.conv_dw", "other_dw"}


def _squeeze_excite_graph(precision: str, rng):
    g = GraphBuilder()
    x = g.input("pixels", (1, 24, 7, 7))
    s = g.reduce(x, "se.pool", "mean", (2, 3), keepdim=True)
    s = g.activation(g.conv2d(s, "se.conv_reduce", rng.standard_normal((6, 24, 1, 1)), rng.standard_normal(6)),
                     Activation.RELU, "se.act1")
    s = g.conv2d(s, "se.conv_expand", rng.standard_normal((24, 6, 1, 1)), rng.standard_normal(24))
    y = g.mul(x, g.activation(s, Activation.SIGMOID, "se.gate"), "se.mul")
    g.output(g.conv2d(y, "conv_pw", rng.standard_normal((8, 24, 1, 1)) * 0.2))
    return assign_precision(g.finish(), PrecisionPolicy(precision))


def test_the_cuda_engine_runs_the_1x1_convolutions_on_1x1_maps_at_batch_1_as_products_and_a_sum():
    # A squeeze-excite's two convolutions see a pooled 1x1 map; the pointwise one on the 7x7 map stays a convolution.
    graph = _squeeze_excite_graph("fp32", np.random.default_rng(1))
    assert vector_product_nodes(graph, 1) == {"se.conv_reduce", "se.conv_expand"}
    assert vector_product_nodes(graph, 128) == set()  # at a large batch they are GEMMs for cuBLAS


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-5), ("fp16", 2e-3), ("bf16", 1e-2)])
def test_vector_products_compute_the_1x1_convolution_in_the_graphs_precision(precision, tolerance):
    # Products exact in float32 and a float32 sum, as a tensor core computes the convolution: within the
    # precision's rounding of the convolution computed in float32 (the CPU reference's half path).
    rng = np.random.default_rng(2)
    graph = _squeeze_excite_graph(precision, rng)
    pixels = torch.from_numpy(rng.standard_normal((3, 24, 7, 7)).astype(np.float32))
    dtype = TORCH_DTYPES[graph.inputs[0].type.dtype]
    products = GraphModule(graph, vector_products=vector_product_nodes(graph, 1))
    reference = GraphModule(graph, half_convolutions_in_fp32=True)
    got, expected = products(pixels.to(dtype)).float(), reference(pixels.to(dtype)).float()
    assert got.dtype == expected.dtype and torch.allclose(got, expected, rtol=tolerance, atol=tolerance)
