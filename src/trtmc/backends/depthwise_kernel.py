"""A depthwise convolution and its bias as one Triton kernel, for the compiled CUDA engine: the `depthwise-kernel`
lowering a build times (`inductor_lowerings.DEPTHWISE_KERNEL_AT_BUILD`; measured by `tools/gpu_session.sh
dwtriton`, runs 21 and 29).

At batch 1 cuDNN runs each depthwise convolution in ~8 us (edgenext_small's 13 launches of `conv2d_c1_k1_nhwc`:
106 us of its 514, run 19), several times what the map's bytes need; the taps (`torch_lowering._depthwise_taps`)
are fast there but unroll kh * kw strided reads for Inductor to fuse, whose compile time capped them at 5x5
(run 16). This kernel reads the channels-last map once per tap from each program's tile of output pixels and
channels, accumulates in float32 and rounds once: one compile per shape (Triton's, at the first call), not one
fused kernel per tap. Its tile (`TILE`: 32 pixels x 32 channels in 2 warps, a loop over the kernel's rows) is the
quickest that `tools/depthwise_kernel_tune.py` found at batch 1 (run 22).

A convolution of stride 1 without dilation (most of them: every one of convnext_tiny's and edgenext_small's) runs
on the row kernel instead (`depthwise_rows_kernel`, `ROW_TILE`): a program keeps one accumulator for each of a few
output rows, loads each input strip once and adds it into every output row that uses it, so it loads
(rows + kh - 1) * kw strips for rows * kh * kw multiply-adds where the flat kernel loads one strip per multiply-add
(run 29, `tools/depthwise_kernel_tune.py`, H100, one convolution at a time: convnext_tiny's 18 7x7 convolutions at
batch 128 in 2,243 us against cuDNN's 2,927 and the flat kernel's 3,096; edgenext_small's 21 in 777 against
1,619). Its taps must be laid out for it (`taps_major_weights`): from channels-last weights it took 3,915 us.

`trtmc::depthwise_conv2d` is the custom op Inductor keeps as one extern call; on a CPU it computes the same
function with `F.conv2d` in float32 (the tests compare the kernels with it under Triton's interpreter).
"""

# No `from __future__ import annotations`: `torch.library.custom_op` reads the op's signature from its annotations.
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..graph import Graph, Node
from .torch_lowering import buffer_name, is_depthwise


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


@dataclass(frozen=True)
class RowTile:
    """What one program of the row kernel computes: `rows` output rows (1 to 4: one accumulator each) x `columns`
    columns x `channels` channels, in `warps` warps."""

    rows: int
    columns: int
    channels: int
    warps: int

    def __post_init__(self) -> None:
        if not 1 <= self.rows <= 4:
            raise ValueError(f"the row kernel keeps 1 to 4 output rows' accumulators, not {self.rows}")


# Run 29 (tools/depthwise_kernel_tune.py, H100, every depthwise convolution of convnext_tiny, edgenext_small and
# ghostnet_100 one at a time): the quickest row tile summed over convnext_tiny and edgenext_small at batch 128
# (2,309 and 792 us with its taps laid out for it; 2 rows 2,939 and 875; 4 rows 4,652 and 1,371, the cause not
# examined: four 16 x 32 accumulators in 2 warps may spill) and within 6% of the quickest at batch 1 (2 rows).
ROW_TILE = RowTile(rows=3, columns=16, channels=32, warps=2)


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


@triton.jit
def _row_tap(acc, x, w_ptr, c, in_c, stride_wc, stride_wh, stride_ww, i: tl.constexpr, j: tl.constexpr,
             kh: tl.constexpr):
    # One output row's share of a loaded input strip: its tap (i, j), where i is one of the kernel's rows.
    if i >= 0:
        if i < kh:
            tap = tl.load(w_ptr + c * stride_wc + i * stride_wh + j * stride_ww, mask=in_c, other=0.0)
            acc += x * tap.to(tl.float32)[None, :]
    return acc


@triton.jit
def _row_store(acc, bias, out_ptr, n, oh, ow, c, in_c, channels, out_height, out_width):
    at = ((n * out_height + oh) * out_width + ow) * channels
    inside = (oh < out_height) & (ow < out_width)
    tl.store(out_ptr + at[:, None] + c[None, :], (acc + bias[None, :]).to(out_ptr.dtype.element_ty),
             mask=inside[:, None] & in_c[None, :])


@triton.jit
def depthwise_rows_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, height, width, channels, out_height, out_width, stride_wc, stride_wh, stride_ww,
    top: tl.constexpr, left: tl.constexpr, kh: tl.constexpr, kw: tl.constexpr, has_bias: tl.constexpr,
    rows: tl.constexpr, block_w: tl.constexpr, block_c: tl.constexpr,
):
    # Stride 1, no dilation; x and out channels-last, the weight [C, 1, kh, kw] at any strides. A program: `rows`
    # output rows from oh0 of image n, block_w columns, block_c channels. Input row oh0 - top + t, shifted by tap
    # column j, feeds output row oh0 + r through tap (t - r, j): every loop unrolled, so each row's tap is known
    # when compiling and no row multiplies by a tap outside the kernel.
    row_blocks = tl.cdiv(out_height, rows)
    n = tl.program_id(0) // row_blocks
    oh0 = (tl.program_id(0) % row_blocks) * rows
    ow = tl.program_id(1) * block_w + tl.arange(0, block_w)
    c = tl.program_id(2) * block_c + tl.arange(0, block_c)
    in_c = c < channels
    acc0 = tl.zeros((block_w, block_c), dtype=tl.float32)
    acc1 = tl.zeros((block_w, block_c), dtype=tl.float32)
    acc2 = tl.zeros((block_w, block_c), dtype=tl.float32)
    acc3 = tl.zeros((block_w, block_c), dtype=tl.float32)
    for t in tl.static_range(rows + kh - 1):
        ih = oh0 - top + t
        row_inside = (ih >= 0) & (ih < height)
        for j in tl.static_range(kw):
            iw = ow - left + j
            inside = row_inside & (iw >= 0) & (iw < width)
            x = tl.load(x_ptr + (((n * height + ih) * width + iw) * channels)[:, None] + c[None, :],
                        mask=inside[:, None] & in_c[None, :], other=0.0).to(tl.float32)
            acc0 = _row_tap(acc0, x, w_ptr, c, in_c, stride_wc, stride_wh, stride_ww, t, j, kh)
            if rows > 1:
                acc1 = _row_tap(acc1, x, w_ptr, c, in_c, stride_wc, stride_wh, stride_ww, t - 1, j, kh)
            if rows > 2:
                acc2 = _row_tap(acc2, x, w_ptr, c, in_c, stride_wc, stride_wh, stride_ww, t - 2, j, kh)
            if rows > 3:
                acc3 = _row_tap(acc3, x, w_ptr, c, in_c, stride_wc, stride_wh, stride_ww, t - 3, j, kh)
    bias = tl.zeros((block_c,), dtype=tl.float32)
    if has_bias:
        bias = tl.load(b_ptr + c, mask=in_c, other=0.0).to(tl.float32)
    _row_store(acc0, bias, out_ptr, n, oh0, ow, c, in_c, channels, out_height, out_width)
    if rows > 1:
        _row_store(acc1, bias, out_ptr, n, oh0 + 1, ow, c, in_c, channels, out_height, out_width)
    if rows > 2:
        _row_store(acc2, bias, out_ptr, n, oh0 + 2, ow, c, in_c, channels, out_height, out_width)
    if rows > 3:
        _row_store(acc3, bias, out_ptr, n, oh0 + 3, ow, c, in_c, channels, out_height, out_width)


def on_rows(stride: list[int], dilation: list[int]) -> bool:
    """Whether a depthwise convolution runs on the row kernel (stride 1, no dilation) rather than the flat one."""
    return list(stride) == [1, 1] and list(dilation) == [1, 1]


def compiled_for(capability: int, kernel: int, tile: Tile | RowTile = TILE):
    """Triton's compile of the flat kernel (a `Tile`) or the row kernel (a `RowTile`) for a `kernel` x `kernel`
    convolution (stride 1, "same" padding, a bias) for a GPU of this compute capability (90: sm_90), without one
    and without launching: what the tests inspect and tools/depthwise_kernel_compile_time.py times."""
    from triton.backends.compiler import GPUTarget

    same = {"top": kernel // 2, "left": kernel // 2, "kh": kernel, "kw": kernel, "has_bias": True}
    sizes = ["height", "width", "channels", "out_height", "out_width"]
    if isinstance(tile, RowTile):
        fn, sizes = depthwise_rows_kernel, sizes + ["stride_wc", "stride_wh", "stride_ww"]
        constexprs = {**same, "rows": tile.rows, "block_w": tile.columns, "block_c": tile.channels}
    else:
        fn, sizes = depthwise_conv2d_kernel, ["pixels"] + sizes
        constexprs = {**same, "stride_h": 1, "stride_w": 1, "dilation_h": 1, "dilation_w": 1,
                      "block_p": tile.pixels, "block_c": tile.channels, "unroll_rows": tile.unroll_rows}
    signature = {**{name: "*fp16" for name in ("x_ptr", "w_ptr", "b_ptr", "out_ptr")},
                 **{name: "i32" for name in sizes}, **{name: "constexpr" for name in constexprs}}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": tile.warps})


def depthwise_conv2d_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    stride: list[int], origin: list[int], dilation: list[int], out_size: list[int],
) -> torch.Tensor:
    """The kernel's launch: x [N, C, H, W] (read channels-last), weight [C, 1, kh, kw], the output [N, C, *out_size]
    channels-last; `origin` is the (top, left) padding, the bottom and right ones following from `out_size`."""
    n, channels, height, width = x.shape
    x = x.contiguous(memory_format=torch.channels_last)
    out = torch.empty((n, channels, *out_size), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if on_rows(stride, dilation):
        t = ROW_TILE
        grid = (n * triton.cdiv(out_size[0], t.rows), triton.cdiv(out_size[1], t.columns),
                triton.cdiv(channels, t.channels))
        depthwise_rows_kernel[grid](
            x, weight, weight if bias is None else bias, out, height, width, channels, out_size[0], out_size[1],
            weight.stride(0), weight.stride(2), weight.stride(3), origin[0], origin[1], weight.shape[2],
            weight.shape[3], bias is not None, t.rows, t.columns, t.channels, num_warps=t.warps,
        )
        return out
    taps = weight.reshape(channels, -1).contiguous()
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


def taps_major_weights(module: torch.nn.Module, kernels: Mapping[str, DepthwiseKernel]) -> torch.nn.Module:
    """`module` (from `to_fx` with these `kernels`, its convolution weights made channels-last) with the weights of
    the convolutions the row kernel runs laid out tap by tap, each tap's channels one float32 vector: [C, 1, kh, kw]
    at strides (1, C * kh * kw, kw * C, C). A program of the row kernel loads each of its kh * kw taps for its
    channels once; from channels-last weights ([C, kh * kw]) that is one scalar load and conversion per channel and
    tap, from these one vector (run 29, H100, convnext_tiny's 18 convolutions one at a time at batch 128: 3,915 us
    channels-last, 2,456 taps-major in half precision, 2,243 in float32; cuDNN 2,927). Float32 holds a half or
    bfloat16 weight exactly, so the sums are the same; the kernel reads any layout by its strides."""
    for kernel in kernels.values():
        a = kernel.convolution.attrs
        name = buffer_name(a.weight)
        tensor = getattr(module, name, None)  # tracing keeps only the buffers the forward reads
        if tensor is not None and on_rows(a.stride, a.dilation):
            setattr(module, name, tensor.float().permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1))
    return module
