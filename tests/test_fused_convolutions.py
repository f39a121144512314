"""The compiled CUDA engine's fused convolutions (convolution + bias (+ residual) + ReLU as one cuDNN call):
which ReLUs they take, what they compute (the CPU-visible reference of the custom ops), and how the engine
picks them per batch size from its record. cuDNN itself runs on the GPU only: the build's measurement of
plain against fused lowerings is the bench's (benchmarks/NOTES.md)."""

import numpy as np
import pytest
import torch

from trtmc.backends.fused_convolutions import FusedConvolution, fused_convolutions
from trtmc.backends.inductor_lowerings import FUSED, LOWERINGS, PLAIN, compile_cuda, lowering_candidates
from trtmc.backends.torch_lowering import GraphModule, channels_last_weights, to_fx, vector_product_nodes
from trtmc.graph import Activation
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision


def _bottleneck(precision: str, rng=None):
    """A stem, a ResNet bottleneck (two conv+ReLU, a conv added to a strided shortcut conv, a ReLU), a
    convolution read twice, a depthwise one and a TF-"SAME" (asymmetric) one, each followed by a ReLU."""
    rng = rng or np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5

    g = GraphBuilder()
    x = g.input("pixels", (1, 3, 16, 16))
    stem = g.activation(g.conv2d(x, "stem.conv", w(16, 3, 3, 3), rng.standard_normal(16) * 0.1,
                                 padding=1), Activation.RELU, "stem.act")
    y = g.activation(g.conv2d(stem, "block.conv1", w(8, 16, 1, 1), rng.standard_normal(8) * 0.1), Activation.RELU, "block.act1")
    y = g.activation(g.conv2d(y, "block.conv2", w(8, 8, 3, 3), rng.standard_normal(8) * 0.1, stride=2, padding=1),
                     Activation.RELU, "block.act2")
    y = g.conv2d(y, "block.conv3", w(32, 8, 1, 1), rng.standard_normal(32) * 0.1)
    shortcut = g.conv2d(stem, "block.downsample", w(32, 16, 1, 1), rng.standard_normal(32) * 0.1, stride=2)
    y = g.activation(g.add(y, shortcut, "block.add"), Activation.RELU, "block.act3")
    shared = g.conv2d(y, "shared.conv", w(32, 32, 1, 1), rng.standard_normal(32) * 0.1)
    y = g.add(g.activation(shared, Activation.RELU, "shared.act"), shared, "shared.sum")  # the conv is read twice
    y = g.activation(g.conv2d(y, "dw.conv", w(32, 1, 3, 3), rng.standard_normal(32) * 0.1, padding=1, groups=32),
                     Activation.RELU, "dw.act")
    y = g.activation(g.conv2d(y, "same.conv", w(16, 32, 3, 3), rng.standard_normal(16) * 0.1, stride=2,
                              padding=(0, 0, 1, 1)), Activation.RELU, "same.act")
    g.output(y)
    return assign_precision(g.finish(), PrecisionPolicy(precision))


def test_each_relu_after_a_half_convolution_read_by_nothing_else_fuses_with_it():
    fused = fused_convolutions(_bottleneck("fp16"))
    assert set(fused) == {"stem.act", "block.act1", "block.act2", "block.act3", "same.act"}
    add = fused["block.act3"]
    assert (add.convolution.name, add.add, add.residual) == ("block.conv3", "block.add", "block.downsample")
    assert add.absorbed == {"block.conv3", "block.add"} and fused["stem.act"].absorbed == {"stem.conv"}
    # shared.conv is read by its ReLU and by the sum; dw.conv is depthwise (taps or cuDNN's own kernels)


def test_fp32_graphs_keep_their_convolutions_unfused():
    # cuDNN's fused graphs would run fp32 convolutions in TF32: trtmc's fp32 means fp32.
    assert fused_convolutions(_bottleneck("fp32")) == {}
    assert list(lowering_candidates(_bottleneck("fp32"), 1)) == [PLAIN]


def test_convolutions_lowered_otherwise_are_left_out():
    graph = _bottleneck("fp16")
    assert "stem.act" not in fused_convolutions(graph, exclude=frozenset({"stem.conv"}))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_fused_lowering_rounds_once_and_stays_within_the_unfused_paths_rounding(precision):
    # The fused ops (on the CPU: float32 arithmetic on the half values, one rounding) against the plain half
    # path (the convolution rounded, then the sum rounded again): the same network to the precision's rounding,
    # accumulated over its seven convolutions.
    graph = _bottleneck(precision, np.random.default_rng(3))
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    pixels = torch.rand((2, 3, 16, 16), generator=torch.Generator().manual_seed(4))
    fused = GraphModule(graph, fusions=fused_convolutions(graph))(pixels)
    plain = GraphModule(graph, half_convolutions_in_fp32=True)(pixels)
    assert fused.dtype == plain.dtype and fused.is_contiguous(memory_format=torch.channels_last)
    eps = torch.finfo(half).eps
    scale = plain.float().abs().max()
    assert (fused.float() - plain.float()).abs().max() <= 16 * eps * scale


def test_a_fused_call_is_relu_of_convolution_plus_bias_plus_residual_in_float32_rounded_once():
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((2, 8, 9, 9))).half()
    weight, bias = torch.from_numpy(rng.standard_normal((4, 8, 3, 3))).half(), torch.from_numpy(rng.standard_normal(4)).half()
    residual = torch.from_numpy(rng.standard_normal((2, 4, 5, 5))).half()
    got = torch.ops.trtmc.conv2d_add_relu(x, weight, residual, bias, [2, 2], [1, 1], [1, 1], 1)
    exact = torch.nn.functional.conv2d(x.double(), weight.double(), bias.double(), 2, 1) + residual.double()
    assert torch.equal(got, torch.relu(exact).half())  # float32 sums of 72 exact products, rounded once to fp16
    no_residual = torch.ops.trtmc.conv2d_relu(x, weight, None, [2, 2], [1, 1], [1, 1], 1)
    assert torch.equal(no_residual, torch.relu(torch.nn.functional.conv2d(x.double(), weight.double(), None, 2, 1)).half())


def test_the_cuda_engine_offers_the_fused_lowering_only_where_a_relu_fuses():
    graph = _bottleneck("fp16")
    assert list(lowering_candidates(graph, 128)) == [PLAIN, FUSED]
    candidate = lowering_candidates(graph, 128)[FUSED]
    assert candidate.fused and candidate.products == lowering_candidates(graph, 128)[PLAIN].products


def test_no_fused_candidate_where_most_depthwise_convolutions_run_as_taps():
    # At batch 1 the depthwise convolution runs as taps, whose kernel takes the ReLU before it: the build does not
    # compile a second lowering there. At batch 8 cuDNN runs it, and the fused candidate is offered.
    g = GraphBuilder()
    x = g.input("pixels", (1, 16, 8, 8))
    y = g.activation(g.conv2d(x, "pw.conv", np.ones((32, 16, 1, 1)), np.zeros(32)), Activation.RELU, "pw.act")
    g.output(g.conv2d(y, "dw.conv", np.ones((32, 1, 3, 3)), np.zeros(32), padding=1, groups=32))
    graph = assign_precision(g.finish(), PrecisionPolicy("fp16"))
    assert list(lowering_candidates(graph, 1)) == [PLAIN]
    assert list(lowering_candidates(graph, 8)) == [PLAIN, FUSED]


def test_the_1x1_convolutions_run_as_products_at_batch_1_are_not_fused():
    g = GraphBuilder()
    x = g.input("pixels", (1, 8, 4, 4))
    pooled = g.reduce(x, "pool", "mean", (2, 3), keepdim=True)
    g.output(g.activation(g.conv2d(pooled, "head.conv", np.ones((4, 8, 1, 1)), np.zeros(4)), Activation.RELU, "head.act"))
    graph = assign_precision(g.finish(), PrecisionPolicy("fp16"))
    assert vector_product_nodes(graph, 1) == {"head.conv"}
    assert list(lowering_candidates(graph, 1)) == [PLAIN] and list(lowering_candidates(graph, 4)) == [PLAIN, FUSED]


@pytest.mark.slow
def test_the_compiled_engine_runs_the_lowering_its_record_chose_for_each_batch_size():
    # torch.compile runs on the CPU too (Inductor calls the custom ops as extern kernels, their fake
    # implementations giving the layouts), which is what this checks: batch 4 was built fused, batch 1 plain.
    graph = _bottleneck("fp16", np.random.default_rng(6))
    record = {LOWERINGS: {"1": {"chosen": PLAIN}, "4": {"chosen": FUSED}}}
    compiled = compile_cuda(graph, record)
    reference = GraphModule(graph, fusions=fused_convolutions(graph))
    x = torch.rand((4, 3, 16, 16), generator=torch.Generator().manual_seed(7)).half().contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert torch.equal(compiled(x), reference(x))
        compiled(x[:1])
    assert {lowering.fused for lowering in compiled._by_lowering} == {False, True}


def test_a_record_naming_a_lowering_the_graph_does_not_offer_is_refused_with_the_fix():
    compiled = compile_cuda(_bottleneck("fp32"), {LOWERINGS: {"1": {"chosen": FUSED}}})
    with pytest.raises(RuntimeError, match="rebuild the bundle"):
        compiled(torch.rand((1, 3, 16, 16)))


def test_the_fused_lowering_traces_to_one_custom_op_call_per_fused_relu():
    graph = _bottleneck("fp16")
    fx = channels_last_weights(to_fx(graph, fusions=fused_convolutions(graph)), graph)
    targets = [str(n.target) for n in fx.graph.nodes if n.op == "call_function"]
    assert sum("conv2d_relu" in t for t in targets) == 4 and sum("conv2d_add_relu" in t for t in targets) == 1
    assert isinstance(next(iter(fused_convolutions(graph).values())), FusedConvolution)


def test_inspect_shows_what_the_build_measured_and_kept_at_each_batch_size():
    from trtmc.cli.inspect import lowering_lines

    record = {LOWERINGS: {"128": {"chosen": FUSED, "ms": {PLAIN: 2.268, FUSED: 2.109}, "errors": {}},
                          "1": {"chosen": PLAIN, "ms": {}, "errors": {}}}}
    assert lowering_lines(record) == ["batch 1: plain kept (the only candidate)",
                                      "batch 128: cudnn-fused kept (plain 2.268 ms, cudnn-fused 2.109 ms)"]
    assert lowering_lines({}) == []
