"""Speed experiments for the CUDA inductor engine: one lever at a time, against torch.compile.

Each variant compiles trtmc's FX graph (or timm's model, for the baselines) and times it at a batch
size with CUDA events over CUDA-graph replays; the kernel count comes from the profiler on one
un-graphed call. Phase 1 compiles every (variant, batch) in parallel subprocesses to fill Inductor's
on-disk caches; phase 2 times them one at a time, each in a fresh process.

    PYTHONPATH=src python tools/speed_lab.py --out DIR --arch ghostnet_100 --batch 1 --batch 128
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = {
    # name: (channels_last, fp16 input, inductor freezing, coordinate-descent tuning)
    "trtmc_nchw": (False, False, False, False),
    "trtmc_cl": (True, False, False, False),
    "trtmc_cl_io16": (True, True, False, False),
    "trtmc_cl_io16_freeze": (True, True, True, False),
    "trtmc_cl_io16_freeze_cd": (True, True, True, True),
    "timm_reduce_overhead": None,
    "timm_default_manual_graph": None,
}


def _checkpoint(arch: str) -> Path:
    from trtmc.random_weights import save_random_checkpoint

    folder = Path("/tmp/speed_lab") / arch
    if not (folder / "model.safetensors").exists():
        save_random_checkpoint(arch, folder)
    return folder


def _trtmc_module(folder: Path, precision: str, io16: bool):
    import torch

    from trtmc.backends.torch_lowering import to_fx
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph
    from trtmc.graph import DType
    from trtmc.passes.fold_batch_norm import fold_batch_norm
    from trtmc.passes.precision import PrecisionPolicy, assign_precision

    _, graph = build_graph(Checkpoint(folder), precision)
    policy = PrecisionPolicy(precision, io_dtype=DType.F16 if io16 else DType.F32)
    graph = assign_precision(fold_batch_norm(graph), policy)
    return to_fx(graph).eval().cuda(), (torch.float16 if io16 else torch.float32)


def child(arch: str, variant: str, batch: int, compile_only: bool) -> dict:
    import torch
    import torch._inductor.config as inductor_config

    folder = _checkpoint(arch)
    shape = (batch, 3, 224, 224)
    cfg = VARIANTS[variant]
    if cfg is None:
        from trtmc.random_weights import load_timm_model

        model = load_timm_model(folder).cuda().half().to(memory_format=torch.channels_last)
        x = torch.randn(shape, device="cuda").half().to(memory_format=torch.channels_last)
        mode = "reduce-overhead" if variant == "timm_reduce_overhead" else None
        fn = torch.compile(model, mode=mode)
        manual_graph = mode is None
    else:
        cl, io16, freezing, cd = cfg
        inductor_config.freezing = freezing
        inductor_config.coordinate_descent_tuning = cd
        module, in_dtype = _trtmc_module(folder, "fp16", io16)
        x = torch.randn(shape, device="cuda").to(in_dtype)
        if cl:
            module = module.to(memory_format=torch.channels_last)
            x = x.to(memory_format=torch.channels_last)
        fn = torch.compile(module)
        manual_graph = True
    t = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            fn(x)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t
    if compile_only:
        return {"variant": variant, "batch": batch, "compile_s": round(compile_s, 1)}
    kernels = None
    if manual_graph:
        from torch.profiler import ProfilerActivity, profile

        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(x)
            torch.cuda.synchronize()
        kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset")))
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(stream):
            fn(x)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.no_grad(), torch.cuda.graph(graph):
            fn(x)
        call = graph.replay
    else:
        call = lambda: fn(x)  # noqa: E731
    with torch.no_grad():
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(7):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(100):
                call()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 100)
    times.sort()
    return {"variant": variant, "batch": batch, "ms": round(times[3], 4), "spread": round((times[-1] - times[0]) / times[3], 3),
            "kernels": kernels, "compile_s": round(compile_s, 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", action="append", required=True)
    p.add_argument("--batch", type=int, action="append", required=True)
    p.add_argument("--variant", action="append")
    p.add_argument("--out", type=Path)
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--child", action="store_true")
    p.add_argument("--compile-only", action="store_true")
    a = p.parse_args()
    variants = a.variant or list(VARIANTS)
    if a.child:
        print(json.dumps(child(a.arch[0], variants[0], a.batch[0], a.compile_only)))
        return
    for arch in a.arch:
        _checkpoint(arch)
    jobs = [(arch, v, b) for arch in a.arch for b in a.batch for v in variants]

    def run(job, compile_only):
        arch, v, b = job
        cmd = [sys.executable, __file__, "--child", "--arch", arch, "--variant", v, "--batch", str(b)]
        r = subprocess.run(cmd + (["--compile-only"] if compile_only else []), capture_output=True, text=True)
        if r.returncode:
            return {"arch": arch, "variant": v, "batch": b, "error": r.stderr[-1500:]}
        return {"arch": arch, **json.loads(r.stdout.strip().splitlines()[-1])}

    t = time.perf_counter()
    with ThreadPoolExecutor(a.jobs) as pool:
        warm = list(pool.map(lambda j: run(j, True), jobs))
    print(f"phase 1 (parallel cold compiles) {time.perf_counter() - t:.0f} s", flush=True)
    rows = []
    for job in jobs:
        row = run(job, False)
        rows.append(row)
        print(json.dumps(row)[:400], flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "speed_lab.json").write_text(json.dumps({"warm": warm, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
