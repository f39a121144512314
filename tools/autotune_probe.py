"""Inductor options on a timm model against the expert (issue 12's template and launch levers), before trtmc adopts one.

timm's ARCH (random init, fp16, channels-last) compiled several ways, each replayed in a manual CUDA graph as the
bench's `expert` baseline does: torch.compile's default mode (the expert), and one variant per option set:
- `max_autotune_templates`: max-autotune with Triton templates for convolutions and matrix products beside
  cuDNN/cuBLAS (`max_autotune_conv_backends` / `max_autotune_gemm_backends` "ATEN,TRITON"; the benchmarked choice
  wins, its epilogue fused): issue 12's resnet50 lever;
- `gemm_templates`: the matrix products only (Triton GEMM templates beside cuBLAS, the exact GELU and biases fused
  into the chosen template's epilogue; convolutions stay cuDNN): the lever for vit_base_patch16_224 and
  convnext_tiny, where trtmc and the expert run the same kernels and each MLP's GELU is a kernel of its own;
- `gemm_templates_tma`: the same with Inductor's persistent TMA matmul templates among the choices (Hopper's bulk
  copies and warp-group MMAs: templates nearer cuBLAS's speed on large products, where run 26's batch-128 autotuning
  of vit_base's products picked cuBLAS for every one, and the GELU stayed a kernel of its own);
- `pdl`: Inductor's programmatic dependent launch on Hopper (`triton.enable_pdl`: each Triton kernel is launched
  before the one it follows has finished and waits in-kernel for its inputs), for the launch-bound batch 1 of
  ghostnet_100, efficientnet_b0 and resnet50 (~60-150 kernels of 2-5 us each).
VARIANTS (comma-separated, default all) picks them. Per batch size: each variant's compile seconds, all timed
interleaved (tools/miss_profile.py's rounds), the kernels of one call by kind, each variant's largest difference
from the expert's logits on the same input (a variant that rounds differently shows there), and its largest
difference between 20 replays and its first (deterministic kernels give the same bits every time: a race shows).
A variant that fails to compile is recorded with its error. Writes OUT.json after every batch size.

    PYTHONPATH=src [VARIANTS=expert,pdl] python tools/autotune_probe.py ARCH OUT.json [BATCH ...]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from miss_profile import kernels, timed  # noqa: E402

OPTIONS = {
    "expert": None,
    "max_autotune_templates": {"max_autotune": True, "max_autotune_conv_backends": "ATEN,TRITON",
                               "max_autotune_gemm_backends": "ATEN,TRITON"},
    "gemm_templates": {"max_autotune_gemm": True, "max_autotune_gemm_backends": "ATEN,TRITON"},
    "gemm_templates_tma": {"max_autotune_gemm": True, "max_autotune_gemm_backends": "ATEN,TRITON",
                           "triton.enable_persistent_tma_matmul": True},
    "pdl": {"triton.enable_pdl": True},
}


def main() -> None:
    import timm

    from trtmc.bench.baselines import Float32Logits, ManualCudaGraph

    arch, out = sys.argv[1], Path(sys.argv[2])
    batches = [int(b) for b in sys.argv[3:]] or [1, 128]
    model = Float32Logits(timm.create_model(arch, pretrained=False).eval().cuda().half()
                          .to(memory_format=torch.channels_last)).eval()
    size = tuple(timm.data.resolve_data_config({}, model=model.model)["input_size"])
    chosen = ["expert"] + [n for n in os.environ.get("VARIANTS", ",".join(OPTIONS)).split(",") if n != "expert"]
    unknown = [n for n in chosen if n not in OPTIONS]
    if unknown:
        raise SystemExit(f"unknown VARIANTS {unknown}; choose from {', '.join(OPTIONS)}")
    variants, compile_errors = {}, {}
    for name in chosen:  # torch.compile checks its options here: one this torch lacks fails its variant only
        try:
            variants[name] = torch.compile(model, dynamic=False, **(
                {"mode": "default"} if OPTIONS[name] is None else {"options": OPTIONS[name]}))
        except Exception as exc:
            compile_errors[name] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"{arch} {name}: cannot compile: {compile_errors[name]}", flush=True)
    result: dict = {"arch": arch, "torch": torch.__version__, "batches": {}}
    with torch.no_grad():
        for batch in batches:
            x = torch.rand((batch, *size), device="cuda").half().contiguous(memory_format=torch.channels_last)
            rows, compile_s, errors, logits = {}, {}, dict(compile_errors), {}
            for name, compiled in variants.items():
                started = time.perf_counter()
                try:
                    graph = ManualCudaGraph(compiled)
                    logits[name] = graph(x)
                    torch.cuda.synchronize()
                except Exception as exc:  # a variant this torch cannot compile is a result, not the end
                    if name == "expert":
                        raise
                    errors[name] = f"{type(exc).__name__}: {exc}"[:500]
                    print(f"{arch} b{batch} {name}: failed: {errors[name]}", flush=True)
                    continue
                compile_s[name] = round(time.perf_counter() - started, 1)
                rows[name] = lambda graph=graph: graph(x)
                print(f"{arch} b{batch} {name}: compiled and captured in {compile_s[name]} s", flush=True)
            times = timed(rows)
            scale = logits["expert"].abs().max().item()

            def replay_drift(fn, first) -> float:
                return max((fn() - first).abs().max().item() for _ in range(20)) / scale

            result["batches"][batch] = {
                **{n: {**times[n], "compile_s": compile_s[n], **kernels(fn),
                       "max_diff_vs_expert": round((logits[n] - logits["expert"]).abs().max().item() / scale, 6),
                       "replay_drift": round(replay_drift(fn, logits[n]), 6)}
                   for n, fn in rows.items()},
                **{n: {"error": e} for n, e in errors.items()},
            }
            e = times["expert"]["median_ms"]
            print(f"{arch} b{batch}: expert {e:.3f} ms; " + ", ".join(
                f"{n} {t['median_ms']:.3f} ms ({e / t['median_ms']:.3f}x)" for n, t in times.items() if n != "expert"),
                flush=True)
            out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
