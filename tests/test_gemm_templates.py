"""The GEMM-templates lowering: where a build offers it, what it asks Inductor for, and that an engine whose
build chose it compiles it and computes what the graph does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtmc.backends.inductor_lowerings import (
    GEMM, GEMM_TEMPLATES_AT_BUILD, GEMM_TEMPLATE_OPTIONS, KERNEL, LOWERINGS, MAX_GEMM_SHAPES, MIN_GEMMS, PLAIN,
    Lowering, compile_cuda, gemm_count, gemm_shapes, lowering_candidates,
)
from trtmc.backends.torch_lowering import TORCH_DTYPES, GraphModule, pointwise_product_nodes
from trtmc.graph import Activation
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision


def _token_mlps(linears: int, depthwise: int = 0, precision: str = "fp32", widths: int = 1):
    """`depthwise` 7x7 depthwise convolutions on a 16-channel map (none for a plain transformer), its tokens, then
    `linears` linear layers with a GELU after every other one, as in a ViT block's MLP: of 16 features, or, with
    `widths` > 2, `widths` matrix products of distinct shapes (each of the first `widths` - 2 layers one feature
    wider than its input, then one back to 16 features, the rest 16 to 16)."""
    rng = np.random.default_rng(linears)
    g = GraphBuilder()
    y = g.input("pixels", (1, 16, 4, 4))
    for i in range(depthwise):
        y = g.conv2d(y, f"stem.{i}.conv_dw", rng.standard_normal((16, 1, 7, 7)) / 7, rng.standard_normal(16),
                     padding=3, groups=16)
    y = g.transpose(g.reshape(y, (16, 16), "tokens"), (0, 2, 1), "tokens.transpose")
    features = [16 + i for i in range(max(widths - 1, 1))] + [16] * (linears + 1 - max(widths - 1, 1))
    for i, (width_in, width_out) in enumerate(zip(features, features[1:])):
        y = g.linear(y, f"blocks.{i}.fc", rng.standard_normal((width_out, width_in)) / 4,
                     rng.standard_normal(width_out) / 4)
        if i % 2 == 0:
            y = g.activation(y, Activation.GELU, f"blocks.{i}.act")
    g.output(g.reshape(y, (256,), "head"))
    return assign_precision(g.finish(), PrecisionPolicy(precision))


def _pointwise_convolutions(blocks: int, precision: str = "fp32"):
    """A convolutional network of `blocks` inverted-residual-like blocks on an 8 x 8 map of 16 channels: a 1x1
    convolution to 32 channels with a SiLU, a 1x1 convolution back to 16 and the residual add; then a 1x1 convolution
    with stride 2 and a squeeze-excite-like 1x1 convolution on the pooled 1x1 map (neither is a pointwise product)."""
    rng = np.random.default_rng(blocks)
    g = GraphBuilder()
    y = g.input("pixels", (1, 16, 8, 8))
    for i in range(blocks):
        h = g.activation(g.conv2d(y, f"blocks.{i}.conv_pw", rng.standard_normal((32, 16, 1, 1)) / 4,
                                  rng.standard_normal(32) / 4), Activation.SILU, f"blocks.{i}.act")
        h = g.conv2d(h, f"blocks.{i}.conv_pwl", rng.standard_normal((16, 32, 1, 1)) / 6, rng.standard_normal(16) / 4)
        y = g.add(y, h, f"blocks.{i}.residual")
    y = g.conv2d(y, "downsample", rng.standard_normal((16, 16, 1, 1)) / 4, rng.standard_normal(16), stride=2)
    y = g.global_avg_pool(y, "pool", keepdim=True)
    g.output(g.conv2d(y, "head", rng.standard_normal((10, 16, 1, 1)) / 4, rng.standard_normal(10)))
    return assign_precision(g.finish(), PrecisionPolicy(precision))


def test_only_stride_1_1x1_convolutions_on_maps_larger_than_1x1_are_pointwise_products():
    graph = _pointwise_convolutions(2)
    assert pointwise_product_nodes(graph) == {"blocks.0.conv_pw", "blocks.0.conv_pwl", "blocks.1.conv_pw",
                                              "blocks.1.conv_pwl"}


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-5), ("fp16", 2e-3), ("bf16", 1e-2)])
def test_a_pointwise_product_computes_the_1x1_convolution(precision, tolerance):
    # The channels-last map's pixels as rows times the weight: the convolution's products and sums, within the
    # precision's rounding of the convolutions computed in fp32 (the CPU reference's half path).
    graph = _pointwise_convolutions(2, precision)
    pixels = torch.rand((3, 16, 8, 8), generator=torch.Generator().manual_seed(5))
    pixels = pixels.to(TORCH_DTYPES[graph.inputs[0].type.dtype]).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        got = GraphModule(graph, pointwise_products=pointwise_product_nodes(graph))(pixels).float()
        expected = GraphModule(graph, half_convolutions_in_fp32=True)(pixels).float()
    assert torch.allclose(got, expected, rtol=tolerance, atol=tolerance)


def test_the_gemm_templates_lowering_runs_a_convolutional_networks_1x1_convolutions_as_matrix_products():
    # Run 38: efficientnet_b0's and convnext_tiny's 1x1 convolutions on the templates were 5% and 3% quicker at batch 1.
    graph = _pointwise_convolutions(MIN_GEMMS // 2)
    assert gemm_count(graph) == MIN_GEMMS and gemm_shapes(graph) == 2
    offered = lowering_candidates(graph, 1)
    assert list(offered) == [PLAIN, GEMM]
    assert offered[GEMM].pointwise == pointwise_product_nodes(graph) and not offered[PLAIN].pointwise
    assert list(lowering_candidates(_pointwise_convolutions(MIN_GEMMS // 2 - 1), 1)) == [PLAIN]


def test_the_gemm_templates_lowering_is_offered_at_batch_1_where_the_graph_has_a_transformers_matrix_products():
    graph = _token_mlps(MIN_GEMMS)
    assert gemm_count(graph) == MIN_GEMMS
    offered = lowering_candidates(graph, 1)
    assert list(offered) == [PLAIN, GEMM] and offered[GEMM].gemm_templates and not offered[PLAIN].gemm_templates
    # Batch 1 only: the measurements (vit_base_patch16_224, runs 24 and 25) were at batch 1.
    assert list(lowering_candidates(graph, 8)) == [PLAIN]
    # A convolutional network's one matrix product (its classifier) cannot pay for the candidate's compile.
    assert list(lowering_candidates(_token_mlps(MIN_GEMMS - 1), 1)) == [PLAIN]


def test_the_gemm_templates_lowering_is_not_offered_where_too_many_shapes_would_each_be_autotuned():
    few = _token_mlps(MIN_GEMMS, widths=MAX_GEMM_SHAPES)
    many = _token_mlps(MIN_GEMMS, widths=MAX_GEMM_SHAPES + 1)
    assert gemm_count(few) == gemm_count(many) == MIN_GEMMS
    assert (gemm_shapes(few), gemm_shapes(many)) == (MAX_GEMM_SHAPES, MAX_GEMM_SHAPES + 1)
    assert list(lowering_candidates(few, 1)) == [PLAIN, GEMM]
    # Run 25: 13-20 shapes cost 100-275 s of build for at most 10% (levit_128s) and mostly nothing.
    assert list(lowering_candidates(many, 1)) == [PLAIN]


def test_a_loaded_engine_finds_the_gemm_templates_lowering_wherever_a_build_could_have_chosen_it():
    # A bundle built where the build drew the lines elsewhere (another MIN_GEMMS, MAX_GEMM_SHAPES or batch) still
    # names a lowering the load can rebuild: the one its build timed.
    for graph, batch in ((_token_mlps(MIN_GEMMS, widths=MAX_GEMM_SHAPES + 1), 1), (_token_mlps(MIN_GEMMS - 1), 8)):
        loaded = lowering_candidates(graph, batch, depthwise_kernel=True, gemm_templates=True)
        assert loaded[GEMM] == Lowering(loaded[PLAIN].taps, loaded[PLAIN].products, gemm_templates=True)


def test_a_build_times_the_gemm_templates_at_batch_1():
    assert GEMM_TEMPLATES_AT_BUILD
    assert list(lowering_candidates(_token_mlps(MIN_GEMMS), 1)) == [PLAIN, GEMM]
    assert list(lowering_candidates(_token_mlps(MIN_GEMMS), 1, gemm_templates=False)) == [PLAIN]


def test_the_gemm_templates_ride_on_the_depthwise_kernel_where_both_are_offered():
    offered = lowering_candidates(_token_mlps(MIN_GEMMS, depthwise=4), 1, depthwise_kernel=True, gemm_templates=True)
    assert list(offered) == [PLAIN, KERNEL, GEMM]
    assert offered[GEMM].depthwise_kernel and offered[GEMM].gemm_templates and not offered[KERNEL].gemm_templates
    # A load offers every candidate (depthwise_kernel=True); a build may not time the kernel alone: the GEMM
    # candidate is the same lowering either way, so a load compiles what its build timed.
    built = lowering_candidates(_token_mlps(MIN_GEMMS, depthwise=4), 1, depthwise_kernel=False)
    assert list(built) == [PLAIN, GEMM] and built[GEMM] == offered[GEMM]


def test_only_the_gemm_templates_lowering_asks_inductor_for_triton_templates_beside_cublas():
    graph = _token_mlps(MIN_GEMMS)
    offered = lowering_candidates(graph, 1, gemm_templates=True)
    compiled = compile_cuda(graph, options={"coordinate_descent_tuning": True})
    assert compiled.options_for(offered[PLAIN]) == {"coordinate_descent_tuning": True}
    assert compiled.options_for(offered[GEMM]) == {"coordinate_descent_tuning": True, **GEMM_TEMPLATE_OPTIONS}
    assert GEMM_TEMPLATE_OPTIONS["max_autotune_gemm"]
    assert "TRITON" in GEMM_TEMPLATE_OPTIONS["max_autotune_gemm_backends"]
    # Convolutions stay cuDNN's: Inductor would otherwise benchmark its Triton convolution templates against each.
    assert GEMM_TEMPLATE_OPTIONS["max_autotune_conv_backends"] == "ATEN"


@pytest.mark.slow
def test_an_engine_whose_build_chose_the_gemm_templates_compiles_them_and_computes_what_the_graph_does():
    # On the CPU Inductor has no Triton templates, so cuBLAS's stand-in (ATen's matmul) is the only choice: the test
    # is that the record's choice is honoured with its options whatever the build default, and still right.
    graph = _token_mlps(MIN_GEMMS, precision="fp16")
    compiled = compile_cuda(graph, {LOWERINGS: {"1": {"chosen": GEMM}}})
    pixels = torch.rand((1, 16, 4, 4), generator=torch.Generator().manual_seed(4)).half()
    with torch.no_grad():
        out = compiled(pixels)
        expected = GraphModule(graph)(pixels)
    assert torch.allclose(out.float(), expected.float(), rtol=1e-2, atol=1e-2)
    assert [lowering.gemm_templates for lowering in compiled._by_lowering] == [True]


@pytest.mark.slow
def test_an_engine_whose_build_chose_the_gemm_templates_runs_its_1x1_convolutions_as_products_and_stays_right():
    graph = _pointwise_convolutions(MIN_GEMMS // 2)
    compiled = compile_cuda(graph, {LOWERINGS: {"1": {"chosen": GEMM}}})
    pixels = torch.rand((1, 16, 8, 8), generator=torch.Generator().manual_seed(6)).contiguous(
        memory_format=torch.channels_last)
    with torch.no_grad():
        out = compiled(pixels)
        expected = GraphModule(graph)(pixels)
    assert torch.allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert [lowering.pointwise for lowering in compiled._by_lowering] == [pointwise_product_nodes(graph)]
