"""The fused depthwise Triton kernel (`trtmc.backends.depthwise`), run on the CPU by Triton's interpreter.

Triton reads TRITON_INTERPRET when a kernel is defined, so every check runs in a process of its own that
sets it first; the process prints what it measured as JSON and the tests judge it here. The reference
is torch's convolution, then the activation, in float64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import REPO

CASES = [
    # channels, height, width, kernel, stride, (top, left, bottom, right) padding, activation
    (8, 9, 7, 3, 1, (1, 1, 1, 1), "RELU"),
    (24, 10, 10, 5, 2, (2, 2, 2, 2), "SILU"),
    (70, 8, 8, 3, 2, (0, 0, 1, 1), "RELU6"),  # TF "SAME" at stride 2: the pad falls bottom and right
    (96, 7, 7, 7, 1, (3, 3, 3, 3), "HARD_SWISH"),
    (16, 6, 5, 3, 1, (1, 1, 1, 1), None),
]

KERNEL_CHECK = """
import json, sys, torch, torch.nn.functional as F
from trtmc.backends.depthwise import ACTIVATION_CODES, depthwise_conv2d
from trtmc.graph import Activation
acts = {None: lambda t: t, "RELU": F.relu, "RELU6": F.relu6, "SILU": F.silu, "HARD_SWISH": F.hardswish}
out = []
for channels, height, width, k, stride, (top, left, bottom, right), act in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(channels)
    x = torch.randn(2, channels, height, width, generator=gen)
    weight, bias = torch.randn(channels, 1, k, k, generator=gen), torch.randn(channels, generator=gen)
    expected = acts[act](F.conv2d(F.pad(x.double(), (left, right, top, bottom)), weight.double(), bias.double(), stride, 0, 1, channels))
    taps = weight.reshape(channels, k * k).t().reshape(k, k, channels).contiguous()
    code = ACTIVATION_CODES[Activation[act]] if act else 0
    row = {"shape_ok": True}
    for dtype in ("float32", "float16"):
        d = getattr(torch, dtype)
        y = depthwise_conv2d(x.to(d).contiguous(memory_format=torch.channels_last), taps.to(d), bias.to(d),
                             [stride, stride], [top, left], list(expected.shape[2:]), code)
        row["shape_ok"] &= y.shape == expected.shape and y.dtype == d and y.is_contiguous(memory_format=torch.channels_last)
        # against the reference on the same (rounded) operands: what the kernel itself adds
        exact = acts[act](F.conv2d(F.pad(x.to(d).double(), (left, right, top, bottom)), weight.to(d).double(),
                                   bias.to(d).double(), stride, 0, 1, channels))
        row[dtype] = float((y.double() - exact).abs().max() / exact.abs().max())
    out.append(row)
print(json.dumps(out))
"""

LOWERING_CHECK = """
import json, sys
import numpy as np, torch
from trtmc.backends.torch_lowering import GraphModule, to_fx
from trtmc.build import prepare_graph
from trtmc.checkpoint import Checkpoint
from trtmc.graph import Activation, OpKind
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision

def kernel_calls(module):
    return [n for n in module.graph.nodes if "depthwise_conv2d" in str(n.target)]

# lite0, traced only (the interpreter would take minutes over 224 px): which ops the kernel takes.
lite0 = assign_precision(prepare_graph(Checkpoint(sys.argv[1]), "fp32").graph, PrecisionPolicy("fp32"))
fused = to_fx(lite0, fused_depthwise=True)
calls = kernel_calls(fused)
counts = {
    "depthwise": sum(1 for n in lite0.nodes if n.kind is OpKind.CONV2D and n.attrs.groups > 1),
    "kernel_calls": len(calls),
    "convolutions_left": sum(1 for n in fused.graph.nodes if "conv2d" in str(n.target) and n not in calls),
    "convolutions": sum(1 for n in lite0.nodes if n.kind is OpKind.CONV2D),
    "activations": sum(1 for n in lite0.nodes if n.kind is OpKind.ACTIVATION),
    "activations_left": sum(1 for n in fused.graph.nodes if getattr(n.target, "__name__", "") in ("relu", "relu6", "silu", "hardswish", "hardtanh")),
}

# A small network run both ways: a depthwise layer with each kind of epilogue.
r = np.random.default_rng(0)
g = GraphBuilder()
x = g.input("x", (1, 3, 16, 16))
y = g.conv2d(x, "stem", r.standard_normal((16, 3, 3, 3)), r.standard_normal(16), stride=2, padding=1)
y = g.activation(g.conv2d(y, "dw1", r.standard_normal((16, 1, 3, 3)), r.standard_normal(16), padding=1, groups=16), Activation.RELU6, "dw1.act")
y = g.conv2d(y, "dw2", r.standard_normal((16, 1, 5, 5)), r.standard_normal(16), stride=2, padding=(1, 1, 2, 2), groups=16)
z = g.conv2d(y, "dw3", r.standard_normal((16, 1, 3, 3)), padding=1, groups=16)
y = g.add(g.activation(z, Activation.SILU, "dw3.act"), z, "two_readers")  # dw3 read twice: its SiLU stays apart
g.output(g.linear(g.flatten(g.global_avg_pool(y, "pool"), "flat"), "fc", r.standard_normal((10, 16)), r.standard_normal(10)))
small = assign_precision(g.finish(), PrecisionPolicy("fp32"))
module = to_fx(small, fused_depthwise=True)
pixels = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    plain, ours = GraphModule(small)(pixels), module(pixels)
counts["small_kernel_calls"] = len(kernel_calls(module))
counts["small_kernel_activations"] = sorted(n.args[-1] for n in kernel_calls(module))
counts["relative"] = float((ours - plain).abs().max() / plain.abs().max())
print(json.dumps(counts))
"""


def interpreted(code: str, *args: str) -> object:
    pytest.importorskip("triton")  # torch's CUDA wheels bring it; the kernel needs it
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_depthwise_kernel_matches_torchs_convolution_and_activation_for_every_padding_and_activation():
    rows = interpreted(KERNEL_CHECK, json.dumps(CASES))
    assert len(rows) == len(CASES)
    for case, row in zip(CASES, rows):
        assert row["shape_ok"], case
        assert row["float32"] < 1e-6, (case, row)
        # fp16: fp32 sums of the same products, one rounding of the output (2^-11 relative)
        assert row["float16"] <= 2.0**-11, (case, row)


def test_the_fused_lowering_runs_every_depthwise_layer_in_the_kernel_with_the_activation_it_alone_reads():
    checked = interpreted(LOWERING_CHECK, str(REPO / "examples" / "checkpoints" / "tf_efficientnet_lite0.in1k"))
    assert checked["depthwise"] == checked["kernel_calls"] > 0
    assert checked["convolutions_left"] == checked["convolutions"] - checked["depthwise"]
    # lite0 follows each depthwise convolution with its ReLU6: the kernel applies them.
    assert checked["activations_left"] == checked["activations"] - checked["depthwise"]
    # dw1 takes its ReLU6 (code 2); dw2 has no activation; dw3 has a reader besides its SiLU, which stays apart.
    assert checked["small_kernel_calls"] == 3 and checked["small_kernel_activations"] == [0, 0, 2]
    assert checked["relative"] < 1e-5
