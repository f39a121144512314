"""Inductor's Triton convolution templates on a timm model (issue 12's resnet50 lever), before trtmc adopts them.

timm's ARCH (random init, fp16, channels-last) compiled two ways, each replayed in a manual CUDA graph as the
bench's `expert` baseline does: torch.compile's default mode (the expert), and max-autotune with Triton
templates for convolutions and matrix products beside cuDNN/cuBLAS (`max_autotune_conv_backends` /
`max_autotune_gemm_backends` "ATEN,TRITON"; the benchmarked choice wins, its epilogue fused). Per batch size:
the compile's seconds, all timed interleaved (tools/miss_profile.py's rounds) and the kernels of one call
by kind. A third variant, `gemm_templates`, autotunes the matrix products only (Triton GEMM templates beside
cuBLAS, the exact GELU and biases fused into the chosen template's epilogue; convolutions stay cuDNN): issue 12's
lever for vit_base_patch16_224 and convnext_tiny, where trtmc and the expert run the same kernels and each MLP's
GELU is a kernel of its own. VARIANTS (comma-separated, default all three) picks them. Writes OUT.json.

    PYTHONPATH=src [VARIANTS=expert,gemm_templates] python tools/autotune_probe.py ARCH OUT.json [BATCH ...]
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


def main() -> None:
    import timm

    from trtmc.bench.baselines import Float32Logits, ManualCudaGraph

    arch, out = sys.argv[1], Path(sys.argv[2])
    batches = [int(b) for b in sys.argv[3:]] or [1, 128]
    model = Float32Logits(timm.create_model(arch, pretrained=False).eval().cuda().half()
                          .to(memory_format=torch.channels_last)).eval()
    options = {
        "expert": None,
        "max_autotune_templates": {"max_autotune": True, "max_autotune_conv_backends": "ATEN,TRITON",
                                   "max_autotune_gemm_backends": "ATEN,TRITON"},
        "gemm_templates": {"max_autotune_gemm": True, "max_autotune_gemm_backends": "ATEN,TRITON"},
    }
    chosen = ["expert"] + [n for n in os.environ.get("VARIANTS", ",".join(options)).split(",") if n != "expert"]
    variants = {name: torch.compile(model, mode="default", dynamic=False) if options[name] is None
                else torch.compile(model, dynamic=False, options=options[name]) for name in chosen}
    result = {"arch": arch, "batches": {}}
    with torch.no_grad():
        for batch in batches:
            x = torch.rand((batch, 3, 224, 224), device="cuda").half().contiguous(memory_format=torch.channels_last)
            rows, compile_s = {}, {}
            for name, compiled in variants.items():
                started = time.perf_counter()
                graph = ManualCudaGraph(compiled)
                graph(x)
                torch.cuda.synchronize()
                compile_s[name] = round(time.perf_counter() - started, 1)
                rows[name] = lambda graph=graph: graph(x)
                print(f"{arch} b{batch} {name}: compiled and captured in {compile_s[name]} s", flush=True)
            times = timed(rows)
            result["batches"][batch] = {n: {**times[n], "compile_s": compile_s[n], **kernels(fn)} for n, fn in rows.items()}
            e = times["expert"]["median_ms"]
            print(f"{arch} b{batch}: expert {e:.3f} ms; " + ", ".join(
                f"{n} {t['median_ms']:.3f} ms ({e / t['median_ms']:.3f}x)" for n, t in times.items() if n != "expert"),
                flush=True)
            out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
