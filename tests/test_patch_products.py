"""Patchifying convolutions (ViT's patch embedding, ConvNeXt's stem and downsampling) as one matrix product in the
CUDA engine: which convolutions qualify, that the product computes the convolution, and that a load runs what its
build ran."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtmc.backends.inductor_lowerings import (
    FUSED, LOWERINGS, PATCH_PRODUCTS, PATCH_PRODUCTS_AT_BUILD, PLAIN, compile_cuda, lowering_candidates,
)
from trtmc.backends.torch_lowering import TORCH_DTYPES, GraphModule, patch_product_nodes
from trtmc.graph import Activation
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision


def _patchified(precision: str = "fp16", size: int = 16, kernel: int = 4):
    """A ConvNeXt-like stem (`kernel` x `kernel` patches, stride `kernel`, 3 -> 8 channels) on a `size` x `size` map,
    then a 2x2 patchify of 8 channels (ConvNeXt's downsampling), a 3x3 convolution and a ReLU."""
    rng = np.random.default_rng(size + kernel)
    g = GraphBuilder()
    y = g.input("pixels", (1, 3, size, size))
    y = g.conv2d(y, "stem", rng.standard_normal((8, 3, kernel, kernel)) / kernel, rng.standard_normal(8), stride=kernel)
    y = g.conv2d(y, "downsample", rng.standard_normal((8, 8, 2, 2)) / 4, rng.standard_normal(8), stride=2)
    y = g.activation(g.conv2d(y, "conv", rng.standard_normal((8, 8, 3, 3)) / 8, rng.standard_normal(8), padding=1),
                     Activation.RELU, "act")
    g.output(y)
    return assign_precision(g.finish(), PrecisionPolicy(precision))


def _channels_last(graph, batch: int, seed: int) -> torch.Tensor:
    """Pixels in the graph's precision and channels-last, as the CUDA engine feeds them."""
    shape = (batch, *graph.inputs[0].type.shape[1:])
    pixels = torch.rand(shape, generator=torch.Generator().manual_seed(seed))
    return pixels.to(TORCH_DTYPES[graph.inputs[0].type.dtype]).contiguous(memory_format=torch.channels_last)


def test_only_half_precision_patchifying_convolutions_run_as_matrix_products():
    assert patch_product_nodes(_patchified("fp16")) == {"stem", "downsample"}
    assert patch_product_nodes(_patchified("bf16")) == {"stem", "downsample"}
    assert patch_product_nodes(_patchified("fp32")) == set()  # the products were measured in half precision only
    # 18 is no multiple of 4 (a last partial patch); the stem's 4 x 4 output cuts into the downsampling's 2 x 2 patches.
    assert patch_product_nodes(_patchified("fp16", size=18)) == {"downsample"}


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-5), ("fp16", 2e-3), ("bf16", 1e-2)])
def test_a_patch_product_computes_the_patch_embedding(precision, tolerance):
    # The patch rows in channels-last order times the weight in the same order: the convolution's products and an
    # fp32 sum, within the precision's rounding of the convolution computed in fp32 (the CPU reference's half path).
    graph = _patchified(precision)
    pixels = _channels_last(graph, 3, seed=1)
    with torch.no_grad():
        got = GraphModule(graph, patch_products=frozenset({"stem", "downsample"}))(pixels).float()
        expected = GraphModule(graph, half_convolutions_in_fp32=True)(pixels).float()
    assert torch.allclose(got, expected, rtol=tolerance, atol=tolerance)


def test_every_lowering_of_a_build_runs_its_patch_embeddings_as_matrix_products_and_records_them():
    graph = _patchified("fp16")
    built = compile_cuda(graph, options={})  # a build passes no record
    assert built.patches == ({"stem", "downsample"} if PATCH_PRODUCTS_AT_BUILD else set())
    candidates = lowering_candidates(graph, 128, patches=built.patches)
    assert FUSED in candidates  # the fused candidate leaves the patch embedding to the product, not to cuDNN
    assert all(lowering.patches == built.patches for lowering in candidates.values())
    fx = candidates[PLAIN].module(graph, torch.device("cpu"))
    convolutions = [n for n in fx.graph.nodes if n.op == "call_function" and "conv2d" in str(n.target)]
    assert len(convolutions) == (1 if PATCH_PRODUCTS_AT_BUILD else 3)


def test_a_load_runs_the_patch_products_its_record_names_and_none_for_a_bundle_from_before_them():
    graph = _patchified("fp16")
    assert compile_cuda(graph, {PATCH_PRODUCTS: ["stem"]}).patches == {"stem"}
    assert compile_cuda(graph, {}).patches == set()  # its build ran cuDNN's convolution: the caches hold that


@pytest.mark.slow
def test_inductor_compiles_the_patch_product_from_channels_last_weights_and_computes_the_stem():
    # The engine's weights are channels-last (`channels_last_weights`), so the weight's view as a matrix is no copy;
    # Inductor on the CPU compiles the same FX graph the CUDA engine does.
    graph = _patchified("fp32", size=32, kernel=8)
    compiled = compile_cuda(graph, {PATCH_PRODUCTS: ["stem"]})
    pixels = _channels_last(graph, 2, seed=2)
    with torch.no_grad():
        out = compiled(pixels)
        expected = GraphModule(graph)(pixels)
    assert torch.allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert [lowering.patches for lowering in compiled._by_lowering] == [{"stem"}]


def test_inspect_names_the_patch_embeddings_a_build_ran_as_matrix_products():
    from trtmc.cli.inspect import lowering_lines

    record = {LOWERINGS: {"1": {"chosen": PLAIN, "ms": {}, "errors": {}}}, PATCH_PRODUCTS: ["patch_embed.proj"]}
    assert lowering_lines(record) == ["batch 1: plain kept (the only candidate)",
                                      "patch embeddings as one matrix product each: patch_embed.proj"]
    assert lowering_lines({PATCH_PRODUCTS: []}) == []
