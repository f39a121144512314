"""What a bench run found: one `Row` per subject, scope and batch size, one `EntryResult` per entry,
one `BenchResult` per run. The runner makes them; the report only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .oracle import Reference, Verdict
from .spec import HEADLINE, BenchOptions, Entry
from .timing import Timing

TRTMC = "trtmc"
ENGINE, TASK = "engine", "task"
# What each scope times; the help text and results.md print these.
SCOPE_TEXT = {
    ENGINE: "device-resident input to complete float32 logits (on a GPU, trtmc's engine replays a CUDA graph "
    "per compiled batch size)",
    TASK: "the decoded photos as host RGB float32 arrays in, host logits out: image_to_class_scores "
    "(resize, crop, normalize, transfer, engine, copy back); decoding is not timed",
}


@dataclass(frozen=True)
class Row:
    """One subject (trtmc or a baseline) timed at one batch size in one scope, then judged."""

    subject: str  # "trtmc" or a baseline key
    label: str
    scope: str  # ENGINE or TASK
    batch: int
    timing: Timing | None = None
    first_call_s: float | None = None  # the first call, timed on its own: compile / graph capture
    verdict: Verdict | None = None  # the oracle's, after timing
    error: str | None = None

    @property
    def status(self) -> str:
        """error | wrong | unstable | ok."""
        if self.error is not None or self.timing is None:
            return "error"
        if self.verdict is not None and not self.verdict.right:
            return "wrong"
        return "ok" if self.timing.stable else "unstable"

    @property
    def median_ms(self) -> float | None:
        """The result, or None when the row is not one (errored, wrong or unstable)."""
        return self.timing.median_ms if self.status == "ok" else None

    def to_json(self) -> dict:
        return {
            "subject": self.subject,
            "label": self.label,
            "scope": self.scope,
            "batch": self.batch,
            "status": self.status,
            "median_ms": None if self.median_ms is None else round(self.median_ms, 5),
            "first_call_s": None if self.first_call_s is None else round(self.first_call_s, 3),
            "oracle": None if self.verdict is None else self.verdict.to_json(),
            "error": self.error,
            "timing": None if self.timing is None else self.timing.to_json(),
        }


@dataclass(frozen=True)
class EntryResult:
    entry: Entry
    status: str  # passed | failed (a wrong trtmc row) | error | unsupported
    message: str = ""
    architecture: str | None = None
    weights: str | None = None
    engine_key: str | None = None
    build_seconds: float | None = None
    load_seconds: float | None = None
    bundle_bytes: int | None = None
    reference: Reference | None = None
    rows: tuple[Row, ...] = ()
    margin: float = 0.05

    def row(self, subject: str, scope: str, batch: int) -> Row | None:
        return next((r for r in self.rows if (r.subject, r.scope, r.batch) == (subject, scope, batch)), None)

    def subjects(self) -> list[str]:
        return list(dict.fromkeys(r.subject for r in self.rows))

    def ratio(self, baseline: str, batch: int) -> float | None:
        """baseline ms / trtmc engine ms; None unless the entry passed and both rows are results
        (timed stably and judged right)."""
        if self.status != "passed":
            return None
        ours, theirs = self.row(TRTMC, ENGINE, batch), self.row(baseline, ENGINE, batch)
        if ours is None or theirs is None or ours.median_ms is None or theirs.median_ms is None:
            return None
        return theirs.median_ms / ours.median_ms

    def headline(self, batch: int) -> float | None:
        return self.ratio(HEADLINE, batch)

    def verdict(self, ratio: float) -> str:
        if ratio > 1 + self.margin:
            return "faster"
        if ratio < 1 - self.margin:
            return "slower"
        return "on par"

    def first_call_seconds(self, subject: str) -> dict[int, float]:
        return {
            r.batch: r.first_call_s
            for r in self.rows
            if r.subject == subject and r.scope == ENGINE and r.first_call_s is not None
        }


@dataclass(frozen=True)
class BenchResult:
    environment: dict[str, Any]
    options: BenchOptions
    entries: tuple[EntryResult, ...]
    started: str
    seconds: float

    @property
    def ok(self) -> bool:
        return all(e.status == "passed" for e in self.entries)
