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
from trtmc.backends.torch_lowering import GraphModule
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
