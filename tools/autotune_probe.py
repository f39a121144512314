"""Inductor's Triton convolution templates on a timm model (issue 12's resnet50 lever), before trtmc adopts them.

timm's ARCH (random init, fp16, channels-last) compiled two ways, each replayed in a manual CUDA graph as the
bench's `expert` baseline does: torch.compile's default mode (the expert), and max-autotune with Triton
templates for convolutions and matrix products beside cuDNN/cuBLAS (`max_autotune_conv_backends` /
`max_autotune_gemm_backends` "ATEN,TRITON"; the benchmarked choice wins, its epilogue fused). Per batch size:
the compile's seconds, both timed interleaved (tools/miss_profile.py's rounds) and the kernels of one call
by kind. Writes OUT.json.

    PYTHONPATH=src python tools/autotune_probe.py ARCH OUT.json [BATCH ...]
"""

from __future__ import annotations

import json
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
    variants = {
        "expert": torch.compile(model, mode="default", dynamic=False),
        "max_autotune_templates": torch.compile(model, dynamic=False, options={
            "max_autotune": True, "max_autotune_conv_backends": "ATEN,TRITON",
            "max_autotune_gemm_backends": "ATEN,TRITON"}),
    }
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
            e, m = times["expert"]["median_ms"], times["max_autotune_templates"]["median_ms"]
            print(f"{arch} b{batch}: expert {e:.3f} ms, templates {m:.3f} ms, ratio {e / m:.3f}", flush=True)
            out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
