"""Where trtmc's engine and the expert baseline spend their time, on the same GPU (issue 12's misses).

For each LABEL=ARCH=BUNDLE: the bundle's CUDA engine (loaded as the bench loads it) and the bench's `expert`
baseline of timm's ARCH (random init: speed does not depend on the values), at batch 1 and 128: both timed
interleaved, a round at least 20 ms of back-to-back calls, median of 10 rounds (as `trtmc bench` times
them), and the kernels of one call of each from torch.profiler, summed by kind (tools/kernel_profile.py's
kinds) with the 15 longest, and every launch in the order it ran (`launches`: name and us). Bundles of one ARCH
share one expert, so two builds of ARCH compare directly.
A third row, `recompiled`, is the lowering the engine runs at that batch size (its build's choice, patch and GELU
products included, with the build's Inductor options) compiled afresh in this process (Inductor's FX graph cache off,
so not the bundle's code) and replayed as tools/depthwise_taps_probe.py replays it, without the engine's input copy
and output copy: run 18 timed mobilevit_s's bundle at 0.578 ms and the probe's compile of the same lowering at
0.491 ms, in two processes. MISS_OPTIONS (a JSON object of Inductor options, e.g.
'{"coordinate_descent_tuning": true}') adds a fourth row, `recompiled, options`: the same compile with those options,
so a lever for the kernels a profile singles out is timed beside the code it would replace in one call.
MISS_BATCHES (default "1 128") picks the batch sizes; MISS_RECOMPILE=0 leaves the `recompiled` row out.
MISS_CUDNN_BENCHMARK=1 runs the whole process in cuDNN's benchmark mode (`torch.backends.cudnn.benchmark`: each
convolution's plans timed on first use, the quickest kept) instead of its heuristic's pick. ATen caches a plan per
convolution shape whatever the flag, so the two modes compare only between two processes; within one, trtmc's engine
and the expert run in the same mode.
Writes OUT_DIR/LABEL.json and prints one line per row.

    PYTHONPATH=src [MISS_OPTIONS=JSON] [MISS_BATCHES="128"] [MISS_RECOMPILE=0] [MISS_CUDNN_BENCHMARK=1] \
        python tools/miss_profile.py OUT_DIR LABEL=ARCH=BUNDLE ...
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_profile import kernel_launches, kind_of, times_by_name  # noqa: E402
from probe_common import engine_replay  # noqa: E402

BATCHES = tuple(int(b) for b in os.environ.get("MISS_BATCHES", "1 128").split())


def kernels(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    launches = kernel_launches(prof)
    by_name = times_by_name(launches)
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, times in by_name.items():
        kinds[kind_of(name)][0] += len(times)
        kinds[kind_of(name)][1] += sum(times)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:15]
    return {"kernels": sum(len(t) for t in by_name.values()), "kernel_us": round(sum(sum(t) for t in by_name.values()), 1),
            "by_kind": {k: {"kernels": v[0], "us": round(v[1], 1)} for k, v in kinds.items()},
            "top": [{"name": n[:100], "count": len(t), "us": round(sum(t), 1)} for n, t in top],
            "launches": [[name[:100], round(us, 2)] for name, us in launches]}


def timed(rows: dict) -> dict:
    """Each row's median ms per call, spread and calls per round, timed as `trtmc bench` times engine rows
    (its protocol and CUDA-event clock, rows interleaved round by round)."""
    from trtmc.bench.spec import TimingProtocol
    from trtmc.bench.timing import CudaEventClock, TimedCall, time_interleaved

    outcome = time_interleaved({name: TimedCall(fn, CudaEventClock()) for name, fn in rows.items()}, TimingProtocol())
    if outcome.errors:
        raise RuntimeError(f"rows failed: {dict(outcome.errors)}")
    return {name: {"median_ms": round(t.median_ms, 4), "spread": round(t.spread, 4), "calls": t.calls_per_round,
                   "attempts": t.attempts} for name, t in outcome.timings.items()}


def options_from_env() -> dict:
    """MISS_OPTIONS as Inductor options, each name checked against Inductor's config before anything is compiled."""
    import torch._inductor.config as inductor_config

    options = json.loads(os.environ.get("MISS_OPTIONS") or "{}")
    if not isinstance(options, dict):
        raise SystemExit(f"MISS_OPTIONS must be a JSON object of Inductor options, got {options!r}")
    unknown = sorted(set(options) - set(inductor_config.get_config_copy()))
    if unknown:
        raise SystemExit(f"MISS_OPTIONS names options Inductor does not have: {', '.join(unknown)}")
    return options


def recompiled(compiled, graph, batch: int, options: dict | None = None):
    """The lowering `compiled` (the loaded engine's `CompiledCuda`) runs at `batch`, compiled without Inductor's FX
    graph cache, with the build's options and then `options`, replayed in a CUDA graph."""
    import torch._inductor.config as inductor_config

    lowering = compiled.chosen_lowering(batch)
    module = lowering.module(graph, torch.device("cuda"))
    with inductor_config.patch(fx_graph_cache=False, **{**compiled.options_for(lowering), **(options or {})}):
        replay, _, _ = engine_replay(module, graph, batch)
    return replay


def main() -> None:
    import timm

    from trtmc.backends.torch_lowering import TORCH_DTYPES
    from trtmc.bench.baselines import make_baseline
    from trtmc.runtime import Runtime

    options = options_from_env()
    recompile = os.environ.get("MISS_RECOMPILE", "1") != "0"
    torch.backends.cudnn.benchmark = os.environ.get("MISS_CUDNN_BENCHMARK") == "1"  # before the first convolution
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    experts = {}
    for spec in sys.argv[2:]:
        label, arch, bundle = spec.split("=", 2)
        runtime = Runtime.open(Path(bundle))
        runtime.engine.warm_up()
        if arch not in experts:
            model = timm.create_model(arch, pretrained=False).eval().cuda()
            experts[arch] = make_baseline("expert", model, "fp16", "cuda")
        expert = experts[arch]
        shape = runtime.graph.inputs[0].type.shape
        dtype = TORCH_DTYPES[runtime.graph.inputs[0].type.dtype]
        compiled = runtime.engine._compiled  # the engine's lowerings (as tools/build_gap_probe.py takes them)
        result = {"label": label, "arch": arch, "engine": runtime.choice.key, "options": options,
                  "cudnn_benchmark": torch.backends.cudnn.benchmark, "batches": {}}
        with torch.no_grad():
            for batch in BATCHES:
                pixels = torch.rand((batch, *shape[1:]), device="cuda")
                x_trtmc = pixels.to(dtype).contiguous()
                x_expert = expert.prepare(pixels)
                rows = {"trtmc": lambda engine=runtime.engine: engine(x_trtmc), "expert": lambda: expert(x_expert)}
                if recompile:
                    rows["recompiled"] = recompiled(compiled, runtime.graph, batch)
                if options:
                    rows["recompiled, options"] = recompiled(compiled, runtime.graph, batch, options)
                for fn in rows.values():
                    fn()
                times = timed(rows)
                result["batches"][batch] = {name: {**times[name], **kernels(fn)} for name, fn in rows.items()}
                row = result["batches"][batch]
                print(f"{label:22} b{batch:<3} " + " ".join(
                    f"{name} {r['median_ms']:.3f} ms ({r['kernels']} kernels, {r['kernel_us']:.0f} us)" for name, r in row.items())
                      + f" ratio {row['expert']['median_ms'] / row['trtmc']['median_ms']:.3f}", flush=True)
        (out_dir / f"{label}.json").write_text(json.dumps(result, indent=1))
        del runtime
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
