"""A depthwise convolution and its bias as one Triton kernel, for the compiled CUDA engine: the `depthwise-kernel`
lowering a build times at batch 1 (`inductor_lowerings.DEPTHWISE_KERNEL_AT_BUILD`; measured by
`tools/gpu_session.sh dwtriton`, run 21).

At batch 1 cuDNN runs each depthwise convolution in ~8 us (edgenext_small's 13 launches of `conv2d_c1_k1_nhwc`:
106 us of its 514, run 19), several times what the map's bytes need; the taps (`torch_lowering._depthwise_taps`)
are fast there but unroll kh * kw strided reads for Inductor to fuse, whose compile time capped them at 5x5
(run 16). This kernel reads the channels-last map once per tap from each program's tile of output pixels and
channels, accumulates in float32 and rounds once: one compile per shape (Triton's, at the first call), not one
fused kernel per tap. Its tile (`TILE`: 32 pixels x 32 channels in 2 warps, a loop over the kernel's rows) is the
quickest that `tools/depthwise_kernel_tune.py` found at batch 1 (run 22).

`trtmc::depthwise_conv2d` is the custom op Inductor keeps as one extern call; on a CPU it computes the same
function with `F.conv2d` in float32 (the tests compare the kernel with it under Triton's interpreter).
"""

# No `from __future__ import annotations`: `torch.library.custom_op` reads the op's signature from its annotations.
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..graph import Graph, Node
from .torch_lowering import is_depthwise


@dataclass(frozen=True)
class Tile:
    """What one program of the kernel computes: `pixels` output pixels x `channels` channels, in `warps` warps;
    `unroll_rows`: every tap unrolled, or a loop over the kernel's rows with each row's taps unrolled."""

    pixels: int
    channels: int
    warps: int
    unroll_rows: bool


# Run 22 (tools/depthwise_kernel_tune.py, H100, batch 1): the quickest tile on every depthwise convolution of
# convnext_tiny (its 18 in 117 us against 144 for run 21's 32 x 64 in 4 warps, every tap unrolled, and 264 on
# cuDNN) and on edgenext_small's 7x7 and 9x9 ones: more, smaller programs for maps of a few thousand pixels. The
# row loop ran about as fast as unrolled taps in run 21's tile (convnext_tiny 137 against 144 us, edgenext_small
# 104 against 100) and keeps Triton's compile ~1 s at any size, where unrolled taps grow it (sm_90 on a 2-core CPU,
# tools/depthwise_kernel_compile_time.py: 7x7 21 s, 9x9 60 s, 11x11 138 s; mixnet_s's build spent 116-148 s on
# them in run 21). The compile runs at the kernel's first call in each process, outside the caches a bundle
# carries.
TILE = Tile(pixels=32, channels=32, warps=2, unroll_rows=False)


@triton.jit
def _tap_row(
    acc, x_ptr, w_ptr, n, oh, ow, c, in_p, in_c, i, height, width, channels,
    stride_h: tl.constexpr, stride_w: tl.constexpr, top: tl.constexpr, left: tl.constexpr,
    dilation_h: tl.constexpr, dilation_w: tl.constexpr, kh: tl.constexpr, kw: tl.constexpr,
):
    # The kw taps of kernel row i: x and out channels-last, (n, h, w, c) at ((n * H + h) * W + w) * C + c; the
    # weight [C, kh * kw].
    ih = oh * stride_h - top + i * dilation_h
    for j in tl.static_range(kw):
        iw = ow * stride_w - left + j * dilation_w
        inside = in_p & (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)
        row = ((n * height + ih) * width + iw) * channels
        x = tl.load(x_ptr + row[:, None] + c[None, :], mask=inside[:, None] & in_c[None, :], other=0.0)
        tap = tl.load(w_ptr + c * (kh * kw) + (i * kw + j), mask=in_c, other=0.0)
        acc += x.to(tl.float32) * tap.to(tl.float32)[None, :]
    return acc


@triton.jit
def depthwise_conv2d_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, pixels, height, width, channels, out_height, out_width,
    stride_h: tl.constexpr, stride_w: tl.constexpr, top: tl.constexpr, left: tl.constexpr,
    dilation_h: tl.constexpr, dilation_w: tl.constexpr, kh: tl.constexpr, kw: tl.constexpr,
    has_bias: tl.constexpr, block_p: tl.constexpr, block_c: tl.constexpr, unroll_rows: tl.constexpr,
):
    p = tl.program_id(0) * block_p + tl.arange(0, block_p)
    c = tl.program_id(1) * block_c + tl.arange(0, block_c)
    n, rest = p // (out_height * out_width), p % (out_height * out_width)
    oh, ow = rest // out_width, rest % out_width
    in_p, in_c = p < pixels, c < channels
    acc = tl.zeros((block_p, block_c), dtype=tl.float32)
    if unroll_rows:
        for i in tl.static_range(kh):
            acc = _tap_row(acc, x_ptr, w_ptr, n, oh, ow, c, in_p, in_c, i, height, width, channels,
                           stride_h, stride_w, top, left, dilation_h, dilation_w, kh, kw)
    else:
        for i in range(kh):
            acc = _tap_row(acc, x_ptr, w_ptr, n, oh, ow, c, in_p, in_c, i, height, width, channels,
                           stride_h, stride_w, top, left, dilation_h, dilation_w, kh, kw)
    if has_bias:
        acc += tl.load(b_ptr + c, mask=in_c, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + p[:, None] * channels + c[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=in_p[:, None] & in_c[None, :])


def compiled_for(capability: int, kernel: int, tile: Tile = TILE):
    """Triton's compile of the kernel for a `kernel` x `kernel` convolution (stride 1, "same" padding, a bias) in
    `tile` for a GPU of this compute capability (90: sm_90), without one and without launching: what the tests
    inspect and tools/depthwise_kernel_compile_time.py times."""
    from triton.backends.compiler import GPUTarget

    constexprs = {"stride_h": 1, "stride_w": 1, "top": kernel // 2, "left": kernel // 2, "dilation_h": 1,
                  "dilation_w": 1, "kh": kernel, "kw": kernel, "has_bias": True, "block_p": tile.pixels,
                  "block_c": tile.channels, "unroll_rows": tile.unroll_rows}
    signature = {**{name: "*fp16" for name in ("x_ptr", "w_ptr", "b_ptr", "out_ptr")},
                 **{name: "i32" for name in ("pixels", "height", "width", "channels", "out_height", "out_width")},
                 **{name: "constexpr" for name in constexprs}}
    source = triton.compiler.ASTSource(fn=depthwise_conv2d_kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": tile.warps})


def depthwise_conv2d_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    stride: list[int], origin: list[int], dilation: list[int], out_size: list[int],
) -> torch.Tensor:
    """The kernel's launch: x [N, C, H, W] (read channels-last), weight [C, 1, kh, kw], the output [N, C, *out_size]
    channels-last; `origin` is the (top, left) padding, the bottom and right ones following from `out_size`."""
    n, channels, height, width = x.shape
    x = x.contiguous(memory_format=torch.channels_last)
    taps = weight.reshape(channels, -1).contiguous()
    out = torch.empty((n, channels, *out_size), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    pixels = n * out_size[0] * out_size[1]
    grid = (triton.cdiv(pixels, TILE.pixels), triton.cdiv(channels, TILE.channels))
    depthwise_conv2d_kernel[grid](
        x, taps, taps if bias is None else bias, out, pixels, height, width, channels, out_size[0], out_size[1],
        stride[0], stride[1], origin[0], origin[1], dilation[0], dilation[1], weight.shape[2], weight.shape[3],
        bias is not None, TILE.pixels, TILE.channels, TILE.unroll_rows, num_warps=TILE.warps,
    )
    return out


def _reference(x, weight, bias, stride, origin, dilation, out_size) -> torch.Tensor:
    """The kernel's function with `F.conv2d`: float32 products and sums, one rounding; channels-last out."""
    kh, kw = weight.shape[2:]
    bottom = (out_size[0] - 1) * stride[0] + dilation[0] * (kh - 1) + 1 - x.shape[2] - origin[0]
    right = (out_size[1] - 1) * stride[1] + dilation[1] * (kw - 1) + 1 - x.shape[3] - origin[1]
    padded = F.pad(x.float(), (origin[1], right, origin[0], bottom))
    y = F.conv2d(padded, weight.float(), None if bias is None else bias.float(), stride, 0, dilation, x.shape[1])
    return y.to(x.dtype).contiguous(memory_format=torch.channels_last)


@torch.library.custom_op("trtmc::depthwise_conv2d", mutates_args=())
def depthwise_conv2d(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    stride: list[int], origin: list[int], dilation: list[int], out_size: list[int],
) -> torch.Tensor:
    """conv2d(x, weight, groups=C) + bias as one Triton kernel on CUDA; channels-last out."""
    if x.is_cuda:
        return depthwise_conv2d_triton(x, weight, bias, stride, origin, dilation, out_size)
    return _reference(x, weight, bias, stride, origin, dilation, out_size)


@depthwise_conv2d.register_fake
def _depthwise_conv2d_fake(x, weight, bias, stride, origin, dilation, out_size):
    return torch.empty((x.shape[0], x.shape[1], *out_size), dtype=x.dtype, device=x.device,
                       memory_format=torch.channels_last)


@dataclass(frozen=True)
class DepthwiseKernel:
    """A depthwise convolution node computed by `trtmc::depthwise_conv2d` (a `torch_lowering` fusion of one
    node: nothing absorbed)."""

    convolution: Node
    absorbed: frozenset = frozenset()

    def lower(self, values: dict[str, torch.Tensor], w: Callable[[str], torch.Tensor]) -> torch.Tensor:
        a = self.convolution.attrs
        top, left, _, _ = a.padding
        bias = w(a.bias) if a.bias else None
        return torch.ops.trtmc.depthwise_conv2d(
            values[self.convolution.inputs[0]], w(a.weight), bias, list(a.stride), [top, left], list(a.dilation),
            list(self.convolution.type.shape[2:]))


def depthwise_kernels(graph: Graph, exclude: frozenset[str] = frozenset()) -> dict[str, DepthwiseKernel]:
    """Every depthwise convolution of the graph not in `exclude` (those run as taps), keyed by its name."""
    return {n.name: DepthwiseKernel(n) for n in graph.nodes if is_depthwise(n, graph) and n.name not in exclude}
