"""What a bench run found: one `Row` per subject, scope and batch size, one `FolderRun` per folder of
the folder scope, one `EntryResult` per entry, one `BenchResult` per run. The runner makes them; the
report only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .oracle import Reference, Verdict
from .spec import HEADLINE, LOADER_WORKERS_CAP, BenchOptions, Entry
from .timing import HostLoad, Timing

TRTMC = "trtmc"
DATALOADER = "dataloader"  # the folder scope's baseline
ENGINE, TASK, FOLDER = "engine", "task", "folder"
# What each scope times; the help text and results.md print these.
SCOPE_TEXT = {
    ENGINE: "device-resident input to complete float32 logits (on a GPU, trtmc's engine replays a CUDA graph "
    "per compiled batch size)",
    TASK: "the decoded photos as host RGB float32 arrays in, host logits out: image_to_class_scores "
    "(resize, crop, normalize, transfer, engine, copy back); decoding is not timed",
    FOLDER: "a folder of image files in (the oracle's photos copied round-robin), every file's top-5 in memory "
    "out, one pass timed in a fresh process after loading and compiling: trtmc's classify_files (its default "
    "decode worker processes, the engine's largest batch) against what a user writes by hand, timm with a "
    f"torch.utils.data.DataLoader (timm's eval transform, num_workers = the cores up to {LOADER_WORKERS_CAP}, "
    "pin_memory, the same batch) and the model in the entry's precision, channels_last, torch.compile in its "
    "default mode; images/s of each and their ratio, and each process's peak RSS (its own; with its workers, "
    "the DataLoader's); every file's top-1 class is judged against timm fp32's on the photo it copies",
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
class FolderSide:
    """One side of a folder run (trtmc's pipeline or the DataLoader baseline): one timed pass over every file."""

    subject: str  # TRTMC or DATALOADER
    label: str
    files: int  # the files in the folder
    seconds: float | None = None  # the timed pass, file names to every result in memory
    load_seconds: float | None = None  # before the pass, untimed: the model loaded, compiled, warmed up
    workers: int | None = None  # trtmc: decode worker processes; the baseline: DataLoader worker processes
    batch: int | None = None
    device: str | None = None
    peak_rss: int | None = None  # bytes, the process's own peak over its whole life
    peak_rss_before_pass: int | None = None  # bytes, the same when the pass started: what loading took
    workers_peak_rss: int | None = None  # bytes, the largest peak of a child process (a DataLoader worker)
    tree_peak_rss: int | None = None  # bytes, the process and its children together, sampled: an upper bound
    verdict: Verdict | None = None  # every file's top-1 against timm's
    error: str | None = None

    @property
    def status(self) -> str:
        """error | wrong | ok."""
        if self.error is not None or self.seconds is None:
            return "error"
        return "wrong" if self.verdict is not None and not self.verdict.right else "ok"

    @property
    def images_per_s(self) -> float | None:
        if self.status != "ok" or not self.seconds > 0:
            return None
        return self.files / self.seconds

    def to_json(self) -> dict:
        def mb(value: int | None) -> float | None:
            return None if value is None else round(value / 2**20, 1)

        return {
            "subject": self.subject,
            "label": self.label,
            "status": self.status,
            "files": self.files,
            "images_per_s": None if self.images_per_s is None else round(self.images_per_s, 1),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "load_seconds": None if self.load_seconds is None else round(self.load_seconds, 2),
            "workers": self.workers,
            "batch": self.batch,
            "device": self.device,
            "peak_rss_mib": mb(self.peak_rss),
            "peak_rss_before_pass_mib": mb(self.peak_rss_before_pass),
            "workers_peak_rss_mib": mb(self.workers_peak_rss),
            "tree_peak_rss_mib": mb(self.tree_peak_rss),
            "oracle": None if self.verdict is None else self.verdict.to_json(),
            "error": self.error,
        }


@dataclass(frozen=True)
class FolderRun:
    """One folder of the folder scope, classified by trtmc and by the baseline."""

    images: int
    folder: str
    trtmc: FolderSide
    baseline: FolderSide

    @property
    def ratio(self) -> float | None:
        """trtmc's images/s / the baseline's; None unless both sides are results (counted and judged right)."""
        ours, theirs = self.trtmc.images_per_s, self.baseline.images_per_s
        return None if ours is None or theirs is None else ours / theirs

    def to_json(self) -> dict:
        return {
            "images": self.images,
            "folder": self.folder,
            "ratio": None if self.ratio is None else round(self.ratio, 4),  # trtmc images/s / baseline images/s
            "trtmc": self.trtmc.to_json(),
            "baseline": self.baseline.to_json(),
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
    folder_runs: tuple[FolderRun, ...] = ()
    margin: float = 0.05
    host: HostLoad | None = None  # the CPUs while the rows were timed

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
    resumed: Mapping[str, str] = field(default_factory=dict)  # entry name -> start of the earlier run that timed it

    @property
    def ok(self) -> bool:
        return all(e.status == "passed" for e in self.entries)
