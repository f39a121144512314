"""Does the fused depthwise Triton kernel make the CUDA engine faster (issue 12)? One measurement, on the GPU.

An experiment, not product code. For each model (timm random weights, fp16) it compiles the graph the way the
CUDA inductor engine does (`inductor._compile_cuda`: channels-last convolution weights, pixels fed in the
graph's precision), once as the engine runs it and once with `to_fx(..., fused_depthwise=True)`; captures each
in a CUDA graph at every batch size asked for; times all of them interleaved with the bench protocol; counts
the kernels of one replay (torch.profiler); and compares the two outputs. Writes OUT.json.

    PYTHONPATH=src python3 tools/depthwise_probe.py OUT.json ghostnet_100 tf_efficientnet_lite0 --batch 1 --batch 128

Prediction (NOTES, run 3): ghostnet_100 at batch 1 drops from ~192 kernels by about one per depthwise layer
(39) and its time by their launches, toward the 0.30 ms target; at batch 128 the two depthwise layers that
cuDNN ran on its slow direct path lose most of their 561 us. Kept as the engine's default only if both hold.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from trtmc.backends.torch_lowering import to_fx
from trtmc.bench.spec import TimingProtocol
from trtmc.bench.timing import CudaEventClock, TimedCall, time_interleaved
from trtmc.build import prepare_graph
from trtmc.checkpoint import open_checkpoint
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.random_weights import save_random_checkpoint

from probe_common import engine_replay, kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 1 and 128)")
    args = parser.parse_args()
    batches = args.batch or [1, 128]
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "models": {}}
    for arch in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            folder = save_random_checkpoint(arch, Path(tmp) / arch)
            graph = assign_precision(prepare_graph(open_checkpoint(folder), "fp16").graph, PrecisionPolicy("fp16"))
        rows, outs, compiles, model = {}, {}, {}, {}
        for batch in batches:
            for fused in (False, True):
                key = f"b{batch} {'fused' if fused else 'engine'}"
                try:
                    module = to_fx(graph, quantized_gemms=True, fused_depthwise=fused)
                    rows[key], outs[key], compiles[key] = engine_replay(module, graph, batch)
                    print(f"{arch} {key}: compiled in {compiles[key]:.1f} s", flush=True)
                except Exception as exc:  # a variant that does not compile is a result too
                    model[key] = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
                    print(f"{arch} {key}: {model[key]['error']}", flush=True)
        outcome = time_interleaved({k: TimedCall(r, CudaEventClock()) for k, r in rows.items()}, TimingProtocol())
        for key, replay in rows.items():
            timing = outcome.timings.get(key)
            table = kernels(replay)
            model[key] = {"median_ms": timing.median_ms if timing else None, "spread": timing.spread if timing else None,
                          "kernels": sum(r["count"] for r in table), "kernel_us": round(sum(r["us"] for r in table), 1),
                          "compile_s": round(compiles[key], 1), "top_kernels": table[:12], "error": outcome.errors.get(key)}
        for batch in [b for b in batches if f"b{b} engine" in outs and f"b{b} fused" in outs]:
            engine, fused = outs[f"b{batch} engine"].float(), outs[f"b{batch} fused"].float()
            model[f"b{batch} fused vs engine"] = {
                "relative_difference": float((fused - engine).abs().max() / engine.abs().max()),
                "top1_equal": float((fused.argmax(-1) == engine.argmax(-1)).float().mean()),
                "speedup": (model[f"b{batch} engine"]["median_ms"] or 0) / (model[f"b{batch} fused"]["median_ms"] or 1),
            }
            print(arch, batch, model[f"b{batch} engine"]["median_ms"], model[f"b{batch} fused"]["median_ms"],
                  model[f"b{batch} fused vs engine"], flush=True)
        result["models"][arch] = model
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))  # after every model: a timeout keeps what ran


if __name__ == "__main__":
    main()
