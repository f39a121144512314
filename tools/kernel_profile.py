"""Where the CUDA inductor engine's time goes: per-kernel times from the profiler, by kind.

Compiles trtmc's fp16 graph of ARCH (random weights, channels-last, as the engine does) at BATCH,
profiles 20 un-graphed calls and sums CUDA kernel time per kernel and per kind (cuDNN/cuBLAS
convolutions and matrix products, Triton kernels Inductor generated, other).

    PYTHONPATH=src python tools/kernel_profile.py ARCH BATCH OUT.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

RUNS = 20


def kind_of(name: str) -> str:
    if name.startswith("triton_"):
        return "triton (inductor)"
    lowered = name.lower()
    if any(k in lowered for k in ("conv", "cudnn", "implicit", "dgrad", "xmma", "nhwc", "nchw")):
        return "cudnn convolution"
    if any(k in lowered for k in ("gemm", "cublas", "cutlass", "sm90_", "ampere_")):
        return "cublas/cutlass matmul"
    return "other"


def kernel_launches(prof) -> list[tuple[str, float]]:
    """Every CUDA kernel launch of a finished torch.profiler run in the order it ran, with its duration (us), copies
    and fills left out: where launches of one name differ, which ones do."""
    events = [e for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset"))]
    return [(e.name, e.time_range.elapsed_us()) for e in sorted(events, key=lambda e: e.time_range.start)]


def times_by_name(launches: list[tuple[str, float]]) -> dict[str, list[float]]:
    """Each kernel's durations (us), from `kernel_launches`."""
    per_kernel: dict[str, list[float]] = defaultdict(list)
    for name, us in launches:
        per_kernel[name].append(us)
    return per_kernel


def kernel_times(prof) -> dict[str, list[float]]:
    """Each CUDA kernel's durations (us) in a finished torch.profiler run, copies and fills left out."""
    return times_by_name(kernel_launches(prof))


def main() -> None:
    arch, batch, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trtmc.backends.torch_lowering import TORCH_DTYPES, to_fx
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph
    from trtmc.passes.fold_batch_norm import fold_batch_norm
    from trtmc.passes.precision import PrecisionPolicy, assign_precision
    from trtmc.random_weights import save_random_checkpoint

    folder = save_random_checkpoint(arch, Path("/tmp/kernel_profile") / f"{arch}-{batch}")
    _, graph = build_graph(Checkpoint(folder), "fp16")
    graph = assign_precision(fold_batch_norm(graph), PrecisionPolicy("fp16"))
    # Compiled as the inductor backend's CUDA engine compiles it: the FX graph, channels-last, static shapes.
    module = to_fx(graph).eval().cuda().to(memory_format=torch.channels_last)
    compiled = torch.compile(module, dynamic=False)
    node = graph.inputs[0]
    x = torch.randn((batch,) + tuple(node.type.shape[1:]), device="cuda").to(TORCH_DTYPES[node.type.dtype])
    x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(RUNS):
                compiled(x)
            torch.cuda.synchronize()
    per_kernel = kernel_times(prof)
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: {"kernels_per_call": 0, "us_per_call": 0.0})
    for name, times in per_kernel.items():
        k = kinds[kind_of(name)]
        k["kernels_per_call"] += len(times) / RUNS
        k["us_per_call"] += sum(times) / RUNS
    top = sorted(per_kernel.items(), key=lambda kv: -sum(kv[1]))[:12]
    result = {
        "arch": arch,
        "batch": batch,
        "kernels_per_call": sum(len(t) for t in per_kernel.values()) / RUNS,
        "kernel_us_per_call": sum(sum(t) for t in per_kernel.values()) / RUNS,
        "by_kind": {k: {"kernels_per_call": round(v["kernels_per_call"], 1), "us_per_call": round(v["us_per_call"], 1)}
                    for k, v in kinds.items()},
        "top_kernels": [{"name": n[:90], "calls_per_run": len(t) / RUNS, "us_per_run": round(sum(t) / RUNS, 1)} for n, t in top],
    }
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("arch", "batch", "kernels_per_call", "kernel_us_per_call", "by_kind")}))


if __name__ == "__main__":
    main()
