"""Tuning trtmc's Triton depthwise kernel on the GPU, one convolution at a time (issue 12).

    PYTHONPATH=src python3 tools/depthwise_kernel_tune.py OUT_DIR ARCH... [--batch N ...] [--seconds S]
        [--compile-only]
    TRITON_INTERPRET=1 PYTHONPATH=src python3 tools/depthwise_kernel_tune.py --check ARCH... [--batch N ...]

Run 21 (H100, `gpu_session.sh dwtriton`) measured the kernel as then built (a tile of 32 output pixels x 64
channels, 4 warps, every tap unrolled up to 7x7) at ~8 us a convolution at batch 1 (edgenext_small: 15 in 123 us;
convnext_tiny: 18 in 148 us, against cuDNN's 217 us), a few times what the maps' bytes need, and at batch 128
twice cuDNN's time (convnext_tiny 4.83 against 2.28 ms). A batch-1 map of 56x56x96 gives that tile 196 programs,
barely one per SM at 4 warps each (latency-bound); at batch 128 every tap re-reads its input from L2, since a strip
of 32 pixels shares no rows with its neighbours' taps. Run 22 (this probe) found 32 pixels x 32 channels in 2 warps,
looping over the kernel's rows, quickest at batch 1: the tile built since (`trtmc.backends.depthwise_kernel.TILE`).

For each architecture (random weights, fp16, the graph `trtmc build` prepares) and batch size, every distinct
depthwise convolution (shape, kernel, stride, padding; how many the network has) is run on random pixels with
the layer's weights by: cuDNN (`F.conv2d` channels-last, as the engine's extern call runs it); the kernel as built
(`TILE`); run 21's tile (`flat 32 64 4`: every tap unrolled up to 7x7, at a compile time that grows with them) and
the same looping over the kernel's rows; other tiles and warp counts, looping (`flat P C W looped`);
a row-tiled variant defined here (`rows R W C N`: each program computes R output rows x W columns x C channels
and loads each input row's strip once per horizontal tap, for all R output rows that use it: (R * stride + kh - 1)
* kw loads instead of R * kh * kw; a loop over the input rows, each row's taps unrolled, every row multiplying
each strip by its tap or a zero); the product's row kernel of runs 29-30, kept here (`depthwise_rows_kernel`,
stride 1 only: one accumulator per row, every loop unrolled, no zero taps) at its tile (`ROW_TILE`, `reuse 3 16 32
2`) and others (`reuse R W C N`), its taps as the engine's channels-last weights or laid out tap by tap (`,
taps-major`; `, taps-major float32`, as `taps_major_weights` lays them out); and the product's window kernel since
run 31 (`depthwise_window_kernel`, `window R S C N`, stride 1 only, kernels up to 9x9: each program R x S output
pixels x C channels in N warps, every pixel's channels an accumulator of their own and every tap held for the
program, each input pixel of the window loaded once: (R + kh - 1) * (S + kw - 1) loads for R * S * kh * kw
multiply-adds) at its tile (`WINDOW_TILE`, `window 4 4 64 1`) and others.
`--cudnn-benchmark` times cuDNN's quickest algorithm for each shape instead of its heuristic's pick (run it in a
process of its own); `--variants REGEX` times only the variants it matches.
Each is checked against `F.conv2d` in float32 (within one half-precision rounding of the output's largest value;
a wrong variant is reported, never timed), captured in a CUDA graph of back-to-back calls and timed by CUDA events
(median of 10 replays). The summary sums each variant over the network (times the count of each convolution):
over the convolutions the engine leaves to cuDNN at that batch (not taps; what the `depthwise-kernel` lowering
puts on the kernel) and over all. `--compile-only` runs each variant once (Triton's disk cache then makes the
timed run's compiles warm: run one process per architecture in parallel first). `--check` (under
`TRITON_INTERPRET=1`, on a CPU) checks every variant's output on every convolution, shrunk to a map the
interpreter runs in seconds (`shrunk`: same kernel, stride, padding and dilation), and times nothing.
Writes OUT_DIR/ARCH.json (after each batch size) and prints one line per convolution.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from trtmc.backends.depthwise_kernel import (
    TILE, WINDOW_TILE, depthwise_conv2d_kernel, depthwise_kernels, depthwise_window_kernel, on_window,
)
from trtmc.backends.torch_lowering import depthwise_taps_nodes

from probe_common import random_fp16_graph

ONE_ROUNDING = 2.0**-10
AS_BUILT = f"flat {TILE.pixels} {TILE.channels} {TILE.warps}" + ("" if TILE.unroll_rows else " looped")


@triton.jit
def _depthwise_rows_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, height, width, channels, out_height, out_width,
    stride_h: tl.constexpr, stride_w: tl.constexpr, top: tl.constexpr, left: tl.constexpr,
    dilation_h: tl.constexpr, dilation_w: tl.constexpr, kh: tl.constexpr, kw: tl.constexpr,
    has_bias: tl.constexpr, rows: tl.constexpr, block_w: tl.constexpr, block_c: tl.constexpr,
):
    # x and out channels-last; the weight [C, kh * kw]. A program: `rows` output rows from oh0 of image n,
    # `block_w` columns, `block_c` channels. Input row t of the program's window feeds output row r through tap
    # row i = (t - r * stride_h) / dilation_h where that is a whole number in [0, kh).
    row_blocks = tl.cdiv(out_height, rows)
    n = tl.program_id(0) // row_blocks
    oh0 = (tl.program_id(0) % row_blocks) * rows
    r = tl.arange(0, rows)
    ow = tl.program_id(1) * block_w + tl.arange(0, block_w)
    c = tl.program_id(2) * block_c + tl.arange(0, block_c)
    in_r, in_w, in_c = oh0 + r < out_height, ow < out_width, c < channels
    acc = tl.zeros((rows, block_w, block_c), dtype=tl.float32)
    for t in range((rows - 1) * stride_h + (kh - 1) * dilation_h + 1):  # a loop: ~1 s to compile at any size
        ih = oh0 * stride_h - top + t
        d = t - r * stride_h
        i = d // dilation_h
        uses = in_r & (d >= 0) & (d % dilation_h == 0) & (i < kh)
        for j in tl.static_range(kw):
            iw = ow * stride_w - left + j * dilation_w
            inside = in_w & (iw >= 0) & (iw < width) & (ih >= 0) & (ih < height)
            x = tl.load(x_ptr + (((n * height + ih) * width + iw) * channels)[:, None] + c[None, :],
                        mask=inside[:, None] & in_c[None, :], other=0.0)
            tap = tl.load(w_ptr + c[None, :] * (kh * kw) + (i * kw + j)[:, None],
                          mask=uses[:, None] & in_c[None, :], other=0.0)
            acc += x.to(tl.float32)[None, :, :] * tap.to(tl.float32)[:, None, :]
    if has_bias:
        acc += tl.load(b_ptr + c, mask=in_c, other=0.0).to(tl.float32)[None, None, :]
    oh = oh0 + r
    at = (((n * out_height + oh) * out_width)[:, None, None] + ow[None, :, None]) * channels + c[None, None, :]
    mask = in_r[:, None, None] & in_w[None, :, None] & in_c[None, None, :]
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=mask)


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


# Run 29 (this tool, H100, every depthwise convolution of convnext_tiny, edgenext_small and ghostnet_100 one at a
# time; the product's from then to run 31, when the window kernel replaced it): the quickest row tile summed over
# convnext_tiny and edgenext_small at batch 128 (2,309 and 792 us with its taps laid out for it; 2 rows 2,939 and
# 875; 4 rows 4,652 and 1,371, the cause not examined: four 16 x 32 accumulators in 2 warps may spill) and within 6%
# of the quickest at batch 1 (2 rows).
ROW_TILE = RowTile(rows=3, columns=16, channels=32, warps=2)


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


@dataclass(frozen=True)
class Conv:
    """One depthwise convolution of a network at a batch size; `count`: how many of the network's are this one."""

    batch: int
    channels: int
    height: int
    width: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    out_size: tuple[int, int]
    bias: bool
    taps: bool  # the engine runs it as fused taps at this batch size
    count: int = 1

    @property
    def key(self) -> tuple:
        return tuple(v for k, v in asdict(self).items() if k != "count")

    def __str__(self) -> str:
        kind = "taps" if self.taps else "cuDNN"
        return (f"{self.channels}x{self.height}x{self.width} {self.kernel[0]}x{self.kernel[1]} s{self.stride[0]} "
                f"x{self.count} ({kind} in the engine)")


def network_convs(graph, batch: int) -> list[Conv]:
    taps = depthwise_taps_nodes(graph, batch)
    by_key: dict[tuple, Conv] = {}
    for name, k in depthwise_kernels(graph).items():
        node, a = k.convolution, k.convolution.attrs
        _, channels, height, width = graph.node(node.inputs[0]).type.shape
        conv = Conv(batch, channels, height, width, tuple(graph.weights[a.weight].shape[2:]), tuple(a.stride),
                    tuple(a.padding), tuple(a.dilation), tuple(node.type.shape[2:]), bool(a.bias), name in taps)
        seen = by_key.get(conv.key)
        by_key[conv.key] = conv if seen is None else Conv(**{**asdict(seen), "count": seen.count + 1})
    return list(by_key.values())


def shrunk(conv: Conv) -> Conv:
    """The same convolution (kernel, stride, padding, dilation) on a map small enough for Triton's interpreter:
    at most 72 channels (still more than one 64-channel tile) and 11x13 pixels (odd, for the edges' masks)."""
    height, width = min(conv.height, 11), min(conv.width, 13)
    top, left, bottom, right = conv.padding
    out = tuple((size + a + b - d * (k - 1) - 1) // s + 1 for size, a, b, d, k, s in zip(
        (height, width), (top, left), (bottom, right), conv.dilation, conv.kernel, conv.stride))
    return Conv(**{**asdict(conv), "channels": min(conv.channels, 72), "height": height, "width": width,
                   "out_size": out})


def variants() -> dict[str, Callable]:
    """Name -> launch(x, taps, bias, out, conv): the kernel as built, other tiles of it, the row-tiled one."""
    def flat(block_p: int, block_c: int, warps: int, loop_rows: bool = True):
        def launch(x, taps, bias, out, conv: Conv):
            unroll = not loop_rows and conv.kernel[0] * conv.kernel[1] <= 49  # run 21's rule: unrolled up to 7x7
            pixels = conv.batch * conv.out_size[0] * conv.out_size[1]
            grid = (triton.cdiv(pixels, block_p), triton.cdiv(conv.channels, block_c))
            depthwise_conv2d_kernel[grid](
                x, taps, taps if bias is None else bias, out, pixels, conv.height, conv.width, conv.channels,
                *conv.out_size, *conv.stride, *conv.padding[:2], *conv.dilation, *conv.kernel, bias is not None,
                block_p, block_c, unroll, num_warps=warps)
        return launch

    def rows(rows: int, block_w: int, block_c: int, warps: int):
        def launch(x, taps, bias, out, conv: Conv):
            grid = (conv.batch * triton.cdiv(conv.out_size[0], rows), triton.cdiv(conv.out_size[1], block_w),
                    triton.cdiv(conv.channels, block_c))
            _depthwise_rows_kernel[grid](
                x, taps, taps if bias is None else bias, out, conv.height, conv.width, conv.channels, *conv.out_size,
                *conv.stride, *conv.padding[:2], *conv.dilation, *conv.kernel, bias is not None,
                rows, block_w, block_c, num_warps=warps)
        return launch

    # A loop over the kernel's rows compiles in ~1 s at any size (tools/depthwise_kernel_compile_time.py; 7x7
    # unrolled ~20 s), so every tile loops but run 21's, which against its `looped` twin says what unrolling is worth.
    tiles = {AS_BUILT: flat(TILE.pixels, TILE.channels, TILE.warps, loop_rows=not TILE.unroll_rows),
             "flat 32 64 4": flat(32, 64, 4, loop_rows=False)}
    # Smaller tiles for more programs at batch 1; wider channel tiles for longer contiguous reads.
    for p, c, w in ((8, 64, 1), (16, 32, 1), (16, 64, 2), (32, 32, 2), (32, 64, 4), (64, 64, 4), (32, 128, 4),
                    (128, 32, 4)):
        tiles.setdefault(f"flat {p} {c} {w} looped", flat(p, c, w))
    for r, w_, c, n in ((2, 8, 32, 1), (2, 16, 64, 4), (4, 8, 64, 4), (4, 16, 32, 4), (4, 16, 64, 4),
                        (4, 32, 64, 8)):
        tiles[f"rows {r} {w_} {c} {n}"] = rows(r, w_, c, n)
    # Run 29: the row kernel (`depthwise_rows_kernel`: each input strip loaded once for every output row that uses
    # it) at other tiles and with its taps laid out channels-last ([kh * kw, C]: a tap's channels one vector), in
    # half or in float32 (run 29's first `reuse 3 16 32 2`). The flat kernel with float32 tap vectors (`wt`, no
    # quicker) and Toeplitz bands on the tensor cores (2.5x cuDNN's time on convnext_tiny at batch 128) are in
    # commit e737fe6.
    for tile in (ROW_TILE, RowTile(2, 16, 32, 2), RowTile(4, 8, 32, 1), RowTile(4, 16, 32, 2), RowTile(4, 16, 64, 4)):
        tiles.setdefault(reuse_name(tile), row_kernel(tile))
    tiles[reuse_name(ROW_TILE) + ", taps-major"] = row_kernel(ROW_TILE, taps_major=True)
    tiles[reuse_name(ROW_TILE) + ", taps-major float32"] = row_kernel(ROW_TILE, taps_major=True, dtype=torch.float32)
    # Run 30 (CPU, tools/depthwise_kernel_sass.py: SASS for sm_90a of convnext_tiny's first 7x7, Triton 3.6 as on the
    # GPU machine): the row kernel's tile issues 2.48 instructions per multiply-add, the window kernel at 4 x 4 pixels
    # x 64 channels in 1 warp 1.75, at 4 x 7 1.56, each channel pair's pixel one 32-bit load, no spills. Triton's
    # compile grows with the window (its coalescing pass over every load; 2-core CPU: 7x7 at 4 x 4 ~8 s, 4 x 7 ~18 s;
    # 9x9 at 4 x 4 ~25 s; the row kernel 3.4 s). 4 x 7 tiles convnext_tiny's maps (56, 28, 14, 7 wide) without idle
    # columns. Run 31 (this tool, H100): 4 x 4 x 64 in 1 warp the product's since (`WINDOW_TILE`).
    t = WINDOW_TILE
    for r, c_, ch, n in ((t.rows, t.columns, t.channels, t.warps), (4, 4, 128, 2), (2, 8, 64, 1), (4, 7, 64, 1)):
        tiles[f"window {r} {c_} {ch} {n}"] = window_kernel(r, c_, ch, n)
    return tiles


def derived(make: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`make(taps, *extra)` once per taps tensor and extra: weights laid out for a variant before its calls are
    timed, as a build would lay them out once."""
    made: dict = {}  # (id(taps), extra) -> (taps, the layout): taps kept alive, so no later tensor takes its id

    def get(taps: torch.Tensor, *extra) -> torch.Tensor:
        key = (id(taps), extra)
        if key not in made:
            made[key] = (taps, make(taps, *extra))
        return made[key][1]
    return get


def reuse_name(tile: RowTile) -> str:
    return f"reuse {tile.rows} {tile.columns} {tile.channels} {tile.warps}"


def row_kernel(tile: RowTile, taps_major: bool = False, dtype: torch.dtype | None = None):
    """The row kernel at `tile`, its taps as the engine passes them ([C, kh * kw]) or channels-last
    ([kh * kw, C], in `dtype`)."""
    return stride_one(depthwise_rows_kernel, tile.rows, tile.columns, tile.channels, tile.warps, taps_major, dtype)


def window_kernel(rows: int, cols: int, block_c: int, warps: int):
    """The window kernel (`depthwise_window_kernel`) at a tile, its taps laid out as `taps_major_weights` lays them
    out for it in the engine (each tap's channels one float32 vector)."""
    return stride_one(depthwise_window_kernel, rows, cols, block_c, warps, taps_major=True, dtype=torch.float32)


def stride_one(kernel, rows: int, cols: int, block_c: int, warps: int, taps_major: bool, dtype: torch.dtype | None):
    """A launch of a kernel that takes the row kernel's arguments (the row kernel, the window kernel: stride 1 only,
    a program `rows` x `cols` output pixels x `block_c` channels), its taps as the engine passes them ([C, kh * kw])
    or channels-last ([kh * kw, C], in `dtype`)."""
    layout = derived(lambda taps: taps.t().to(dtype or taps.dtype).contiguous())

    def launch(x, taps, bias, out, conv: Conv):
        if not on_window(conv.kernel, conv.stride, conv.dilation):
            return False  # the flat kernel's convolution
        kh, kw = conv.kernel
        w, strides = (layout(taps), (1, kw * conv.channels, conv.channels)) if taps_major else (taps, (kh * kw, kw, 1))
        grid = (conv.batch * triton.cdiv(conv.out_size[0], rows), triton.cdiv(conv.out_size[1], cols),
                triton.cdiv(conv.channels, block_c))
        kernel[grid](
            x, w, taps if bias is None else bias, out, conv.height, conv.width, conv.channels, *conv.out_size,
            *strides, *conv.padding[:2], kh, kw, bias is not None, rows, cols, block_c, num_warps=warps)
    return launch


def tensors(conv: Conv, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((conv.batch, conv.channels, conv.height, conv.width), generator=g).half()
    weight = (torch.randn((conv.channels, 1, *conv.kernel), generator=g) / conv.kernel[0]).half()
    bias = torch.randn((conv.channels,), generator=g).half() if conv.bias else None
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return (x.to(device, memory_format=torch.channels_last), move(weight), move(bias))


def reference(x, weight, bias, conv: Conv) -> torch.Tensor:
    top, left, bottom, right = conv.padding
    padded = F.pad(x.float(), (left, right, top, bottom))
    y = F.conv2d(padded, weight.float(), None if bias is None else bias.float(), conv.stride, 0, conv.dilation,
                 conv.channels)
    return y.half().float()


def cudnn(x, weight, bias, conv: Conv) -> Callable[[], torch.Tensor]:
    top, left, bottom, right = conv.padding
    if (top, left) == (bottom, right):
        return lambda: F.conv2d(x, weight, bias, conv.stride, (top, left), conv.dilation, conv.channels)
    return lambda: F.conv2d(F.pad(x, (left, right, top, bottom)), weight, bias, conv.stride, 0, conv.dilation,
                            conv.channels)


def replay_us(fn: Callable[[], object]) -> float:
    """The median us a call of 10 CUDA-graph replays of back-to-back calls (~1 ms or more each)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    calls = max(5, min(200, int(1.0 / max(begin.elapsed_time(end), 1e-3))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    samples = []
    for _ in range(10):
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1000 / calls)
    return statistics.median(samples)


def run_conv(conv: Conv, launches: dict[str, Callable], device: str, timed: bool, seed: int) -> dict:
    x, weight, bias = tensors(conv, device, seed)
    taps = weight.reshape(conv.channels, -1).contiguous()
    expected = reference(x, weight, bias, conv)
    scale = float(expected.abs().max()) or 1.0
    row: dict = {**asdict(conv), "us": {}, "wrong": {}, "failed": {}}
    if timed:
        row["us"]["cudnn"] = replay_us(cudnn(x, weight, bias, conv))
    for name, launch in launches.items():
        out = torch.empty((conv.batch, conv.channels, *conv.out_size), dtype=x.dtype, device=device,
                          memory_format=torch.channels_last)
        try:
            if launch(x, taps, bias, out, conv) is False:
                continue
        except Exception as error:  # a variant Triton cannot compile here: reported, the others still timed
            row["failed"][name] = f"{type(error).__name__}: {str(error)[:300]}"
            continue
        error = float((out.float() - expected).abs().max()) / scale
        if error > ONE_ROUNDING:
            row["wrong"][name] = error
        elif timed:
            row["us"][name] = replay_us(lambda: launch(x, taps, bias, out, conv))
    return row


def summary(rows: list[dict]) -> dict:
    """Each variant summed over the network (count x us): over the convolutions left to cuDNN, and over all."""
    def totals(chosen: list[dict]) -> dict:
        names = set.intersection(*(set(r["us"]) for r in chosen)) if chosen else set()
        sums = {n: round(sum(r["count"] * r["us"][n] for r in chosen), 1) for n in sorted(names)}
        best = sum(r["count"] * min((v for k, v in r["us"].items() if k != "cudnn"), default=float("nan"))
                   for r in chosen)
        best_or_cudnn = sum(r["count"] * min(r["us"].values()) for r in chosen)
        ranked = sorted((v, n) for n, v in sums.items())
        return {"convolutions": sum(r["count"] for r in chosen), "us": sums, "best kernel per shape": round(best, 1),
                "best of kernel and cudnn per shape": round(best_or_cudnn, 1),
                "fastest single variant": ranked[0][1] if ranked else None}
    timed = [r for r in rows if r["us"]]
    return {"left to cudnn": totals([r for r in timed if not r["taps"]]), "all": totals(timed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", help="folder for ARCH.json (not with --check)")
    parser.add_argument("archs", nargs="+")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 1 and 128)")
    parser.add_argument("--seconds", type=float, default=1e9, help="stop timing after this long (results so far kept)")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--variants", help="only the variants whose names match this regular expression")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="cuDNN in its benchmark mode (its quickest algorithm for each shape, not its heuristic's "
                             "pick); in a process of its own, since ATen caches the plan a shape first got")
    parser.add_argument("--check", action="store_true", help="every variant's output on every shape, nothing timed "
                                                              "(on a CPU under TRITON_INTERPRET=1)")
    args = parser.parse_args()
    if args.check:
        args.archs = [args.out, *args.archs] if args.out else args.archs
    elif not torch.cuda.is_available():
        sys.exit("timing needs a GPU; on a CPU use --check under TRITON_INTERPRET=1")
    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    launches = {name: launch for name, launch in variants().items()
                if not args.variants or re.search(args.variants, name)}
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    started, good = time.perf_counter(), True
    for arch in args.archs:
        result = {"arch": arch, "torch": torch.__version__, "triton": triton.__version__,
                  "cudnn_benchmark": args.cudnn_benchmark,
                  "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "batches": {}}
        graph = random_fp16_graph(arch)
        for batch in [1] if args.check else args.batch or [1, 128]:
            rows = []
            for seed, conv in enumerate(network_convs(graph, batch)):
                conv = shrunk(conv) if args.check else conv
                if time.perf_counter() - started > args.seconds:
                    print(f"{arch} b{batch}: out of time", flush=True)
                    break
                row = run_conv(conv, launches, device, timed=not (args.check or args.compile_only), seed=seed)
                good &= not row["wrong"]
                rows.append(row)
                fastest = sorted((v, k) for k, v in row["us"].items())[:3]
                print(f"{arch} b{batch} {conv}: " + (", ".join(f"{k} {v:.1f} us" for v, k in fastest) or "ran")
                      + (f"; cudnn {row['us']['cudnn']:.1f}, as built {row['us'].get(AS_BUILT, float('nan')):.1f}"
                         if row["us"] else "") + (f"; WRONG {row['wrong']}" if row["wrong"] else "")
                      + (f"; FAILED {row['failed']}" if row["failed"] else ""), flush=True)
            if args.check or args.compile_only:
                continue
            result["batches"][str(batch)] = {"convolutions": rows, "summary": summary(rows)}
            Path(args.out).mkdir(parents=True, exist_ok=True)
            Path(args.out, f"{arch}.json").write_text(json.dumps(result, indent=1))
            print(f"{arch} b{batch} summary: {json.dumps(result['batches'][str(batch)]['summary'])}", flush=True)
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
