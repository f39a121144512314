"""The timing protocol: warm-ups, measurements, the median, and one re-run of an unstable row.

A `Timer` runs a zero-argument function once and returns `(milliseconds, output)`. The real ones
are CUDA events around the call (device time, synchronized on the end event) and the host clock
with device synchronization on both sides; tests pass a scripted timer to exercise the protocol.
Outputs are only kept, never inspected here: argmax and finiteness checks happen after timing.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .spec import TimingProtocol

Timer = Callable[[Callable[[], Any]], "tuple[float, Any]"]
ENGINE, TASK = "engine", "task"
SCOPES = (ENGINE, TASK)


@dataclass(frozen=True)
class Timing:
    """The samples of one row. `discarded_ms` holds a first, unstable attempt that was re-run."""

    samples_ms: tuple[float, ...]
    margin: float
    attempts: int = 1
    discarded_ms: tuple[float, ...] = ()

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.samples_ms))

    @property
    def spread(self) -> float:
        """The largest distance of a sample from the median, as a fraction of the median."""
        return spread(self.samples_ms)

    @property
    def stable(self) -> bool:
        return within(self.samples_ms, self.margin)

    def to_json(self) -> dict:
        return {
            "median_ms": round(self.median_ms, 5),
            "min_ms": round(min(self.samples_ms), 5),
            "max_ms": round(max(self.samples_ms), 5),
            "spread": round(self.spread, 5),
            "stable": self.stable,
            "attempts": self.attempts,
            "samples_ms": [round(s, 5) for s in self.samples_ms],
            "discarded_ms": [round(s, 5) for s in self.discarded_ms],
        }


def spread(samples: tuple[float, ...] | list[float]) -> float:
    median = statistics.median(samples)
    if median <= 0:
        return float("inf")
    return max(abs(s - median) for s in samples) / median


def within(samples, margin: float) -> bool:
    """Whether the samples stay within the margin around their median (1.05 vs 1.0 is within 5%)."""
    return spread(samples) <= margin + 1e-9  # tolerate float rounding at the boundary


def synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _no_sync() -> None:
    return None


def measure(fn: Callable[[], Any], protocol: TimingProtocol, timer: Timer, sync: Callable[[], None] = _no_sync):
    """`protocol.warmups` untimed calls, then `protocol.iters` timed ones: (samples in ms, last output)."""
    for _ in range(protocol.warmups):
        fn()
    sync()
    samples: list[float] = []
    output = None
    for _ in range(protocol.iters):
        output = None  # drop the previous output first: CUDA-graph pools may reuse its memory
        ms, output = timer(fn)
        samples.append(float(ms))
    return tuple(samples), output


def time_row(fn: Callable[[], Any], protocol: TimingProtocol, timer: Timer, sync: Callable[[], None] = _no_sync):
    """One row of the protocol: measured, and re-run once if its samples spread beyond the margin.

    Returns `(Timing, last output)`; a row still unstable after the re-run has `stable == False`
    and is reported as unstable, not as a result.
    """
    samples, output = measure(fn, protocol, timer, sync)
    if within(samples, protocol.margin):
        return Timing(samples, protocol.margin), output
    first = samples
    samples, output = measure(fn, protocol, timer, sync)
    return Timing(samples, protocol.margin, attempts=2, discarded_ms=first), output


def cuda_event_timer() -> Timer:
    """Device time between two CUDA events recorded around the call, waited for on the end event."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def timer(fn: Callable[[], Any]):
        start.record()
        output = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), output

    return timer


def wall_timer(device: str = "cpu") -> Timer:
    """Host time of the call, with the device synchronized before and after it."""

    def timer(fn: Callable[[], Any]):
        synchronize(device)
        started = time.perf_counter()
        output = fn()
        synchronize(device)
        return (time.perf_counter() - started) * 1e3, output

    return timer


def default_timer(scope: str, device: str) -> Timer:
    """CUDA events for the engine scope on a GPU; the host clock otherwise (the task scope ends on the host)."""
    if scope == ENGINE and str(device).startswith("cuda"):
        return cuda_event_timer()
    return wall_timer(device)
