"""Sporadic work on the GPU from another process, as a bench prepare's other builds give it (run 28).

Run 27's 14-build prepare recorded batch-1 graphs 6-13% quicker than a build alone or any later process times them
(`benchmarks/NOTES.md`, Run 28), and busy CPUs do not explain it. Beside the prepare's timing, the other builds
put short bursts of work on the GPU (first calls, graph captures, the expert's compile). This process does the
same on purpose, so that a build or a probe beside it says whether such bursts change a replay's time: a kernel of
about BUSY_US microseconds, then IDLE_MS milliseconds of host sleep, until SECONDS have passed.

    python tools/gpu_nudge.py SECONDS [BUSY_US=200] [IDLE_MS=5]
"""

from __future__ import annotations

import sys
import time

import torch


def cycles_per_us() -> float:
    """The SM clock's cycles in a microsecond, measured with `torch.cuda._sleep` (it spins for a count of cycles)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # wakes the clock before it is measured
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1000.0)


def main() -> None:
    seconds = float(sys.argv[1])
    busy_us = float(sys.argv[2]) if len(sys.argv) > 2 else 200.0
    idle_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    cycles = int(busy_us * cycles_per_us())
    bursts, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        bursts += 1
        time.sleep(idle_ms / 1000.0)
    print(f"gpu_nudge: {bursts} bursts of {busy_us:.0f} us ({cycles} cycles), {idle_ms} ms apart")


if __name__ == "__main__":
    main()
