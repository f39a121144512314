"""The timing protocol: rounds of back-to-back calls, interleaved across rows, re-runs of an unstable row.

A row is a zero-argument call and the `Clock` that times it. A clock times one round: `calls`
back-to-back calls, returning the round's milliseconds; a sample is that divided by the calls, so a
sub-millisecond engine is timed over a round long enough for the clock (a single call timed with CUDA
events around a Python call mostly measures the launch). `time_interleaved` runs every row's warm-up
rounds (which calibrate its calls per round), then measured round r of every row before round r+1 of
any, so that clock changes and a busy neighbour hit all rows alike. Outputs are not kept: what the
rows answer is judged elsewhere, after timing.

Nothing here imports torch until a real clock runs; `describe` turns a protocol into the words the
help and the report print, so the text cannot drift from the numbers that ran.
"""

from __future__ import annotations

import collections
import gc
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Protocol, TypeVar

from .spec import TimingProtocol

# A round never grows past this many calls, whatever a clock reports (a zero reading included).
MAX_CALLS_PER_ROUND = 100_000
# A row's measured rounds are run at most this many times: a row still spreading beyond the margin after the
# last is shown as unstable. Rows timed on the host follow the host's speed, which on the lent GPU machine
# changes for seconds at a time (benchmarks/NOTES.md, runs 7 and 11): a later attempt often lands in a quiet
# spell. Measured (run 11, 44 task rows of 22 entries): 5 stable at the first attempt, 15 within three, 29
# within eight; an extra attempt re-runs only the unstable rows (~0.5 s each).
MAX_ATTEMPTS = 8
# Rows timed on the host get fewer: on the lent GPU machine the host runs at about half its best speed most of
# the time (run 13), and run 14's task rows settled within 4 attempts in 13 of 58 cases and within 8 in 24, while
# the other 34 spent all 8 (~1 s an attempt a row): attempts 5-8 cost ~5 s an entry, ~3 minutes of a full bench's
# 30, to make 11 more rows stable. The bench must fit one session of device time, so a host row stops after 4.
MAX_HOST_ATTEMPTS = 4


class Clock(Protocol):
    """Times `calls` back-to-back calls of `fn`: milliseconds for the whole round. `on_host`: the round is
    timed on the host's clock, so it follows the host's speed (its rounds last `host_round_ms`, and the host's
    speed is probed after each attempt)."""

    name: str
    on_host: bool

    def __call__(self, fn: Callable[[], Any], calls: int) -> float: ...


class CudaEventClock:
    """Device time between CUDA events recorded around the round, waited for on the end event."""

    name = "CUDA events around the round"
    on_host = False

    def __call__(self, fn: Callable[[], Any], calls: int) -> float:
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


class HostClock:
    """Host time of the round, with the device synchronized before and after it."""

    on_host = True

    def __init__(self, device: str = "cpu") -> None:
        self.device = str(device)
        self.name = "host clock, device synchronized" if self.device.startswith("cuda") else "host clock"

    def __call__(self, fn: Callable[[], Any], calls: int) -> float:
        synchronize(self.device)
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(self.device)
        return (time.perf_counter() - started) * 1e3


def synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


@dataclass(frozen=True)
class Timing:
    """The samples of one row (ms per call, one per round). `discarded_ms` holds the samples of each earlier,
    unstable attempt that was run again, in order. For a row timed on the host: `host_speed`, the host's speed
    right after each attempt (`HostSpeed.speed`: 1.0 is full speed)."""

    samples_ms: tuple[float, ...]
    calls_per_round: int
    margin: float
    clock: str
    attempts: int = 1
    discarded_ms: tuple[tuple[float, ...], ...] = ()
    host_speed: tuple[float, ...] = ()

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
            "calls_per_round": self.calls_per_round,
            "clock": self.clock,
            "attempts": self.attempts,
            "samples_ms": [round(s, 5) for s in self.samples_ms],
            "discarded_ms": [[round(s, 5) for s in attempt] for attempt in self.discarded_ms],
            "host_speed": [round(s, 4) for s in self.host_speed],
        }


def spread(samples: tuple[float, ...] | list[float]) -> float:
    median = statistics.median(samples)
    if median <= 0:
        return float("inf")
    return max(abs(s - median) for s in samples) / median


def within(samples, margin: float) -> bool:
    """Whether the samples stay within the margin around their median (1.05 vs 1.0 is within 5%)."""
    return spread(samples) <= margin + 1e-9  # tolerate float rounding at the boundary


@dataclass(frozen=True)
class TimedCall:
    """One row to time: the work (inputs already in place) and the clock for it."""

    fn: Callable[[], Any]
    clock: Clock


K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Outcome:
    """What `time_interleaved` found: a timing per row that ran, an error per row that raised."""

    timings: Mapping[Any, Timing]
    errors: Mapping[Any, str]


def calls_for(round_ms: float, calls: int, measured_ms: float) -> int:
    """The calls a round needs to last `round_ms`, from a round of `calls` calls that took `measured_ms`."""
    if measured_ms <= 0:
        return min(calls * 10, MAX_CALLS_PER_ROUND)
    return max(1, min(math.ceil(calls * round_ms / measured_ms), MAX_CALLS_PER_ROUND))


class HostSpeed:
    """The host's speed, probed with a short pure-Python loop: what a row timed on the host follows.

    A probe is the quickest of three runs of the loop (about `probe_s` each); the quickest probe of the last
    `window_s` seconds counts as full speed. On the lent GPU machine, with nothing else running in it, probes
    25 ms apart on every CPU ran at a median 0.55 of the quickest (p10 0.46, p90 0.88), all CPUs together and
    second by second, and as slow after a sleep as after the bench's threaded copy (benchmarks/NOTES.md, run 13,
    tools/host_speed_probe.py): the host's own speed moves, and a row timed on it moves with it. `probe` and
    `clock` replace the loop and the wall clock (tests script them)."""

    def __init__(
        self, probe_s: float = 0.001, window_s: float = 60.0, probe: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.probe_s, self.window_s = probe_s, window_s
        self._probe, self._clock = probe, clock
        self._loop_n: int | None = None
        self._recent: collections.deque[tuple[float, float]] = collections.deque()  # (when, seconds)

    @property
    def fastest(self) -> float:
        """The quickest probe of the window: the host's full speed (inf before the first probe)."""
        return min((seconds for _, seconds in self._recent), default=math.inf)

    def _loop_seconds(self) -> float:
        if self._loop_n is None:
            n = 1000
            while _timed_loop(n) < self.probe_s and n < 10**8:
                n *= 2
            self._loop_n = n
        return min(_timed_loop(self._loop_n) for _ in range(3))

    def probe(self) -> float:
        """The seconds of one probe, kept in the window."""
        seconds = self._probe() if self._probe is not None else self._loop_seconds()
        now = self._clock()
        self._recent.append((now, seconds))
        while self._recent[0][0] < now - self.window_s:
            self._recent.popleft()
        return seconds

    def speed(self) -> float:
        """The host's speed now, as the quickest probe of the window over this one: 1.0 at full speed, 0.55 when
        the loop takes 1.8 times its best."""
        seconds = self.probe()
        return self.fastest / seconds


def _timed_loop(n: int) -> float:
    """Seconds of a pure-Python loop of `n` additions."""
    started = time.perf_counter()
    total = 0
    for i in range(n):
        total += i
    return time.perf_counter() - started


def time_interleaved(rows: Mapping[K, TimedCall], protocol: TimingProtocol, host: HostSpeed | None = None) -> Outcome:
    """Warm-up rounds (calibrating each row's calls per round), then `protocol.iters` measured rounds,
    every row once per round in the order given; rows whose samples spread beyond the margin get their
    measured rounds again (interleaved among themselves), up to `MAX_ATTEMPTS` attempts in all (`MAX_HOST_ATTEMPTS`
    for a row timed on the host), and keep their last attempt.

    A round lasts at least `protocol.round_ms`, or `protocol.host_round_ms` for a row timed on the host
    (`Clock.on_host`). With `host`, the host's speed is probed after each attempt at such rows and recorded
    with them.

    A row whose call raises is dropped from the rounds that follow, with its error recorded; the
    other rows go on. Python's garbage collector is paused for the rounds (after one collection), as
    timeit does: a collection would otherwise land in one row's round, at random.
    """
    gc.collect()
    paused = gc.isenabled()
    gc.disable()
    try:
        return _rounds(rows, protocol, host)
    finally:
        if paused:
            gc.enable()


def _rounds(rows: Mapping[K, TimedCall], protocol: TimingProtocol, host: HostSpeed | None) -> Outcome:
    errors: dict[K, str] = {}
    calls = {key: 1 for key in rows}
    on_host = {key for key, row in rows.items() if row.clock.on_host}
    round_ms = {key: protocol.host_round_ms if key in on_host else protocol.round_ms for key in rows}
    speeds: dict[K, list[float]] = {key: [] for key in on_host}

    def round_of(key: K) -> float | None:
        row = rows[key]
        try:
            return float(row.clock(row.fn, calls[key]))
        except Exception as exc:  # a crashing row is a result to report, not the end of the entry
            errors[key] = f"{type(exc).__name__}: {exc}"
            return None

    for _ in range(protocol.warmups):
        for key in [k for k in rows if k not in errors]:
            ms = round_of(key)
            if ms is not None:
                calls[key] = calls_for(round_ms[key], calls[key], ms)

    def attempt(keys: list[K]) -> dict[K, list[float]]:
        hosted = [key for key in keys if key in on_host]
        samples: dict[K, list[float]] = {key: [] for key in keys}
        for _ in range(protocol.iters):
            for key in [k for k in keys if k not in errors]:
                ms = round_of(key)
                if ms is not None:
                    samples[key].append(ms / calls[key])
        if host is not None and hosted:
            speed = host.speed()
            for key in hosted:
                speeds[key].append(speed)
        return {key: s for key, s in samples.items() if key not in errors}

    attempts = {key: [s] for key, s in attempt([k for k in rows if k not in errors]).items()}
    limit = {key: MAX_HOST_ATTEMPTS if key in on_host else MAX_ATTEMPTS for key in rows}
    for _ in range(MAX_ATTEMPTS - 1):
        unstable = [key for key, tried in attempts.items()
                    if not within(tried[-1], protocol.margin) and len(tried) < limit[key]]
        if not unstable:
            break
        for key, s in attempt(unstable).items():
            attempts[key].append(s)
    timings = {}
    for key, tried in attempts.items():
        if key not in errors:
            *earlier, last = tried
            timings[key] = Timing(tuple(last), calls[key], protocol.margin, rows[key].clock.name, len(tried),
                                  tuple(tuple(s) for s in earlier), tuple(speeds.get(key, ())))
    return Outcome(timings, errors)


@dataclass(frozen=True)
class HostLoad:
    """What the machine's CPUs did while rows were timed, from Linux's /proc/stat and this process's own
    usage: shares of all CPUs' time over the span. `others` is the busy time this process did not use
    (other processes, the kernel's work for them); `steal`, what the hypervisor ran elsewhere. A row
    timed on the host that is unstable while `others` or `steal` is high was disturbed from outside."""

    seconds: float
    busy: float
    others: float
    steal: float
    involuntary_switches: int  # this process's, preempted while runnable

    def to_json(self) -> dict:
        return {"seconds": round(self.seconds, 2), "busy": round(self.busy, 4), "others": round(self.others, 4),
                "steal": round(self.steal, 4), "involuntary_switches": self.involuntary_switches}


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(all, idle + iowait, steal) ticks of every CPU since boot; None where /proc/stat is not Linux's."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks), ticks[3] + ticks[4], ticks[7]


class HostMeter:
    """Measures a span's `HostLoad`: `start()`, the work, then `stop()` (None where it cannot be read)."""

    def start(self) -> "HostMeter":
        import resource

        self._ticks, self._usage, self._wall = _cpu_ticks(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        return self

    def stop(self) -> HostLoad | None:
        import os
        import resource

        ticks, usage, wall = _cpu_ticks(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if ticks is None or self._ticks is None or ticks[0] <= self._ticks[0]:
            return None
        total, idle, steal = (a - b for a, b in zip(ticks, self._ticks))
        own = (usage.ru_utime + usage.ru_stime - self._usage.ru_utime - self._usage.ru_stime) * os.sysconf("SC_CLK_TCK")
        busy = total - idle - steal
        return HostLoad(wall - self._wall, busy / total, max(0.0, busy - own) / total, steal / total,
                        usage.ru_nivcsw - self._usage.ru_nivcsw)


def describe(protocol: TimingProtocol) -> str:
    """The protocol in words, from its own numbers (the help text and results.md print this)."""
    return (
        f"Every row is prepared first (its first call, timed on its own, compiles or captures), then timed "
        f"in rounds of back-to-back calls: {protocol.warmups} warm-up rounds set the calls per round so that "
        f"a round lasts at least {protocol.round_ms:g} ms, then {protocol.iters} measured rounds give one sample "
        f"each (the round's time divided by its calls); the median sample is the result. The rows of an entry "
        f"are interleaved round by round, so drift hits all of them alike; Python's garbage collector is paused "
        f"meanwhile. A row whose samples stray further than {protocol.margin:.0%} from their median is measured "
        f"again, up to {MAX_ATTEMPTS - 1} more times ({MAX_HOST_ATTEMPTS - 1} on the host clock), then shown as "
        f"unstable instead of as a result. A speed ratio within 1 ± {protocol.margin:g} counts as on par. "
        f"Rows timed on the host clock (the task scope) follow the host's own speed: their rounds last at least "
        f"{protocol.host_round_ms:g} ms, and the host's speed after each attempt (a pure-Python probe against its "
        f"quickest run of the last minute) is recorded with the row."
    )
