"""Progress lines for long work: one timestamped line per step on stderr."""

from __future__ import annotations

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
