"""Why a build's replay is quicker than its bundle's engine later: the graph, its input or the process (issue 12).

Runs 26 and 27 (H100): each kept lowering's replay at build was 6-8% quicker at batch 1 than the same bundle's
graph replayed in a later process (resnet50 0.303 against 0.322 ms, convnext_tiny 0.419 / 0.451,
mobilenetv3_large_100 0.225 / 0.241), with the SM clock at its highest (1980 MHz) through the later process's
rounds, so not the clock. The build times a graph captured from the module it has just compiled, fed
`torch.randn`; the later process captures the module its bundle's Inductor caches give back, from zeros, then fed
the pixels. This times, in one process and interleaved round by round:

- `loaded`: the bundle's engine graph, as the bench replays it (captured from zeros, fed uniform pixels);
- `loaded, randn`: the same compiled module captured again from a `torch.randn` batch, as the build captures;
- `fresh compile`: the same lowering compiled again here with Inductor's caches off, captured from `torch.randn`
  (what the build timed, in this process);

each by the build's timer (`inductor_lowerings.replay_ms`: the quickest of 9 rounds of ~10 ms) and by the bench's
protocol (median of 10 rounds of at least 20 ms), and the kernels of one replay of `loaded` and `fresh compile`
(`probe_common.kernels`); beside them, the build's own quickest rounds from the engine's record. If `fresh
compile` times as `loaded` does, the graphs are alike and the gap is the build's process; if it times as the build
did, the kernel lists say what the caches give back differently; `loaded, randn` against `loaded` is the input's
share. Writes OUT.json.

    PYTHONPATH=src python tools/build_gap_probe.py BUNDLE OUT.json [BATCH]   # default batch 1
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from probe_common import cuda_inductor_runtime, kernels
from trtmc.backends.inductor import compiling_in_process, feed_dtype
from trtmc.backends.inductor_lowerings import LOWERINGS, captured, compile_cuda, replay_ms
from trtmc.bench.spec import TimingProtocol
from trtmc.bench.timing import CudaEventClock, TimedCall, time_interleaved
from trtmc.runtime import Runtime


def randn_batch(runtime: Runtime, batch: int) -> torch.Tensor:
    """A batch as the build's example (`inductor._example`): standard normal pixels, fed as the engine feeds them."""
    shape = (batch, *runtime.graph.inputs[0].type.shape[1:])
    return torch.randn(shape, device="cuda").to(feed_dtype(runtime.graph), memory_format=torch.channels_last)


def fresh_compile(runtime: Runtime, example: torch.Tensor):
    """The engine's lowering at the example's batch size compiled again in this process with Inductor's caches off,
    then captured."""
    import torch._inductor.config

    compiled = compile_cuda(runtime.graph, runtime.choice.record)
    with torch._inductor.config.patch(force_disable_caches=True):
        return captured(compiled, example)


def main() -> None:
    bundle, out = Path(sys.argv[1]), Path(sys.argv[2])
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    runtime = cuda_inductor_runtime(bundle)
    engine = runtime.engine
    with torch.no_grad():
        x = engine._pixels.zeros(batch).uniform_()
        engine(x)  # captures the batch's graph from zeros, as the bench's engine does
    loaded, static_in, _ = engine._graphs[batch]
    static_in.copy_(x)
    example = randn_batch(runtime, batch)
    with compiling_in_process():
        loaded_randn, _ = captured(engine._compiled, example.clone())
    fresh, _ = fresh_compile(runtime, example.clone())
    graphs = {"loaded": loaded, "loaded, randn": loaded_randn, "fresh compile": fresh}
    quickest = replay_ms(graphs)
    outcome = time_interleaved({name: TimedCall(g.replay, CudaEventClock()) for name, g in graphs.items()},
                               TimingProtocol())
    built = runtime.choice.record.get(LOWERINGS, {}).get(str(batch), {})  # the build's candidates, quickest rounds
    results = {"bundle": str(bundle), "engine": runtime.choice.key, "batch": batch, "chosen": built.get("chosen"),
               "build_ms": built.get("ms"),
               "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "graphs": {}}
    for name, cuda_graph in graphs.items():
        timing = outcome.timings.get(name)
        row = {"build_timer_quickest_ms": round(quickest[name], 5)}
        row.update({"error": outcome.errors.get(name)} if timing is None else {
            "median_ms": round(timing.median_ms, 5), "spread": round(timing.spread, 4),
            "calls_per_round": timing.calls_per_round})
        if name != "loaded, randn":
            listed = kernels(cuda_graph.replay)
            row.update(kernels=sum(k["count"] for k in listed), kernel_us=round(sum(k["us"] for k in listed), 1),
                       top=listed[:25])
        results["graphs"][name] = row
        print(f"batch {batch} {name}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "top"), flush=True)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
