"""The folder scope: a folder of image files in, every file's result out, trtmc's pipeline against the
DataLoader a user writes by hand.

`build_folder` writes N files into the work folder, the oracle's photos copied round-robin (file i is a
copy of photo i mod P; a folder built before is reused). `run_folder_scope` then classifies each folder
twice, one side after the other, each in a fresh Python process (`folder_child`) so that neither side's
memory, threads or warm caches reach the other: trtmc's `classify_files` on the entry's bundle, and
timm's model behind a `torch.utils.data.DataLoader` (`results.SCOPE_TEXT[FOLDER]` says what each runs).
A child loads and compiles untimed, times one pass from the folder's sorted file names to every file's
top-5 in memory, and reports that with its peak RSS (`Measurement`). Here every file must come back
exactly once, and each file's top-1 class is judged against timm fp32's on the photo it copies
(`oracle.judge_top1`); a side that fails either is not a result, and no ratio is shown for it.

Importing this module loads neither torch nor timm.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence, get_type_hints

from . import oracle
from .results import DATALOADER, TRTMC, FolderRun, FolderSide
from .sources import photos_digest
from .spec import LOADER_WORKERS_CAP, FolderSpec

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
COMPLETE = ".complete"  # written last into a built folder: the folder holds every file
CHILD = "trtmc.bench.folder_child"
MEMORY_SAMPLE_SECONDS = 0.2  # how often a child looks at the memory of its child processes


def usable_cpus() -> int:
    """The CPUs this process may run on (in a container, often fewer than `os.cpu_count()`, the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_loader_workers(cores: int | None = None) -> int:
    """The DataLoader's num_workers when the entry sets none: the usable CPUs, at most LOADER_WORKERS_CAP."""
    return min(cores or usable_cpus(), LOADER_WORKERS_CAP)


# ---- the folder --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageFolder:
    """A folder built by `build_folder`: its files in sorted order (as `trtmc.pipeline.expand_images`
    lists them) and, for each, the index of the photo it copies."""

    path: Path
    files: tuple[Path, ...]
    photos: tuple[int, ...]


def build_folder(photos: Sequence[Path], count: int, workdir: Path) -> ImageFolder:
    """`count` files in `workdir/folders/`, file i a copy of `photos[i % len(photos)]` named
    `{i:07d}_{photo name}` (so sorting by name keeps i's order); written into a temporary folder
    and renamed, so a folder cut short is never taken for a built one."""
    photos = tuple(Path(p) for p in photos)
    if not photos:
        raise ValueError("the folder scope needs at least one photo to copy")
    folder = Path(workdir) / "folders" / f"{count}-images-of-photos-{photos_digest(photos)}"
    sources = tuple(i % len(photos) for i in range(count))
    names = [f"{i:07d}_{photos[p].name}" for i, p in enumerate(sources)]
    if not (folder / COMPLETE).is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{count}-", dir=folder.parent))
        try:
            for name, source in zip(names, sources):
                shutil.copyfile(photos[source], scratch / name)
            (scratch / COMPLETE).write_text(f"{count} files\n")
            shutil.rmtree(folder, ignore_errors=True)  # a folder cut short by an earlier run
            scratch.rename(folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return ImageFolder(folder, tuple(folder / name for name in names), sources)


# ---- what a child is asked and what it answers ---------------------------------------------------------


@dataclass(frozen=True)
class TrtmcPass:
    """trtmc's side: `classify_files` over `folder` with the bundle's `engine`, `batch` files an engine call."""

    folder: Path
    bundle: Path
    engine: str
    batch: int


@dataclass(frozen=True)
class LoaderPass:
    """The baseline's side: timm's model (`checkpoint`) in `precision` on `device`, channels_last,
    `torch.compile`d when `compile`, fed by a DataLoader of `workers` processes in batches of `batch`."""

    folder: Path
    checkpoint: Path
    precision: str
    device: str
    batch: int
    workers: int
    compile: bool = True


PASSES = {TRTMC: TrtmcPass, DATALOADER: LoaderPass}


def encode_request(work: TrtmcPass | LoaderPass, answer: Path) -> str:
    subject = next(s for s, kind in PASSES.items() if isinstance(work, kind))
    fields_ = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(work).items()}
    return json.dumps({"subject": subject, "work": fields_, "answer": str(answer)})


def decode_request(text: str) -> tuple[TrtmcPass | LoaderPass, Path]:
    request = json.loads(text)
    kind = PASSES[request["subject"]]
    types = get_type_hints(kind)
    work = kind(**{k: Path(v) if types[k] is Path else v for k, v in request["work"].items()})
    return work, Path(request["answer"])


@dataclass(frozen=True)
class Measurement:
    """A child's answer: every result's file name and top-1 class in the order the results came, the
    files that failed, the timed pass and what it ran with, and peak memory in bytes
    (`folder_child.MemoryWatch` says how each is read)."""

    files: tuple[str, ...]
    top1: tuple[int, ...]  # -1 where the file failed
    errors: tuple[str, ...]  # "name: why", one per failed file
    seconds: float  # the pass: file names in, every file's top-5 in memory
    load_seconds: float  # before it: the model loaded, compiled and warmed up
    workers: int
    batch: int
    device: str
    peak_rss: int  # the process's own peak RSS, over its whole life
    peak_rss_before_pass: int  # the same, read when the pass started
    workers_peak_rss: int  # the largest peak RSS of a child process (a DataLoader worker); 0 without one
    tree_peak_rss: int  # the largest RSS of the process and its children together, sampled

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Measurement":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


class ChildFailed(RuntimeError):
    """A folder-scope child exited without an answer; the message holds the last line of its stderr."""


def measure(work: TrtmcPass | LoaderPass, scratch: Path) -> Measurement:
    """`work` run in a fresh Python process (`python -m trtmc.bench.folder_child REQUEST`), which
    imports this very trtmc (its folder leads the child's PYTHONPATH)."""
    scratch.mkdir(parents=True, exist_ok=True)
    request, answer = scratch / "request.json", scratch / "answer.json"
    answer.unlink(missing_ok=True)
    request.write_text(encode_request(work, answer))
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", CHILD, str(request)], env=env, capture_output=True, text=True)
    log.debug("%s stderr:\n%s", CHILD, done.stderr)
    if done.returncode != 0 or not answer.is_file():
        # A Python error's last line names it; the whole traceback is logged (trtmc -v bench ...).
        last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise ChildFailed(f"the {CHILD} process exited with status {done.returncode}: {last}")
    return Measurement.from_json(json.loads(answer.read_text()))


# ---- judging an answer ---------------------------------------------------------------------------------


def miscounted(got: Sequence[str], expected: Sequence[str]) -> str | None:
    """What is wrong with the results' file names if they are not every expected file exactly once."""
    counts = Counter(got)
    wanted = set(expected)
    missing = [name for name in expected if name not in counts]
    repeated = [name for name, n in counts.items() if n > 1]
    foreign = [name for name in counts if name not in wanted]
    problems = [
        f"{len(names)} {what} (first: {names[0]})"
        for names, what in ((missing, "missing"), (repeated, "counted more than once"), (foreign, "not in the folder"))
        if names
    ]
    if not problems:
        return None
    return f"{len(got)} results for {len(expected)} files: " + ", ".join(problems)


def judge_side(
    subject: str, label: str, answer: Measurement, folder: ImageFolder, ref: oracle.Reference, tolerance: float
) -> FolderSide:
    """The side's result: every file counted once, no file failed, each top-1 judged by the oracle."""
    side = FolderSide(
        subject, label, len(folder.files), seconds=answer.seconds, load_seconds=answer.load_seconds,
        workers=answer.workers, batch=answer.batch, device=answer.device, peak_rss=answer.peak_rss,
        peak_rss_before_pass=answer.peak_rss_before_pass, workers_peak_rss=answer.workers_peak_rss,
        tree_peak_rss=answer.tree_peak_rss,
    )
    names = [p.name for p in folder.files]
    problem = miscounted(answer.files, names)
    if problem is None and answer.errors:
        problem = f"{len(answer.errors)} of {len(names)} files failed (first: {answer.errors[0]})"
    if problem is not None:
        return replace(side, error=problem)
    photo_of = dict(zip(names, folder.photos))
    verdict = oracle.judge_top1(answer.files, answer.top1, [photo_of[n] for n in answer.files], ref, tolerance)
    return replace(side, verdict=verdict)


# ---- the scope -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderJob:
    """An entry's folder scope: what both sides classify with."""

    spec: FolderSpec
    bundle: Path  # trtmc's side opens it
    engine: str  # the backend trtmc's side runs
    checkpoint: Path  # the baseline's timm weights (the bundle's source)
    precision: str
    device: str
    batch: int  # the entry's largest batch: the engine's, and the DataLoader's
    workdir: Path

    def sides(self, folder: Path) -> tuple[tuple[str, str, TrtmcPass | LoaderPass], ...]:
        """(subject, label, work) of trtmc's side, then the baseline's."""
        workers = self.spec.loader_workers if self.spec.loader_workers is not None else default_loader_workers()
        compiled = self.spec.baseline == "compile"
        how = "torch.compile" if compiled else "eager"
        return (
            (TRTMC, f"trtmc {self.precision} classify_files", TrtmcPass(folder, self.bundle, self.engine, self.batch)),
            (DATALOADER, f"timm DataLoader + {how} {self.precision} CL",
             LoaderPass(folder, self.checkpoint, self.precision, self.device, self.batch, workers, compiled)),
        )


def _describe(side: FolderSide) -> str:
    if side.status == "error":
        return f"error: {side.error}"
    text = f"{side.files / side.seconds:.1f} images/s ({side.seconds:.2f} s), peak RSS {side.peak_rss / 2**30:.2f} GiB"
    if side.workers_peak_rss:
        text += (f", workers up to {side.workers_peak_rss / 2**30:.2f} GiB each, "
                 f"{side.tree_peak_rss / 2**30:.2f} GiB with the process")
    return f"{text}; {side.verdict.describe()}"


def run_folder_scope(
    job: FolderJob, photos: Sequence[Path], ref: oracle.Reference, progress: Progress
) -> tuple[FolderRun, ...]:
    """Every folder of `job.spec`: built (or reused), then classified by each side in turn."""
    runs = []
    tolerance = oracle.tolerance(job.precision)
    for count in job.spec.images:
        folder = build_folder(photos, count, job.workdir)
        progress(f"folder of {count} images: {folder.path}")
        sides = []
        for subject, label, work in job.sides(folder.path):
            progress(f"folder of {count} images: {label}, in a fresh process")
            with tempfile.TemporaryDirectory(dir=job.workdir) as scratch:
                try:
                    side = judge_side(subject, label, measure(work, Path(scratch)), folder, ref, tolerance)
                except ChildFailed as exc:
                    side = FolderSide(subject, label, count, error=str(exc))
            progress(f"folder of {count} images: {label}: {_describe(side)}")
            sides.append(side)
        run = FolderRun(count, str(folder.path), *sides)
        if run.ratio is not None:
            progress(f"folder of {count} images: trtmc / baseline {run.ratio:.2f}x")
        runs.append(run)
    return tuple(runs)
