"""Where a bundle's engine call spends the time its build did not measure (issue 12's batch-1 ratios).

Run 25 (H100): each kept lowering's replay at build was 8-20% quicker at batch 1 than the bench's engine row of the
same bundle (13 entries; resnet50 0.304 against 0.341 ms, convnext_tiny 0.420 against 0.475, mobilenetv3_large_100
0.225 against 0.270; 28-155 us a call, growing with the model, so not a fixed cost per call), and 2-13% at batch
128 (14 entries). If `replay` below times as the bench's row does, the gap is the process or the GPU's state, not
the engine's call; if it times as the build did, the layers above it say which one costs it. The build times its
CUDA graph's `replay()` back to back (the quickest round); the bench times `engine(x)`: the pixels checked, copied
into the graph's static buffer, the replay, the logits copied out as float32. This times those layers of one loaded
engine, interleaved round by round with the bench's protocol (`trtmc.bench.timing.time_interleaved`: CUDA events,
rounds of at least 20 ms, median of 10 and the quickest round):

- `replay`: the engine's own CUDA graph replayed back to back (what the build timed);
- `copy+replay`: the pixels copied into the graph's static buffer, then the replay;
- `forward`: `engine._forward(x)` (the same, through the engine's lookup of its graph);
- `engine`: `engine(x)`, as the bench's engine row calls it.

and, for each, the host's own seconds per call (`enqueue_us`): 200 calls issued with nothing waited for, the
host's clock around the loop alone. Where a call's host cost is above its device time, the GPU waits on the host
and the device time measures the host. Writes OUT.json.

Run 26 (H100, six models, `benchmarks/results/2026-12-06-h100-run26-probes/`): `engine` 1-3% over `replay` at
batch 1 (the copy into the static buffer 1-7 us, the engine's own layers 2-3 us more; 60-65 us of copy at batch
128), so the call is not the gap; the same graph replayed 6-9% quicker at build than here, and the bench's row
1.5-3% (mobilenetv3_large_100 7%) slower than `engine` here. `gpu_session.sh` logs the GPU's clocks beside it since.

    PYTHONPATH=src python tools/engine_gap_probe.py BUNDLE OUT.json [BATCH ...]   # default batch 1
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from probe_common import cuda_inductor_runtime
from trtmc.bench.spec import TimingProtocol
from trtmc.bench.timing import CudaEventClock, TimedCall, time_interleaved

ENQUEUED_CALLS = 200


def enqueue_us(fn, calls: int = ENQUEUED_CALLS) -> float:
    """The host's microseconds per call of `fn` issued `calls` times back to back, nothing waited for inside."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - started
    torch.cuda.synchronize()
    return seconds / calls * 1e6


def layers(engine, x: torch.Tensor) -> dict:
    """The calls to time, from the build's replay alone to the bench's engine call."""
    engine(x)  # captures the batch's CUDA graph
    cuda_graph, static_in, _ = engine._graphs[x.shape[0]]

    def copy_and_replay():
        static_in.copy_(x, non_blocking=True)
        cuda_graph.replay()

    return {"replay": cuda_graph.replay, "copy+replay": copy_and_replay,
            "forward": lambda: engine._forward(x), "engine": lambda: engine(x)}


def main() -> None:
    bundle, out = Path(sys.argv[1]), Path(sys.argv[2])
    batches = [int(b) for b in sys.argv[3:]] or [1]
    runtime = cuda_inductor_runtime(bundle)
    engine = runtime.engine
    results: dict = {"bundle": str(bundle), "engine": runtime.choice.key, "gpu": torch.cuda.get_device_name(),
                     "torch": torch.__version__, "batches": {}}
    with torch.no_grad():
        for batch in batches:
            x = engine._pixels.zeros(batch).uniform_()  # the engine's dtype, NCHW contiguous, as the bench feeds it
            calls = layers(engine, x)
            outcome = time_interleaved({name: TimedCall(fn, CudaEventClock()) for name, fn in calls.items()},
                                       TimingProtocol())
            row = {}
            for name, fn in calls.items():
                timing = outcome.timings.get(name)
                row[name] = {"error": outcome.errors.get(name)} if timing is None else {
                    "median_ms": round(timing.median_ms, 5), "quickest_ms": round(min(timing.samples_ms), 5),
                    "spread": round(timing.spread, 4), "calls_per_round": timing.calls_per_round,
                    "enqueue_us": round(enqueue_us(fn), 2)}
                print(f"batch {batch} {name}: {row[name]}", flush=True)
            results["batches"][str(batch)] = row
            out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
