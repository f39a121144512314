"""GELUs computed with the matrix product before them as one cuBLASLt call in the CUDA engine: which products
qualify, that the call computes the product, bias and GELU, and that a load runs what its build ran."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtmc.backends.gelu_products import gelu_products
from trtmc.backends.inductor_lowerings import (
    GELU_PRODUCTS, GELU_PRODUCTS_AT_BUILD, LOWERINGS, PLAIN, compile_cuda, lowering_candidates,
)
from trtmc.backends.torch_lowering import TORCH_DTYPES, GraphModule
from trtmc.graph import Activation
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision


def _mlps(precision: str = "fp16"):
    """A ConvNeXt-like block's MLP (1x1 convolutions 8 -> 32 -> 8 with a GELU between) on a 6 x 6 map, then a
    token MLP (linear 8 -> 16, tanh GELU), and three GELUs that must stay apart: one after a 3x3 convolution, one
    after a 1x1 convolution whose output is also read by the residual add, one after a linear op without a bias."""
    rng = np.random.default_rng(7)
    g = GraphBuilder()
    x = g.input("pixels", (1, 8, 6, 6))
    y = g.activation(g.conv2d(x, "fc1", rng.standard_normal((32, 8, 1, 1)) / 3, rng.standard_normal(32)),
                     Activation.GELU, "act")
    y = g.conv2d(y, "fc2", rng.standard_normal((8, 32, 1, 1)) / 6, rng.standard_normal(8))
    y = g.activation(g.conv2d(y, "spatial", rng.standard_normal((8, 8, 3, 3)) / 8, rng.standard_normal(8), padding=1),
                     Activation.GELU, "act_spatial")
    shared = g.conv2d(y, "shared", rng.standard_normal((8, 8, 1, 1)) / 3, rng.standard_normal(8))
    y = g.add(g.activation(shared, Activation.GELU, "act_shared"), shared, "residual")
    tokens = g.transpose(g.reshape(y, (8, 36), "flatten"), (0, 2, 1), "tokens")
    t = g.activation(g.linear(tokens, "token_fc1", rng.standard_normal((16, 8)) / 3, rng.standard_normal(16)),
                     Activation.GELU_TANH, "token_act")
    t = g.activation(g.linear(t, "token_fc2", rng.standard_normal((8, 16)) / 4, None), Activation.GELU, "act_nobias")
    g.output(t)
    return assign_precision(g.finish(), PrecisionPolicy(precision))


def test_only_half_precision_products_with_a_bias_and_one_reader_run_with_their_gelu():
    assert set(gelu_products(_mlps("fp16"))) == {"act", "token_act"}
    assert set(gelu_products(_mlps("bf16"))) == {"act", "token_act"}
    assert gelu_products(_mlps("fp32")) == {}  # in float32 the tanh form would be the engine's largest error
    assert set(gelu_products(_mlps("fp16"), exclude=frozenset({"fc1"}))) == {"token_act"}


@pytest.mark.parametrize("precision, tolerance", [("fp16", 4e-3), ("bf16", 3e-2)])
def test_a_gelu_product_computes_the_product_its_bias_and_the_gelu(precision, tolerance):
    # The CPU kernel of `torch._addmm_activation` applies the exact GELU (cuBLASLt's epilogue the tanh form, at most
    # 4.7e-4 away): within the precision's rounding of the op-by-op graph.
    graph = _mlps(precision)
    pixels = torch.rand((3, 8, 6, 6), generator=torch.Generator().manual_seed(1))
    pixels = pixels.to(TORCH_DTYPES[graph.inputs[0].type.dtype]).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = GraphModule(graph)(pixels).float()
        got = GraphModule(graph, fusions=gelu_products(graph))(pixels).float()
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=tolerance, atol=tolerance)


def test_a_build_runs_the_gelu_products_where_they_are_on_at_build():
    graph = _mlps("fp16")
    built = compile_cuda(graph, options={})  # a build passes no record
    assert built.gelus == ({"act", "token_act"} if GELU_PRODUCTS_AT_BUILD else set())
    assert all(lowering.gelus == built.gelus for lowering in lowering_candidates(graph, 128, gelus=built.gelus).values())


def test_every_candidate_calls_cublaslt_once_per_gelu_product_and_keeps_the_other_gelus_apart():
    graph = _mlps("fp16")
    gelus = frozenset(gelu_products(graph))
    for lowering in lowering_candidates(graph, 128, gelus=gelus).values():
        fx = lowering.module(graph, torch.device("cpu"))
        targets = [str(n.target) for n in fx.graph.nodes if n.op == "call_function"]
        assert sum("_addmm_activation" in t for t in targets) == 2
        assert sum("gelu" in t and "_addmm_activation" not in t for t in targets) == 3


def test_a_load_runs_the_gelu_products_its_record_names_and_none_for_a_bundle_from_before_them():
    graph = _mlps("fp16")
    assert compile_cuda(graph, {GELU_PRODUCTS: ["act"]}).gelus == {"act"}
    assert compile_cuda(graph, {}).gelus == set()  # its build ran the GELUs apart: the caches hold that


def test_inspect_counts_the_gelus_a_build_ran_with_their_products():
    from trtmc.cli.inspect import lowering_lines

    record = {LOWERINGS: {"1": {"chosen": PLAIN, "ms": {}, "errors": {}}}, GELU_PRODUCTS: ["act", "token_act"]}
    assert lowering_lines(record)[-1] == "GELUs with their matrix product as one cuBLASLt call: 2"
