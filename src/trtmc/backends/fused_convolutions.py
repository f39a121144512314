"""Convolution, bias, residual add and ReLU as one cuDNN call, for the compiled CUDA engine.

Inductor fuses nothing into an extern convolution: after each cuDNN convolution it runs a Triton kernel for
the bias, the residual add and the ReLU (resnet50 at batch 128: 52 such kernels, 1.59 ms of 4.06;
benchmarks/NOTES.md, run 3). cuDNN runs the whole of it as one operation graph (convolution, scaled add,
bias, ReLU: `torch.cudnn_convolution_relu` and `torch.cudnn_convolution_add_relu`), which trtmc calls through
two custom ops, `trtmc::conv2d_relu` and `trtmc::conv2d_add_relu`, that Inductor keeps as extern calls.

Numerics: cuDNN accumulates in float32 and rounds once, after the ReLU; the unfused path rounds the
convolution's output to fp16/bf16 before adding. On a CPU the ops compute the fused function in float32
(exact products of the half values, one rounding at the end), which is what the tests compare.
Whether the fused lowering is faster is measured when the engine is built (`backends.inductor`).
"""

# No `from __future__ import annotations` here: `torch.library.custom_op` reads the ops' signatures from their
# annotations, which older torch releases expect as objects, not strings.
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..graph import Activation, Binary, Graph, Node, OpKind
from .torch_lowering import HALF_DTYPES, _pad_if_asymmetric, is_depthwise

# cuDNN's fused operation graphs take half-precision convolutions; fp32 ones would run in TF32 there.
FUSED_DTYPES = HALF_DTYPES


def _output_like(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation) -> torch.Tensor:
    """An empty channels-last output of the convolution (every op here returns that layout)."""
    size = [x.shape[0], weight.shape[0]]
    for i in range(2):
        extent = dilation[i] * (weight.shape[2 + i] - 1) + 1
        size.append((x.shape[2 + i] + 2 * padding[i] - extent) // stride[i] + 1)
    return torch.empty(size, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)


def _reference(x, weight, bias, residual, stride, padding, dilation, groups) -> torch.Tensor:
    """The fused function in float32: exact products of half values, float32 sums, one rounding."""
    y = F.conv2d(x.float(), weight.float(), None if bias is None else bias.float(), stride, padding, dilation, groups)
    if residual is not None:
        y = y + residual.float()
    return torch.relu(y).to(x.dtype).contiguous(memory_format=torch.channels_last)


@torch.library.custom_op("trtmc::conv2d_relu", mutates_args=())
def conv2d_relu(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    stride: list[int], padding: list[int], dilation: list[int], groups: int,
) -> torch.Tensor:
    """relu(conv2d(x, weight) + bias), one cuDNN call on CUDA; channels-last out."""
    if x.is_cuda:
        y = torch.cudnn_convolution_relu(x, weight, bias, stride, padding, dilation, groups)
        return y.contiguous(memory_format=torch.channels_last)
    return _reference(x, weight, bias, None, stride, padding, dilation, groups)


@conv2d_relu.register_fake
def _conv2d_relu_fake(x, weight, bias, stride, padding, dilation, groups):
    return _output_like(x, weight, stride, padding, dilation)


@torch.library.custom_op("trtmc::conv2d_add_relu", mutates_args=())
def conv2d_add_relu(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, bias: Optional[torch.Tensor],
    stride: list[int], padding: list[int], dilation: list[int], groups: int,
) -> torch.Tensor:
    """relu(conv2d(x, weight) + bias + residual), one cuDNN call on CUDA; channels-last out."""
    if x.is_cuda:
        y = torch.cudnn_convolution_add_relu(x, weight, residual, 1.0, bias, stride, padding, dilation, groups)
        return y.contiguous(memory_format=torch.channels_last)
    return _reference(x, weight, bias, residual, stride, padding, dilation, groups)


@conv2d_add_relu.register_fake
def _conv2d_add_relu_fake(x, weight, residual, bias, stride, padding, dilation, groups):
    return _output_like(x, weight, stride, padding, dilation)


@dataclass(frozen=True)
class FusedConvolution:
    """A ReLU node (the key it is found under) computed, with the convolution before it (and the residual add
    between them), as one call. `absorbed` are the nodes whose values the call computes inside it: the engine
    does not compute them."""

    convolution: Node
    add: Optional[str] = None
    residual: Optional[str] = None

    @property
    def absorbed(self) -> frozenset[str]:
        return frozenset(n for n in (self.convolution.name, self.add) if n is not None)

    def lower(self, values: dict[str, torch.Tensor], w: Callable[[str], torch.Tensor]) -> torch.Tensor:
        a = self.convolution.attrs
        x, padding = _pad_if_asymmetric(values[self.convolution.inputs[0]], a.padding)
        bias = w(a.bias) if a.bias else None
        shape = (list(a.stride), list(padding), list(a.dilation), a.groups)
        if self.residual is None:
            return torch.ops.trtmc.conv2d_relu(x, w(a.weight), bias, *shape)
        return torch.ops.trtmc.conv2d_add_relu(x, w(a.weight), values[self.residual], bias, *shape)


def _fusable(node: Node, graph: Graph, consumers: dict[str, list[Node]], exclude: frozenset[str]) -> bool:
    """A half-precision convolution with a stored kernel, not depthwise (those run as taps or on cuDNN's own
    depthwise kernels), read by one op only (its value then need not exist on its own)."""
    return (
        node.kind is OpKind.CONV2D
        and node.attrs.weight is not None
        and node.type.dtype in FUSED_DTYPES
        and graph.node(node.inputs[0]).type.dtype is node.type.dtype
        and not is_depthwise(node, graph)
        and node.name not in exclude
        and node.name not in graph.outputs
        and len(consumers[node.name]) == 1
    )


def fused_convolutions(graph: Graph, exclude: frozenset[str] = frozenset()) -> dict[str, FusedConvolution]:
    """Every ReLU that can run with its convolution as one cuDNN call, keyed by the ReLU's name: relu(conv) and
    relu(conv + residual) (either side of the add), where the convolution (and the add) feed nothing else.
    `exclude` names convolutions lowered otherwise (depthwise taps, products on 1x1 maps)."""
    consumers = graph.consumers()
    found: dict[str, FusedConvolution] = {}
    for relu in graph.nodes:
        if relu.kind is not OpKind.ACTIVATION or relu.attrs.fn is not Activation.RELU:
            continue
        source = graph.node(relu.inputs[0])
        if _fusable(source, graph, consumers, exclude):
            found[relu.name] = FusedConvolution(source)
            continue
        is_add = source.kind is OpKind.ELEMENTWISE and source.attrs.op is Binary.ADD
        if not is_add or len(consumers[source.name]) != 1 or source.name in graph.outputs:
            continue
        for conv_name, residual_name in (source.inputs, source.inputs[::-1]):
            conv, residual = graph.node(conv_name), graph.node(residual_name)
            same_type = residual.type.shape == conv.type.shape and residual.type.dtype is conv.type.dtype
            if conv_name != residual_name and same_type and _fusable(conv, graph, consumers, exclude):
                found[relu.name] = FusedConvolution(conv, source.name, residual_name)
                break
    return found
