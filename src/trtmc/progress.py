"""Progress lines for long work: one timestamped line per step on stderr."""

from __future__ import annotations

import os
import sys
import time


class Progress:
    """Timestamped progress lines on stderr (`[  12.3s] message`); silent when `quiet`."""

    def __init__(self, quiet: bool = False) -> None:
        self.start = time.perf_counter()
        self.quiet = quiet

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)


def seconds_since_process_start() -> float | None:
    """How long this process has run, interpreter start-up and imports included (Linux; None elsewhere)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # Field 22 counts clock ticks from boot to the process's start; the name field may hold spaces.
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(uptime - started_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
