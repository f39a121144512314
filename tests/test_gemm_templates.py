"""The GEMM-templates lowering: where a build offers it, what it asks Inductor for, and that an engine whose
build chose it compiles it and computes what the graph does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtmc.backends.inductor_lowerings import (
    GEMM, GEMM_TEMPLATES_AT_BUILD, GEMM_TEMPLATE_OPTIONS, KERNEL, LOWERINGS, MIN_GEMMS, PLAIN, compile_cuda,
    gemm_count, lowering_candidates,
)
from trtmc.backends.torch_lowering import GraphModule
from trtmc.graph import Activation
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision


def _token_mlps(linears: int, depthwise: int = 0, precision: str = "fp32"):
    """`depthwise` 7x7 depthwise convolutions on a 16-channel map (none for a plain transformer), its tokens, then
    `linears` linear layers of 16 features with a GELU after every other one, as in a ViT block's MLP."""
    rng = np.random.default_rng(linears)
    g = GraphBuilder()
    y = g.input("pixels", (1, 16, 4, 4))
    for i in range(depthwise):
        y = g.conv2d(y, f"stem.{i}.conv_dw", rng.standard_normal((16, 1, 7, 7)) / 7, rng.standard_normal(16),
                     padding=3, groups=16)
    y = g.transpose(g.reshape(y, (16, 16), "tokens"), (0, 2, 1), "tokens.transpose")
    for i in range(linears):
        y = g.linear(y, f"blocks.{i}.fc", rng.standard_normal((16, 16)) / 4, rng.standard_normal(16) / 4)
        if i % 2 == 0:
            y = g.activation(y, Activation.GELU, f"blocks.{i}.act")
    g.output(g.reshape(y, (256,), "head"))
    return assign_precision(g.finish(), PrecisionPolicy(precision))


def test_the_gemm_templates_lowering_is_offered_at_batch_1_where_the_graph_has_a_transformers_matrix_products():
    graph = _token_mlps(MIN_GEMMS)
    assert gemm_count(graph) == MIN_GEMMS
    offered = lowering_candidates(graph, 1, gemm_templates=True)
    assert list(offered) == [PLAIN, GEMM] and offered[GEMM].gemm_templates and not offered[PLAIN].gemm_templates
    # Batch 1 only: the one measurement (vit_base_patch16_224, run 24) was at batch 1.
    assert list(lowering_candidates(graph, 8, gemm_templates=True)) == [PLAIN]
    # A convolutional network's one matrix product (its classifier) cannot pay for the candidate's compile.
    assert list(lowering_candidates(_token_mlps(MIN_GEMMS - 1), 1, gemm_templates=True)) == [PLAIN]


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
    built = lowering_candidates(_token_mlps(MIN_GEMMS, depthwise=4), 1, depthwise_kernel=False, gemm_templates=True)
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
