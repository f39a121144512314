"""A depthwise convolution and its bias as one Triton kernel, for the compiled CUDA engine: the `depthwise-kernel`
lowering a build times (`inductor_lowerings.DEPTHWISE_KERNEL_AT_BUILD`; measured by `tools/gpu_session.sh
dwtriton`, runs 21 and 29, and `dwtune`, runs 22, 29 and 31).

At batch 1 cuDNN runs each depthwise convolution in ~8 us (edgenext_small's 13 launches of `conv2d_c1_k1_nhwc`:
106 us of its 514, run 19), several times what the map's bytes need; the taps (`torch_lowering._depthwise_taps`)
are fast there but unroll kh * kw strided reads for Inductor to fuse, whose compile time capped them at 5x5
(run 16). This kernel reads the channels-last map once per tap from each program's tile of output pixels and
channels, accumulates in float32 and rounds once: one compile per shape (Triton's, at the first call), not one
fused kernel per tap. Its tile (`TILE`: 32 pixels x 32 channels in 2 warps, a loop over the kernel's rows) is the
quickest that `tools/depthwise_kernel_tune.py` found at batch 1 (run 22).

A convolution of stride 1 without dilation and a kernel up to `WINDOW_MAX_KERNEL` wide (most of them: every one of
convnext_tiny's and edgenext_small's) runs on the window kernel instead (`depthwise_window_kernel`, `WINDOW_TILE`): a
program computes a window of output pixels, each pixel's channels an accumulator of their own and each tap's
channels held for the whole program, and loads each input pixel of the window once, adding it into every output
pixel that uses it: (rows + kh - 1) * (columns + kw - 1) loads for rows * columns * kh * kw multiply-adds, where the
flat kernel loads one pixel strip per multiply-add (run 31, `tools/depthwise_kernel_tune.py`, H100, one convolution
at a time at batch 128: convnext_tiny's 18 7x7 convolutions in 1,422 us against run 29's row kernel's 2,243 and
cuDNN's 2,914; edgenext_small's 21 in 505 against 777 and 1,617). Its taps must be laid out for it
(`taps_major_weights`).

`trtmc::depthwise_conv2d` is the custom op Inductor keeps as one extern call, so its kernels are not in Inductor's
caches and a bundle carries them compiled (`JIT_KERNELS`, `triton_cache`); on a CPU it computes the same function
with `F.conv2d` in float32 (the tests compare the kernels with it under Triton's interpreter).
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
# them in run 21). The compile runs at the kernel's first call in a process whose Triton cache lacks it, outside
# Inductor's caches: a bundle carries it compiled beside them (`JIT_KERNELS`, `triton_cache`).
TILE = Tile(pixels=32, channels=32, warps=2, unroll_rows=False)


@dataclass(frozen=True)
class WindowTile:
    """What one program of the window kernel computes: `rows` x `columns` output pixels x `channels` channels, in
    `warps` warps; every pixel an accumulator of its own, so a program holds rows * columns of them and its taps."""

    rows: int
    columns: int
    channels: int
    warps: int

    def __post_init__(self) -> None:
        if not (self.rows >= 1 and self.columns >= 1 and self.rows * self.columns <= 32):
            raise ValueError(f"a window of {self.rows} x {self.columns} pixels: the window kernel keeps one "
                             "accumulator per pixel in registers, 1 to 32 of them")


# Run 31 (tools/depthwise_kernel_tune.py, H100, every depthwise convolution of convnext_tiny and edgenext_small one
# at a time): 4 x 4 pixels x 64 channels in one warp the quickest single tile on edgenext_small at batch 1 and 128
# (83.5 and 505 us) and within 2% (batch 1) and 12% (batch 128: 1,422 against 1,265 us at 4 x 7) of the quickest on
# convnext_tiny. Compiled on a CPU for sm_90a (tools/depthwise_kernel_sass.py, run 30): 1.75 instructions per
# multiply-add against the row kernel's 2.48, no spills on Triton 3.6 or 3.8.
WINDOW_TILE = WindowTile(rows=4, columns=4, channels=64, warps=1)

# Triton unrolls the whole window, and its compile grows with it (run 30, sm_90a on a 2-core CPU, Triton 3.6: 7x7
# ~8 s, 9x9 ~25 s); a wider stride-1 kernel runs on the flat kernel, whose loop over the rows compiles in ~1 s.
WINDOW_MAX_KERNEL = 9


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
def _window_store(acc, bias, out_ptr, n, oh, ow, c, in_c, channels, out_height, out_width):
    inside = (oh < out_height) & (ow < out_width)
    at = ((n * out_height + oh) * out_width + ow) * channels
    tl.store(out_ptr + at + c, (acc + bias).to(out_ptr.dtype.element_ty), mask=in_c & inside)


@triton.jit
def depthwise_window_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, height, width, channels, out_height, out_width, stride_wc, stride_wh, stride_ww,
    top: tl.constexpr, left: tl.constexpr, kh: tl.constexpr, kw: tl.constexpr, has_bias: tl.constexpr,
    rows: tl.constexpr, cols: tl.constexpr, block_c: tl.constexpr,
):
    # Stride 1, no dilation; x and out channels-last, the weight [C, 1, kh, kw] at any strides. A program: a window
    # of `rows` x `cols` output pixels of image n from (oh0, ow0), block_c channels; each pixel's channels one
    # accumulator vector (a tuple of rows * cols), each tap's channels one vector held for the whole program. Input
    # pixel (t, u) of the window's (rows + kh - 1) x (cols + kw - 1) is loaded once and added into every output
    # pixel (r, s) that uses it, through tap (t - r, u - s): every loop unrolled, so the shifts cost nothing at run
    # time (Triton cannot shift a loaded tile, so a tile of pixels would be loaded once per tap column).
    row_blocks = tl.cdiv(out_height, rows)
    n = tl.program_id(0) // row_blocks
    oh0 = (tl.program_id(0) % row_blocks) * rows
    ow0 = tl.program_id(1) * cols
    c = tl.program_id(2) * block_c + tl.arange(0, block_c)
    in_c = c < channels
    taps = ()
    for i in tl.static_range(kh):
        for j in tl.static_range(kw):
            tap = tl.load(w_ptr + c * stride_wc + i * stride_wh + j * stride_ww, mask=in_c, other=0.0)
            taps = taps + (tap.to(tl.float32),)
    accs = ()
    for _ in tl.static_range(rows * cols):
        accs = accs + (tl.zeros((block_c,), dtype=tl.float32),)
    row_step = width * channels
    x_image = x_ptr + n * height * row_step + c
    for t in tl.static_range(rows + kh - 1):
        ih = oh0 - top + t
        row_inside = (ih >= 0) & (ih < height)
        x_row = x_image + ih * row_step
        for u in tl.static_range(cols + kw - 1):
            iw = ow0 - left + u
            inside = row_inside & (iw >= 0) & (iw < width)
            x = tl.load(x_row + iw * channels, mask=in_c & inside, other=0.0).to(tl.float32)
            added = ()
            for r in tl.static_range(rows):
                for s in tl.static_range(cols):
                    acc = accs[r * cols + s]
                    if t - r >= 0:
                        if t - r < kh:
                            if u - s >= 0:
                                if u - s < kw:
                                    acc = acc + x * taps[(t - r) * kw + (u - s)]
                    added = added + (acc,)
            accs = added
    bias = tl.zeros((block_c,), dtype=tl.float32)
    if has_bias:
        bias = tl.load(b_ptr + c, mask=in_c, other=0.0).to(tl.float32)
    for r in tl.static_range(rows):
        for s in tl.static_range(cols):
            _window_store(accs[r * cols + s], bias, out_ptr, n, oh0 + r, ow0 + s, c, in_c, channels, out_height,
                          out_width)


JIT_KERNELS = (depthwise_conv2d_kernel, depthwise_window_kernel)  # what a bundle carries compiled (`triton_cache`)


def on_window(kernel: list[int], stride: list[int], dilation: list[int]) -> bool:
    """Whether a depthwise convolution runs on the window kernel (stride 1, no dilation, a kernel up to
    `WINDOW_MAX_KERNEL`) rather than the flat one."""
    return list(stride) == [1, 1] and list(dilation) == [1, 1] and max(kernel) <= WINDOW_MAX_KERNEL


def compiled_for(capability: int, kernel: int, tile: Tile | WindowTile = TILE):
    """Triton's compile of the flat kernel (a `Tile`) or the window kernel (a `WindowTile`) for a `kernel` x `kernel`
    convolution (stride 1, "same" padding, a bias) for a GPU of this compute capability (90: sm_90), without one
    and without launching: what the tests inspect and tools/depthwise_kernel_compile_time.py times."""
    from triton.backends.compiler import GPUTarget

    same = {"top": kernel // 2, "left": kernel // 2, "kh": kernel, "kw": kernel, "has_bias": True}
    sizes = ["height", "width", "channels", "out_height", "out_width"]
    if isinstance(tile, WindowTile):
        fn, sizes = depthwise_window_kernel, sizes + ["stride_wc", "stride_wh", "stride_ww"]
        constexprs = {**same, "rows": tile.rows, "cols": tile.columns, "block_c": tile.channels}
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
    if on_window(weight.shape[2:], stride, dilation):
        t = WINDOW_TILE
        grid = (n * triton.cdiv(out_size[0], t.rows), triton.cdiv(out_size[1], t.columns),
                triton.cdiv(channels, t.channels))
        depthwise_window_kernel[grid](
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


# An extern call, not a `torch.library.triton_op` that Inductor compiles as one of its own kernels: run 33 (H100,
# torch 2.11) tried that, and against run 32's extern call the candidate timed slower at build (efficientnet_b0
# batch 1 0.347 ms against 0.314; convnext_tiny batch 128 6.907 against 6.661, with a 4 x 7 window beside it), the
# builds that offer it took up to 6x longer (convnext_tiny's prepare 534 s against 90) and bundles that kept it still
# loaded slowly (edgenext_small 74.5 s against 53.1).
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
    the convolutions the window kernel runs laid out tap by tap, each tap's channels one float32 vector: [C, 1, kh,
    kw] at strides (1, C * kh * kw, kw * C, C). A program of the window kernel loads each of its kh * kw taps for its
    channels once; from channels-last weights ([C, kh * kw]) that is one scalar load and conversion per channel and
    tap, from these one vector (run 29, H100, on the row kernel before the window kernel, convnext_tiny's 18
    convolutions one at a time at batch 128: 3,915 us channels-last, 2,456 taps-major in half precision, 2,243 in
    float32; cuDNN 2,927). Float32 holds a half or bfloat16 weight exactly, so the sums are the same; the kernel
    reads any layout by its strides."""
    for kernel in kernels.values():
        a = kernel.convolution.attrs
        name = buffer_name(a.weight)
        tensor = getattr(module, name, None)  # tracing keeps only the buffers the forward reads
        if tensor is not None and on_window(tensor.shape[2:], a.stride, a.dilation):
            setattr(module, name, tensor.float().permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1))
    return module
