"""A depthwise convolution, its bias and its activation in one Triton kernel, for the CUDA inductor engine.

Inductor runs every convolution as an extern call (cuDNN) and the bias and activation after it as a kernel
of its own: two kernels a depthwise layer, of 1.4-2.9 us each at batch 1, where a mobile network's time is
its kernel count (benchmarks/NOTES.md, run 3: ghostnet_100 runs 192 kernels at batch 1, 39 of them
depthwise convolutions). Here one kernel computes the layer on channels-last pixels: each program takes a
block of output pixels by a block of channels, accumulates the KH x KW taps in fp32 (as cuDNN does), adds
the bias, applies the activation and rounds once to the output dtype (the unfused path rounds the
convolution's output, then the activation's).

`depthwise_conv2d` is a `torch.library.triton_op`: torch.compile sees the Triton kernel and calls it from
the code it generates, inside the engine's CUDA graphs like every other kernel. Only the torch lowering's
`fused_depthwise` mode imports this module (Triton comes with CUDA builds of torch); the tests run the
kernel on the CPU under Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from ..graph import Activation, Graph, Node, OpKind

# The activations the kernel applies in its epilogue (a constexpr code each; 0 is none).
ACTIVATION_CODES = {Activation.RELU: 1, Activation.RELU6: 2, Activation.SILU: 3, Activation.HARD_SWISH: 4}
_TILE = 2048  # output values per program: BLOCK_P pixels x BLOCK_C channels
_MAX_BLOCK_C = 64


@triton.jit
def _activate(x, ACT: tl.constexpr):
    if ACT == 1:
        x = tl.maximum(x, 0.0)
    elif ACT == 2:
        x = tl.minimum(tl.maximum(x, 0.0), 6.0)
    elif ACT == 3:
        x = x * tl.sigmoid(x)
    elif ACT == 4:
        x = x * (tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) / 6.0)
    return x


@triton.jit
def _depthwise_nhwc(
    x_ptr, taps_ptr, bias_ptr, y_ptr,
    pixels, height, width, channels, out_height, out_width, stride_h, stride_w, pad_top, pad_left,
    KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)  # output pixel: (n * OH + oh) * OW + ow
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok, c_ok = p < pixels, c < channels
    ow = p % out_width
    oh = (p // out_width) % out_height
    n = p // (out_width * out_height)
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for kh in tl.static_range(KH):
        ih = oh * stride_h - pad_top + kh
        row_ok = p_ok & (ih >= 0) & (ih < height)
        for kw in tl.static_range(KW):
            iw = ow * stride_w - pad_left + kw
            ok = row_ok & (iw >= 0) & (iw < width)
            start = ((n * height + ih) * width + iw) * channels  # NHWC: a pixel's channels are contiguous
            x = tl.load(x_ptr + start[:, None] + c[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0)
            tap = tl.load(taps_ptr + (kh * KW + kw) * channels + c, mask=c_ok, other=0.0)
            acc += x.to(tl.float32) * tap.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    acc = _activate(acc, ACT)
    out = y_ptr + p[:, None] * channels + c[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=p_ok[:, None] & c_ok[None, :])


@triton_op("trtmc::depthwise_conv2d", mutates_args=())
def depthwise_conv2d(
    x: torch.Tensor,
    taps: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    pad_top_left: list[int],
    out_size: list[int],
    activation: int,
) -> torch.Tensor:
    """act(depthwise conv(x) + bias): x [N, C, H, W] (read channels-last), taps [KH, KW, C] (the weight
    [C, 1, KH, KW] tap by tap), output [N, C, OH, OW] channels-last in x's dtype; padding as the
    top and left pad (the bottom and right follow from `out_size`), `activation` an ACTIVATION_CODES value."""
    x = x.contiguous(memory_format=torch.channels_last)
    batch, channels, height, width = x.shape
    kh, kw, _ = taps.shape
    out_height, out_width = out_size
    y = torch.empty((batch, channels, out_height, out_width), dtype=x.dtype, device=x.device,
                    memory_format=torch.channels_last)
    pixels = batch * out_height * out_width
    if max(x.numel(), y.numel()) >= 2**31:  # the kernel indexes in int32
        raise ValueError(f"depthwise_conv2d: {tuple(x.shape)} -> {tuple(y.shape)} is too large for int32 indexing")
    block_c = min(_MAX_BLOCK_C, triton.next_power_of_2(channels))
    block_p = _TILE // block_c
    grid = (triton.cdiv(pixels, block_p), triton.cdiv(channels, block_c))
    wrap_triton(_depthwise_nhwc)[grid](
        x, taps, bias if bias is not None else taps, y,
        pixels, height, width, channels, out_height, out_width, stride[0], stride[1], pad_top_left[0], pad_top_left[1],
        KH=kh, KW=kw, HAS_BIAS=bias is not None, ACT=activation, BLOCK_P=block_p, BLOCK_C=block_c,
    )
    return y


# ---- the lowering: which ops of a graph the kernel takes, and how ------------------------------------


@dataclass(frozen=True)
class FusedDepthwise:
    """A depthwise CONV2D the kernel runs, and the ACTIVATION op right after it that it applies too (whose
    own lowering then passes its input on), if any."""

    activation: str | None
    code: int  # ACTIVATION_CODES[its fn], 0 without one


def find_fused_depthwise(graph: Graph) -> dict[str, FusedDepthwise]:
    """The depthwise convolutions of `graph` (one filter per channel, stored weights, no dilation) keyed by
    op name, each with the activation it absorbs: the op's one reader when that is an ACTIVATION of
    ACTIVATION_CODES (a cast between them, as an fp32 activation needs, leaves the activation out)."""
    readers: dict[str, list[Node]] = defaultdict(list)
    for node in graph.nodes:
        for name in node.inputs:
            readers[name].append(node)
    found = {}
    for node in graph.nodes:
        if node.kind is not OpKind.CONV2D or node.attrs.weight is None:
            continue
        weight, channels = graph.weights[node.attrs.weight], node.type.shape[1]
        if not (node.attrs.groups == channels == weight.shape[0] and weight.shape[1] == 1 and node.attrs.dilation == (1, 1)):
            continue
        after = readers[node.name]
        if len(after) == 1 and after[0].kind is OpKind.ACTIVATION and after[0].attrs.fn in ACTIVATION_CODES \
                and node.name not in graph.outputs:
            found[node.name] = FusedDepthwise(after[0].name, ACTIVATION_CODES[after[0].attrs.fn])
        else:
            found[node.name] = FusedDepthwise(None, 0)
    return found


def lower_fused(fused: FusedDepthwise, node: Node, args, w) -> torch.Tensor:
    """The torch lowering of a CONV2D that `find_fused_depthwise` found (`w` reads a stored tensor)."""
    a = node.attrs
    weight = w(a.weight)  # [C, 1, KH, KW]; tracing folds the rearranged taps into a constant
    channels, _, kh, kw = weight.shape
    taps = weight.reshape(channels, kh * kw).t().reshape(kh, kw, channels).contiguous()
    bias = w(a.bias) if a.bias else None
    return depthwise_conv2d(args[0], taps, bias, list(a.stride), [a.padding[0], a.padding[1]],
                            list(node.type.shape[2:]), fused.code)
