"""Where the time of an FP8 graph goes on CUDA, and which `torch._scaled_mm` options change it (issue 13).

An experiment, not product code: it compiles one model's fp16 graph and its fp8 graph (trtmc's recipe, scales
calibrated on the shipped photos) the way the CUDA inductor engine does, plus fp8 variants whose GEMM lowering
this script swaps in (`use_fast_accum`, the bias inside the GEMM), replays each in a CUDA graph at one batch
size, times them interleaved with the bench protocol and writes the kernels of one replay of each, summed by
kernel name, to OUT.json. Swapping the lowering is the experiment, so this script, unlike the other tools,
replaces a private function of trtmc (`torch_lowering._quantized_gemm`) while it traces each variant.

    PYTHONPATH=src python3 tools/fp8_probe.py vit_base_patch16_224 128 /tmp/out/fp8-probe.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from trtmc.backends import torch_lowering as lowering
from trtmc.bench import oracle
from trtmc.bench.spec import TimingProtocol
from trtmc.bench.timing import CudaEventClock, TimedCall, time_interleaved
from trtmc.build import RECIPES, prepare_graph
from trtmc.checkpoint import open_checkpoint
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.passes.quantize import quantize
from trtmc.quantization import calibrate_images
from trtmc.random_weights import save_random_checkpoint

from probe_common import engine_replay, kernels


def gemm_with(fast_accum: bool, bias_inside: bool):
    """An FP8 GEMM lowering like trtmc's `_quantized_gemm`, with `_scaled_mm`'s options set."""

    def gemm(spec, node, args, w):
        x, kernel = args
        out_c, in_c = kernel.shape[0], kernel.shape[1]
        conv = node.kind is OpKind.CONV2D
        rows = x.permute(0, 2, 3, 1).reshape(-1, in_c) if conv else x.reshape(-1, in_c)
        scale_a = w(spec.input_scale).reshape(1, 1).expand_as(rows[:, :1]).contiguous()
        scale_b = w(spec.weight_scale).reshape(1, -1).expand(1, out_c).contiguous()
        bias = w(node.attrs.bias) if node.attrs.bias else None
        y = torch._scaled_mm(rows, kernel.reshape(out_c, in_c).t(), scale_a=scale_a, scale_b=scale_b,
                             bias=bias if bias_inside else None, out_dtype=lowering.TORCH_DTYPES[node.type.dtype],
                             use_fast_accum=fast_accum)
        if bias is not None and not bias_inside:
            y = y + bias
        if conv:
            return y.reshape(-1, node.type.shape[2], node.type.shape[3], out_c).permute(0, 3, 1, 2)
        return y.reshape((-1,) + node.type.shape[1:])

    return gemm


def compiled_replay(graph, batch: int, gemm=None):
    """The graph compiled as the CUDA inductor engine compiles it (with `gemm` as its FP8 GEMM lowering),
    captured in a CUDA graph at `batch`."""
    original = lowering._quantized_gemm
    if gemm is not None:
        lowering._quantized_gemm = gemm
    try:
        module = lowering.to_fx(graph, quantized_gemms=True)
    finally:
        lowering._quantized_gemm = original
    return engine_replay(module, graph, batch)[0]


def main(arch: str, batch: int, out: Path) -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_random_checkpoint(arch, Path(tmp) / arch)
        prepared = prepare_graph(open_checkpoint(folder), "fp32")
    photos = oracle.photo_files()
    scales = calibrate_images(prepared.graph, prepared.preprocess, photos[: len(photos) // 2])
    fp16 = assign_precision(prepared.graph, PrecisionPolicy("fp16"))
    fp8 = quantize(fp16, RECIPES["fp8"], scales)
    gemms = lowering.find_quantized_gemms(fp8)
    print(f"{len(gemms)} FP8 GEMMs of {sum(n.kind in (OpKind.CONV2D, OpKind.LINEAR) for n in fp8.nodes)} ops "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    assert all(g.format is DType.F8E4M3 for g in gemms.values())
    variants = {
        "fp16": (fp16, None),
        "fp8 (trtmc)": (fp8, None),
        "fp8 fast accum": (fp8, gemm_with(True, False)),
        "fp8 fast accum, bias in GEMM": (fp8, gemm_with(True, True)),
        "fp8 bias in GEMM": (fp8, gemm_with(False, True)),
    }
    replays, errors = {}, {}
    for name, (graph, gemm) in variants.items():
        try:
            replays[name] = compiled_replay(graph, batch, gemm)
            print(f"compiled {name} ({time.perf_counter() - started:.0f} s)", flush=True)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {str(exc)[:400]}"
            print(f"{name}: {errors[name]}", flush=True)
    outcome = time_interleaved({k: TimedCall(r, CudaEventClock()) for k, r in replays.items()}, TimingProtocol())
    result = {"arch": arch, "batch": batch, "torch": torch.__version__, "gemms": len(gemms), "errors": errors,
              "variants": {}}
    for name, replay in replays.items():
        timing = outcome.timings.get(name)
        table = kernels(replay)
        result["variants"][name] = {
            "median_ms": timing.median_ms if timing else None,
            "spread": timing.spread if timing else None,
            "kernels": sum(r["count"] for r in table),
            "kernel_us": round(sum(r["us"] for r in table), 1),
            "top": table[:25],
        }
        print(f"{name}: {result['variants'][name]['median_ms']} ms, {result['variants'][name]['kernels']} kernels",
              flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
