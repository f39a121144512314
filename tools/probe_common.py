"""For GPU probes of engine variants (fp8_probe.py): a graph's FX module compiled as the CUDA
inductor engine compiles it and replayed in a CUDA graph, and the kernels of one replay."""

from __future__ import annotations

import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from trtmc.backends.inductor import feed_dtype
from trtmc.backends.torch_lowering import channels_last_weights
from trtmc.build import prepare_graph
from trtmc.checkpoint import open_checkpoint
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.random_weights import save_random_checkpoint
from trtmc.runtime import Runtime


def random_fp16_graph(arch: str):
    """timm's `arch` with random weights as `trtmc build` prepares it, in the fp16 policy's precisions."""
    with tempfile.TemporaryDirectory() as tmp:
        prepared = prepare_graph(open_checkpoint(save_random_checkpoint(arch, Path(tmp) / arch)), "fp32")
    return assign_precision(prepared.graph, PrecisionPolicy("fp16"))


def cuda_inductor_runtime(bundle: Path) -> Runtime:
    """The bundle opened here, refused unless its engine is the CUDA Inductor one (a CUDA graph per batch size)."""
    runtime = Runtime.open(bundle)
    if not hasattr(runtime.engine, "_graphs"):
        raise SystemExit(f"{bundle}: its engine here is {runtime.choice.key}, not the CUDA Inductor engine this probes")
    return runtime


def engine_replay(module: torch.nn.Module, graph, batch: int, kernels=None):
    """(replay, output, seconds to the first three calls): `module` (from `to_fx(graph, ...)`) as
    `inductor_lowerings.compile_cuda` prepares it (channels-last convolution weights, those of `kernels`' (trtmc's
    depthwise kernel) laid out for it, pixels in the graph's precision), compiled, warmed up and captured in a CUDA
    graph at `batch`."""
    module = channels_last_weights(module.eval().cuda(), graph)
    if kernels:
        from trtmc.backends.depthwise_kernel import taps_major_weights

        module = taps_major_weights(module, kernels)
    compiled = torch.compile(module, dynamic=False)
    pixels = torch.rand((batch, *graph.inputs[0].type.shape[1:]), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    x = pixels.to(feed_dtype(graph), memory_format=torch.channels_last)
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            out = compiled(x)
    torch.cuda.synchronize()
    kept = (module, compiled, x, out)  # the graph reads their memory: they live as long as the replay

    def replay(kept=kept):
        cuda_graph.replay()

    return replay, out, seconds


def kernels(replay) -> list[dict]:
    """The CUDA kernels of one replay, summed by name (90 characters of it), the longest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type.name == "CUDA":
            by_name[e.name[:90]].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    rows = [{"kernel": k, "count": len(v), "us": round(sum(v), 1)} for k, v in by_name.items()]
    return sorted(rows, key=lambda r: -r["us"])


def timed_rows(replays: dict, outputs: dict, reference) -> list[dict]:
    """A probe's replays, keyed by (variant, batch), timed interleaved with the bench's protocol: one `variant_row`
    each, in the same order, its output compared with that of the key `reference(batch)` names."""
    from trtmc.bench.spec import TimingProtocol
    from trtmc.bench.timing import CudaEventClock, TimedCall, time_interleaved

    outcome = time_interleaved({k: TimedCall(r, CudaEventClock()) for k, r in replays.items()}, TimingProtocol())
    rows = []
    for (name, batch), replay in replays.items():
        base = reference(batch)
        row = variant_row(name, batch, outcome.timings[name, batch], replay, outputs[name, batch], outputs[base])
        rows.append({**row, "reference": base[0]})
    return rows


def variant_row(name: str, batch: int, timing, replay, output: torch.Tensor, reference: torch.Tensor) -> dict:
    """One timed variant of a probe: its median and spread (`timing`, from `time_interleaved`), the kernels of one
    replay (the longest twelve kept), and its output's largest difference from `reference`'s on the same pixels,
    relative to the reference's largest value."""
    table = kernels(replay)
    reference = reference.float()
    return {
        "variant": name, "batch": batch, "median_ms": round(timing.median_ms, 4),
        "spread": round(timing.spread, 4), "stable": timing.stable,
        "kernels": sum(r["count"] for r in table), "kernel_us": round(sum(r["us"] for r in table), 1),
        "max_diff_vs_reference": float((output.float() - reference).abs().max() / reference.abs().max()),
        "top": table[:12],
    }


def write_rows(out: Path, arch: str, rows: list[dict]) -> None:
    """OUT/ARCH.json: the probe's rows, with the torch that ran them."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{arch}.json").write_text(json.dumps({"arch": arch, "torch": torch.__version__, "rows": rows}, indent=1))
