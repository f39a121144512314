"""A matrix product, its bias and the GELU after it as one cuBLASLt call, for the compiled CUDA engine.

Transformer and ConvNeXt MLPs widen each token (pixel) fourfold with a linear op (a 1x1 convolution in trtmc's
ConvNeXt) and apply GELU to the wide result. Inductor runs the product on cuBLAS and the bias and GELU as a Triton
kernel of their own, which writes the widest map of the block and reads it back: convnext_tiny's at batch 128 took
~1.9 ms of its 6.7 ms engine (benchmarks/NOTES.md, run 39). cuBLASLt applies the bias and GELU in the GEMM's
epilogue (`CUBLASLT_EPILOGUE_GELU_BIAS`), which `torch._addmm_activation(..., use_gelu=True)` calls on CUDA and
Inductor keeps as an extern call (`make_fallback`). On an H100 that made convnext_tiny's batch-128 engine 6.88 ->
5.34 ms (`tools/gelu_products_probe.py`, run 40), so a build runs them (`inductor_lowerings.GELU_PRODUCTS_AT_BUILD`).

Numerics: cuBLASLt's GELU is the tanh form (torch's CUDA path without cuBLASLt applies `gelu(approximate="tanh")`
after the GEMM, to match it), which differs from the exact (erf) one by at most 4.7e-4 (at x = -2.70), half an fp16
step at 1.0. torch's CPU kernel of the op applies the exact form, so the CPU tests check the product, the bias and
the layout, and the GPU probe the difference. Only half-precision products are taken: in float32 the tanh form would
be the largest error of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..graph import Activation, Graph, Node, OpKind
from .torch_lowering import HALF_DTYPES

GELUS = (Activation.GELU, Activation.GELU_TANH)


def _is_dense_product(node: Node, graph: Graph) -> bool:
    """A half-precision linear op, or a 1x1 convolution that is one (dense, stride 1, no padding), with a stored
    weight and a bias (the epilogue adds it)."""
    a = node.attrs
    if node.type.dtype not in HALF_DTYPES or getattr(a, "weight", None) is None or not getattr(a, "bias", None):
        return False
    if graph.node(node.inputs[0]).type.dtype is not node.type.dtype:
        return False
    if node.kind is OpKind.LINEAR:
        return True
    return (node.kind is OpKind.CONV2D and a.groups == 1 and not any(a.padding) and tuple(a.stride) == (1, 1)
            and graph.weights[a.weight].shape[2:] == (1, 1))


@dataclass(frozen=True)
class GeluProduct:
    """A GELU node (the key it is found under) computed, with the product before it, as one cuBLASLt call; the
    product is `absorbed`: the engine does not compute it on its own."""

    product: Node

    @property
    def absorbed(self) -> frozenset[str]:
        return frozenset({self.product.name})

    def lower(self, values: dict[str, torch.Tensor], w: Callable[[str], torch.Tensor]) -> torch.Tensor:
        a = self.product.attrs
        x, shape = values[self.product.inputs[0]], self.product.type.shape  # shapes from the graph (FX proxies)
        weight = w(a.weight)  # [out, in], or [out, in, 1, 1] for a 1x1 convolution
        out_features, in_features = weight.shape[:2]
        on_map = self.product.kind is OpKind.CONV2D
        # A channels-last map's pixels as rows: a view, no copy; the result rows are the output's pixels.
        rows = (x.permute(0, 2, 3, 1) if on_map else x).reshape(-1, in_features)
        y = torch._addmm_activation(w(a.bias), rows, weight.reshape(out_features, in_features).t(), use_gelu=True)
        if on_map:
            return y.reshape(-1, shape[2], shape[3], out_features).permute(0, 3, 1, 2)
        return y.reshape(-1, *shape[1:])


def gelu_products(graph: Graph, exclude: frozenset[str] = frozenset()) -> dict[str, GeluProduct]:
    """Every GELU whose input is a half-precision product (`_is_dense_product`) that feeds nothing else, keyed by
    the GELU's name. `exclude` names products lowered otherwise (patch products, quantized GEMMs)."""
    consumers = graph.consumers()
    found: dict[str, GeluProduct] = {}
    for gelu in graph.nodes:
        if gelu.kind is not OpKind.ACTIVATION or gelu.attrs.fn not in GELUS:
            continue
        product = graph.node(gelu.inputs[0])
        if (_is_dense_product(product, graph) and product.name not in exclude and product.name not in graph.outputs
                and len(consumers[product.name]) == 1):
            found[gelu.name] = GeluProduct(product)
    return found
