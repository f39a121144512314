"""The Triton depthwise convolution (`trtmc.backends.depthwise_kernel`): the kernel itself against `F.conv2d`
under Triton's interpreter (a CPU runs it there), and the custom op a graph lowers its depthwise convolutions to.

Its speed against cuDNN and the taps is the GPU's to say (tools/depthwise_taps_probe.py, `triton depthwise`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
import torch

from trtmc.backends.depthwise_kernel import (
    TILE, WINDOW_MAX_KERNEL, WINDOW_TILE, compiled_for, depthwise_kernels, on_window,
)
from trtmc.backends.inductor_lowerings import (
    DEPTHWISE_KERNEL_AT_BUILD, KERNEL, LOWERINGS, PLAIN, Lowering, compile_cuda, lowering_candidates,
)
from trtmc.backends.torch_lowering import GraphModule, buffer_name, to_fx
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision

# (kernel, stride (h, w), padding (top, left, bottom, right), dilation (h, w), channels, bias): whole channel tiles
# (64, 96 channels) and partial ones (40, 17, 8), TF "SAME" padding at stride 2, dilation, a width no tile divides,
# rows and columns told apart (padding, stride and dilation each differing between them), and kernels wider than
# 7x7. Stride 1 without dilation runs on the window kernel up to 9x9 (its maps of 13 x 11 end inside a program's 4 x
# 4, and the 5x5 and last 3x3 cases pad each side differently and fill part of a channel tile); the rest, an 11x11
# kernel at stride 1 among them, on the flat kernel.
CASES = [
    (3, (1, 1), (1, 1, 1, 1), (1, 1), 64, True),
    (5, (2, 2), (1, 1, 2, 2), (1, 1), 40, True),
    (7, (1, 1), (3, 3, 3, 3), (1, 1), 96, False),
    (3, (1, 1), (2, 2, 2, 2), (2, 2), 17, True),
    (3, (2, 2), (0, 0, 1, 1), (1, 1), 8, False),
    (3, (1, 2), (0, 2, 2, 0), (2, 1), 24, True),
    (9, (1, 1), (4, 4, 4, 4), (1, 1), 24, True),
    (11, (2, 1), (5, 3, 5, 7), (1, 1), 8, False),
    (5, (1, 1), (1, 2, 3, 2), (1, 1), 40, True),
    (3, (1, 1), (0, 1, 2, 1), (1, 1), 17, False),
    (11, (1, 1), (5, 5, 5, 5), (1, 1), 8, True),
]

_INTERPRETED = textwrap.dedent("""
    import json, sys
    import torch
    import torch.nn.functional as F
    from trtmc.backends.depthwise_kernel import depthwise_conv2d_triton

    errors = []
    for kernel, stride, (top, left, bottom, right), dilation, channels, bias in json.loads(sys.argv[1]):
        gen = torch.Generator().manual_seed(kernel * channels)
        x = torch.randn(2, channels, 13, 11, generator=gen)
        w = torch.randn(channels, 1, kernel, kernel, generator=gen)
        b = torch.randn(channels, generator=gen) if bias else None
        expected = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride, 0, dilation, channels)
        row = {}
        for dtype in (torch.float32, torch.float16):
            out = depthwise_conv2d_triton(x.to(dtype), w.to(dtype), None if b is None else b.to(dtype),
                                          stride, [top, left], dilation, list(expected.shape[2:]))
            assert out.is_contiguous(memory_format=torch.channels_last) and out.dtype is dtype
            exact = F.conv2d(F.pad(x.to(dtype).float(), (left, right, top, bottom)), w.to(dtype).float(),
                             None if b is None else b.to(dtype).float(), stride, 0, dilation, channels)
            row[str(dtype)] = float((out.float() - exact).abs().max() / exact.abs().max())
        errors.append(row)
    print(json.dumps(errors))
""")


def test_the_triton_kernel_computes_the_depthwise_convolution_under_the_interpreter():
    # fp32: the same sums in another order; fp16: float32 sums of the half values, rounded once (2^-11).
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED, json.dumps(CASES)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.splitlines()[-1])
    assert len(errors) == len(CASES)
    for case, row in zip(CASES, errors):
        assert row["torch.float32"] < 1e-6 and row["torch.float16"] < 2.0**-11, (case, row)


def test_the_built_kernel_loops_over_its_rows_at_every_size_so_its_compile_does_not_grow_with_the_taps():
    # Unrolled, a 9x9 kernel's compile took 60 s on a 2-core CPU and mixnet_s's build spent 116-148 s on them (run
    # 21); a loop over the rows holds one row's loads: kw pixel strips and kw weight vectors, plus the bias.
    for kernel in (3, 7, 9):
        looped = compiled_for(90, kernel).asm["ttir"]
        assert "scf.for" in looped and looped.count("tt.load") == 2 * kernel + 1, kernel
    unrolled = compiled_for(90, 3, replace(TILE, unroll_rows=True)).asm["ttir"]
    assert "scf.for" not in unrolled and unrolled.count("tt.load") == 2 * 9 + 1


def test_stride_one_convolutions_without_dilation_up_to_9x9_run_on_the_window_kernel():
    assert on_window([3, 3], [1, 1], [1, 1]) and on_window([WINDOW_MAX_KERNEL] * 2, [1, 1], [1, 1])
    assert not on_window([3, 3], [2, 2], [1, 1]) and not on_window([3, 3], [1, 2], [1, 1])
    assert not on_window([3, 3], [1, 1], [2, 2]) and not on_window([11, 11], [1, 1], [1, 1])
    on = [case for case in CASES if on_window([case[0]] * 2, case[1], case[3])]
    assert len(on) == 5 and 9 in {case[0] for case in on}  # the interpreter's cases


def test_a_window_of_more_pixels_than_the_kernel_keeps_accumulators_for_is_refused():
    with pytest.raises(ValueError, match="1 to 32 of them"):
        replace(WINDOW_TILE, rows=8, columns=8)


def test_the_window_kernel_loads_each_input_pixel_once_for_all_the_output_pixels_it_feeds():
    # Every loop unrolled: (rows + kh - 1) * (columns + kw - 1) pixels, each tap once and the bias, where the flat
    # kernel loads a pixel strip for every output pixel and tap.
    t = WINDOW_TILE
    for kernel in (3, 5):
        ttir = compiled_for(90, kernel, t).asm["ttir"]
        pixels = (t.rows + kernel - 1) * (t.columns + kernel - 1)
        assert "scf.for" not in ttir and ttir.count("tt.load") == pixels + kernel * kernel + 1, kernel
        assert pixels < t.rows * t.columns * kernel * kernel


def _depthwise_graph(case, precision: str = "fp32"):
    kernel, stride, padding, dilation, channels, bias = case
    rng = np.random.default_rng(kernel + channels)
    g = GraphBuilder()
    x = g.input("pixels", (1, channels, 13, 11))
    y = g.conv2d(x, "blocks.0.conv_dw", rng.standard_normal((channels, 1, kernel, kernel)),
                 rng.standard_normal(channels) if bias else None, stride=stride, padding=padding, dilation=dilation,
                 groups=channels)
    g.output(g.conv2d(y, "blocks.0.conv_pw", rng.standard_normal((4, channels, 1, 1))))
    return assign_precision(g.finish(), PrecisionPolicy(precision))


@pytest.mark.parametrize("case", CASES)
def test_a_graph_lowered_to_the_depthwise_op_computes_what_the_graph_does(case):
    graph = _depthwise_graph(case)
    kernels = depthwise_kernels(graph)
    assert set(kernels) == {"blocks.0.conv_dw"}  # the 1x1 convolution is not depthwise
    pixels = torch.from_numpy(np.random.default_rng(1).standard_normal((2, case[4], 13, 11)).astype(np.float32))
    with torch.no_grad():
        assert torch.allclose(GraphModule(graph, fusions=kernels)(pixels), GraphModule(graph)(pixels), rtol=1e-5, atol=1e-5)


def test_the_window_kernels_weights_are_laid_out_tap_by_tap_in_float32_and_the_module_computes_the_same():
    # A 7x7 convolution at stride 1 (the window kernel's) beside a strided 5x5 one and an 11x11 one at stride 1 (the
    # flat kernel's, left as built).
    for case, tap_by_tap in ((CASES[2], True), (CASES[1], False), (CASES[10], False)):
        half = Lowering(frozenset(), frozenset(), depthwise_kernel=True).module(
            _depthwise_graph(case, "fp16"), torch.device("cpu"))
        key = _depthwise_graph(case).node("blocks.0.conv_dw").attrs.weight
        weight = half.get_buffer(buffer_name(key))
        channels, _, kh, kw = weight.shape
        assert (weight.stride(0), weight.stride(2), weight.stride(3)) == (
            (1, kw * channels, channels) if tap_by_tap else (kh * kw, kw, 1))
        assert weight.dtype == (torch.float32 if tap_by_tap else torch.float16)  # the half values, held exactly
        assert torch.equal(weight.half().float(), weight.float())
        graph = _depthwise_graph(case)
        module = Lowering(frozenset(), frozenset(), depthwise_kernel=True).module(graph, torch.device("cpu"))
        pixels = torch.from_numpy(np.random.default_rng(2).standard_normal((2, channels, 13, 11)).astype(np.float32))
        with torch.no_grad():
            assert torch.allclose(module(pixels), GraphModule(graph)(pixels), rtol=1e-5, atol=1e-5)


def test_the_traced_module_calls_the_op_once_per_depthwise_convolution_and_taps_keep_theirs():
    graph = _depthwise_graph(CASES[0])
    calls = [n.target for n in to_fx(graph, fusions=depthwise_kernels(graph)).graph.nodes if n.op == "call_function"]
    assert calls.count(torch.ops.trtmc.depthwise_conv2d) == 1 and calls.count(torch.conv2d) == 1  # the 1x1 one
    assert depthwise_kernels(graph, exclude=frozenset({"blocks.0.conv_dw"})) == {}


def _depthwise_stack(blocks: int, kernel: int, precision: str = "fp32"):
    """`blocks` depthwise convolutions of one kernel size, each followed by a 1x1 one, as in a ConvNeXt stage."""
    rng = np.random.default_rng(blocks * kernel)
    g = GraphBuilder()
    y = g.input("pixels", (1, 16, 12, 12))
    for i in range(blocks):
        y = g.conv2d(y, f"blocks.{i}.conv_dw", rng.standard_normal((16, 1, kernel, kernel)) / kernel,
                     rng.standard_normal(16), padding=kernel // 2, groups=16)
        y = g.conv2d(y, f"blocks.{i}.conv_pw", rng.standard_normal((16, 16, 1, 1)) / 4)
    g.output(y)
    return assign_precision(g.finish(), PrecisionPolicy(precision))


def test_the_depthwise_kernel_lowering_is_offered_at_batch_1_where_cudnn_would_run_four_depthwise_convolutions():
    # 7x7 kernels are wider than the taps take (TAPS_MAX_KERNEL), so cuDNN would run all four at batch 1.
    graph = _depthwise_stack(4, 7)
    offered = lowering_candidates(graph, 1, depthwise_kernel=True)
    assert list(offered) == [PLAIN, KERNEL] and offered[KERNEL].depthwise_kernel
    assert offered[KERNEL].taps == offered[PLAIN].taps == frozenset()
    assert list(lowering_candidates(_depthwise_stack(3, 7), 1, depthwise_kernel=True)) == [PLAIN]  # too few to pay
    assert list(lowering_candidates(_depthwise_stack(4, 3), 1, depthwise_kernel=True)) == [PLAIN]  # all taps there


def test_above_batch_1_the_depthwise_kernel_lowering_is_offered_only_where_the_window_kernel_runs_four():
    # At 16 channels no depthwise convolution is taps above batch 1 (TAPS_BELOW_CHANNELS), so cuDNN would run all
    # of them; run 31 measured the window kernel quicker than cuDNN at batch 128 on 3x3 to 9x9 ones of stride 1.
    assert list(lowering_candidates(_depthwise_stack(4, 7), 128, depthwise_kernel=True)) == [PLAIN, KERNEL]
    assert list(lowering_candidates(_depthwise_stack(4, 9), 8, depthwise_kernel=True)) == [PLAIN, KERNEL]
    assert list(lowering_candidates(_depthwise_stack(4, 3), 128, depthwise_kernel=True)) == [PLAIN, KERNEL]
    assert list(lowering_candidates(_depthwise_stack(4, 11), 128, depthwise_kernel=True)) == [PLAIN]  # flat kernel
    assert list(lowering_candidates(_depthwise_stack(3, 3), 128, depthwise_kernel=True)) == [PLAIN]  # too few


def test_a_build_times_the_depthwise_kernel_once_the_gpu_has_measured_it():
    assert DEPTHWISE_KERNEL_AT_BUILD
    assert list(lowering_candidates(_depthwise_stack(4, 7), 1)) == [PLAIN, KERNEL]
    assert list(lowering_candidates(_depthwise_stack(4, 7), 128)) == [PLAIN, KERNEL]


def test_the_depthwise_kernel_lowering_computes_what_the_plain_one_does():
    graph = _depthwise_stack(4, 7)
    lowerings = lowering_candidates(graph, 1, depthwise_kernel=True)
    pixels = torch.rand((1, 16, 12, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        kernel = lowerings[KERNEL].module(graph, torch.device("cpu"))
        calls = [n.target for n in kernel.graph.nodes if n.op == "call_function"]
        assert calls.count(torch.ops.trtmc.depthwise_conv2d) == 4
        assert torch.allclose(kernel(pixels), lowerings[PLAIN].module(graph, torch.device("cpu"))(pixels),
                              rtol=1e-5, atol=1e-5)


def test_a_lowering_is_never_both_cudnn_fused_and_on_the_depthwise_kernel():
    with pytest.raises(ValueError, match="not both"):
        Lowering(frozenset(), frozenset(), fused=True, depthwise_kernel=True)


@pytest.mark.slow
def test_an_engine_whose_build_chose_the_depthwise_kernel_runs_it_whatever_the_build_default():
    # torch.compile runs on the CPU too (the custom op an extern call, its CPU path F.conv2d): the record's choice is
    # honoured at load whether or not builds offer the candidate (`DEPTHWISE_KERNEL_AT_BUILD`).
    graph = _depthwise_stack(4, 7, "fp16")
    compiled = compile_cuda(graph, {LOWERINGS: {"1": {"chosen": KERNEL}}})
    pixels = torch.rand((1, 16, 12, 12), generator=torch.Generator().manual_seed(3)).half()
    with torch.no_grad():
        out = compiled(pixels.contiguous(memory_format=torch.channels_last))
        expected = GraphModule(graph, fusions=depthwise_kernels(graph))(pixels)
    assert torch.allclose(out.float(), expected.float(), rtol=2e-3, atol=2e-3)
    assert [lowering.depthwise_kernel for lowering in compiled._by_lowering] == [True]


def test_only_an_engine_whose_chosen_lowering_runs_the_depthwise_kernel_carries_its_compiled_kernels():
    # A build archives trtmc's Triton kernels into the bundle where `launches_own_kernels` (`triton_cache`).
    graph = _depthwise_stack(4, 7, "fp16")
    assert compile_cuda(graph, {LOWERINGS: {"1": {"chosen": KERNEL}, "128": {"chosen": PLAIN}}}).launches_own_kernels
    assert not compile_cuda(graph, {LOWERINGS: {"1": {"chosen": PLAIN}, "128": {"chosen": PLAIN}}}).launches_own_kernels
    assert not compile_cuda(graph).launches_own_kernels  # nothing chosen yet: every batch runs the plain lowering
    compiled = compile_cuda(graph, {LOWERINGS: {"1": {"chosen": KERNEL}}})
    assert compiled.chosen_lowering(1).depthwise_kernel and not compiled.chosen_lowering(1, PLAIN).depthwise_kernel
