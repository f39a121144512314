"""The Triton depthwise kernel on the real shapes of networks, under Triton's interpreter (a CPU runs it there).

    TRITON_INTERPRET=1 PYTHONPATH=src python tools/depthwise_kernel_shapes_check.py ARCH... [--batch N]
    PYTHONPATH=src python tools/depthwise_kernel_shapes_check.py ARCH... [--batch N] --device cuda

With `--device cuda` (a GPU machine) each convolution is `trtmc::depthwise_conv2d` compiled by Inductor
(`torch.compile`, full graph, afresh for each shape), as a build compiles it, on the GPU's own Triton (run 33: the
first shape's compile took 52.8 s on an H100 machine, so give it minutes).

For each architecture (random weights, fp16, the graph `trtmc build` prepares), every distinct depthwise convolution
that `tools/depthwise_taps_probe.py`'s "the engine, the rest triton" variant puts on the kernel at the batch size
(those the engine does not run as taps) is computed by `depthwise_conv2d_triton` on random half-precision pixels and
the layer's own weights, and compared with the op on the CPU (`F.conv2d` in float32, rounded once): one line each,
with the largest difference relative to the output's largest value (one half-precision rounding is up to 2^-10).
Exits non-zero if any is further than that. The kernel's speed is the GPU's to say; this says that its indexing
holds on those shapes before a GPU call is spent on them.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from trtmc.backends.depthwise_kernel import depthwise_conv2d, depthwise_conv2d_triton, depthwise_kernels
from trtmc.backends.torch_lowering import depthwise_taps_nodes

from probe_common import random_fp16_graph

ONE_ROUNDING = 2.0**-10


def compiled_op(*args):
    """The op as a build's graph runs it on CUDA: compiled by Inductor (the op an extern call there), afresh."""
    torch._dynamo.reset()
    return torch.compile(lambda *a: torch.ops.trtmc.depthwise_conv2d(*a), fullgraph=True)(*args)


def check(arch: str, batch: int, device: str) -> bool:
    graph = random_fp16_graph(arch)
    seen, good = set(), True
    for name, kernel in depthwise_kernels(graph, exclude=depthwise_taps_nodes(graph, batch)).items():
        node, a = kernel.convolution, kernel.convolution.attrs
        shape = (batch, *graph.node(node.inputs[0]).type.shape[1:])
        args = (list(a.stride), list(a.padding[:2]), list(a.dilation), list(node.type.shape[2:]))
        if (shape, *map(tuple, args)) in seen:
            continue
        seen.add((shape, *map(tuple, args)))
        x = torch.randn(shape, generator=torch.Generator().manual_seed(len(seen))).half()
        weight = torch.from_numpy(graph.weights[a.weight]).half()
        bias = torch.from_numpy(graph.weights[a.bias]).half() if a.bias else None
        started = time.perf_counter()
        if device == "cuda":
            on_gpu = (x.cuda(), weight.cuda(), None if bias is None else bias.cuda())
            out = compiled_op(*on_gpu, *args).float().cpu()
        else:
            out = depthwise_conv2d_triton(x, weight, bias, *args).float()
        reference = depthwise_conv2d(x, weight, bias, *args).float()  # on a CPU: F.conv2d in float32
        error = float((out - reference).abs().max() / reference.abs().max())
        good &= error <= ONE_ROUNDING
        print(f"{arch} b{batch} {name}: in {shape}, kernel {tuple(weight.shape[2:])}, stride {a.stride}, padding "
              f"{a.padding}, dilation {a.dilation}: {error:.1e} ({time.perf_counter() - started:.1f} s)", flush=True)
    return good


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archs", nargs="+")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu: the kernel under Triton's interpreter; cuda: the op compiled by Inductor")
    args = parser.parse_args()
    results = [check(arch, args.batch, args.device) for arch in args.archs]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
