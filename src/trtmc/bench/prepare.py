"""The prepare phase: the slow, CPU-bound part of every entry, several entries at once, before any timing.

An entry's prepare draws its random weights, builds trtmc's bundle (`BUILD`), and on timm's side
(`BASELINES`) computes timm fp32's answers on the oracle's photos (`bench.answers`) and compiles the compiled
baselines cold, filling Inductor's on-disk caches, so that the timed run (`runner.run_entry` with
`reuse_bundles`) only loads. `prepare_entries` runs the parts in spawned processes, each with its
share of the CPUs, and leaves a note per entry once both parts are done (`is_prepared`): a prepare cut
short is taken up where it stopped, and timing never starts on an entry whose baselines were not compiled.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Executor
from pathlib import Path

import torch

from ..backends.gpu_lock import device_lock, share_gpu_with_timing
from ..random_weights import load_timm_model
from ..preprocess import PreprocessSpec
from . import answers, oracle
from .baselines import COMPILED, make_baseline
from .folder import usable_cpus
from .runner import (Photos, Progress, answers_path, build_bundle_for, free_device_memory, log_progress,
                     unsupported_reason)
from .sources import ModelSource, resolve_source
from .spec import BenchOptions, Entry
from .timing import synchronize

PREPARED = "prepared"  # the workdir folder where each prepared entry leaves a note of what was prepared


def _prepared_note(options: BenchOptions, entry: Entry) -> Path:
    return Path(options.workdir) / PREPARED / f"{entry.name}.json"


def _compiled_baselines(options: BenchOptions) -> list[str]:
    return [k for k in options.baselines if k in COMPILED]


def is_prepared(entry: Entry, options: BenchOptions) -> bool:
    """Whether a prepare phase in this workdir finished `entry` for these options' compiled baselines."""
    note = _prepared_note(options, entry)
    return note.is_file() and json.loads(note.read_text()).get("compiled") == _compiled_baselines(options)


# The two parts of an entry's prepare. They need nothing of each other, so the prepare phase runs them in
# processes of their own: an entry's build and its baselines' compiles side by side, and the machine's CPUs kept
# busy to the end (run 14's prepare: 414 s, its last 160 s waiting on the few long entries, mixnet_s's build and
# then its expert's compiles one after the other).
BUILD, BASELINES = "build", "baselines"


def prepare_entry(entry: Entry, options: BenchOptions, progress: Progress = log_progress,
                  parts: tuple[str, ...] = (BUILD, BASELINES)) -> float:
    """The slow, CPU-bound part of an entry, so that several can run at once before timing: random
    weights, the trtmc build (`BUILD`: its time recorded beside the bundle) and timm's side (`BASELINES`):
    timm fp32's answers on the photos, and the cold compiles of the compiled baselines, which fill
    Inductor's on-disk caches for the timed run. Given both parts, leaves a note in the workdir once all
    of it is done (`is_prepared`); `prepare_entries` notes an entry whose parts ran apart. Returns the
    seconds it took."""
    started = time.perf_counter()
    files = oracle.photo_files(entry.photos)
    source = resolve_source(entry.model, entry.weights, options.workdir, entry.seed, files)
    if not unsupported_reason(source.architecture, entry.precision):  # else nothing to build: its timing says so
        if BUILD in parts:
            build_bundle_for(entry, source, options, progress)
        if BASELINES in parts:
            timm_model = load_timm_model(source.folder)  # on the CPU for its answers, then to the device
            _save_timm_answers(entry, source, options, files, timm_model, progress)
            _compile_baselines(entry, source, options, timm_model, progress)
    seconds = time.perf_counter() - started
    if set(parts) >= {BUILD, BASELINES}:
        _write_prepared_note(options, entry, seconds)
    return seconds


def _write_prepared_note(options: BenchOptions, entry: Entry, seconds: float, error: str | None = None) -> None:
    note = _prepared_note(options, entry)
    note.parent.mkdir(parents=True, exist_ok=True)
    record = {"compiled": _compiled_baselines(options), "seconds": round(seconds, 1), "error": error}
    note.write_text(json.dumps(record))


def _save_timm_answers(entry: Entry, source: ModelSource, options: BenchOptions, files: tuple[Path, ...],
                       timm_model, progress: Progress) -> None:
    """timm fp32's answers on the photos, on the CPU, into the work folder for the timed run (`bench.answers`)."""
    from ..checkpoint import Checkpoint

    preprocess = PreprocessSpec.from_pretrained(Checkpoint(source.folder).config.pretrained)  # as trtmc builds it
    photos = Photos.load(files, source.folder, preprocess)
    computed = answers.compute(timm_model, source.folder, photos, preprocess)
    computed.save(answers_path(options, entry))
    progress(f"timm fp32's answers on {len(files)} photos")


def _compile_baselines(entry: Entry, source: ModelSource, options: BenchOptions, timm_model,
                       progress: Progress) -> None:
    """Every compiled baseline of `timm_model` called once at each batch size: a cold compile, into the disk caches."""
    compiled = _compiled_baselines(options)
    if not compiled:
        return
    from ..checkpoint import Checkpoint

    if str(options.device).startswith("cuda"):  # their autotuning waits while a build beside them times
        share_gpu_with_timing(device_lock(torch.cuda.current_device()))
    with torch.no_grad():
        model = timm_model.to(options.device)
        pixels = torch.zeros((1,) + tuple(Checkpoint(source.folder).config.pretrained.input_size), device=options.device)
        for key in compiled:
            baseline = make_baseline(key, model, entry.precision, options.device)
            for batch in entry.batch_sizes:
                baseline(baseline.prepare(pixels.expand(batch, -1, -1, -1)))
                synchronize(options.device)
                progress(f"compiled {key} batch {batch}")
            del baseline
            free_device_memory(options.device)


class PrepareFailed(Exception):
    """An entry's prepare failed in its child process: the original error in words, and its traceback."""

    def __init__(self, error: str, trace: str = "") -> None:
        super().__init__(error, trace)
        self.error, self.trace = error, trace

    def __str__(self) -> str:
        return self.error


# Inductor's compile workers per prepare process, at least. While all processes run, more workers than CPUs only
# share them; at the end, when a few long builds are left (run 14: mixnet_s's batch-1 compile alone for its last
# ~100 s, with 2 workers), each of those compiles its Triton kernels on more CPUs. ~0.4 GB a worker.
COMPILE_WORKERS = 4


def child_threads(jobs: int) -> int:
    """Threads for each of `jobs` prepare processes sharing this machine's CPUs."""
    return max(1, usable_cpus() // jobs)


def _prepare_in_child(entry: Entry, options: BenchOptions, quiet: bool, threads: int | None, part: str) -> float:
    from ..progress import Progress

    if threads is not None:
        # A process's share of the CPUs, for torch's own ops (random weights are calibrated on the CPU) and for
        # Inductor's compile workers: each process would otherwise start one thread and one worker per core.
        # Run 7's twelve processes of 16 threads each spent ~2 minutes just drawing random weights.
        import torch._inductor.config as inductor_config

        torch.set_num_threads(threads)
        if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
            inductor_config.compile_threads = max(COMPILE_WORKERS, threads)
    say = Progress(quiet)
    try:
        return prepare_entry(entry, options, lambda message: say(f"[prepare {entry.name}] {message}"), (part,))
    except Exception as exc:
        # The exception travels back to the parent pickled, and not every one pickles (run 14: swinv2's expert
        # compile failed and the parent saw only "cannot pickle 'module' object"): send its words and traceback.
        import traceback

        raise PrepareFailed(f"{type(exc).__name__}: {exc}", traceback.format_exc()) from None


def prepare_entries(
    entries: tuple[Entry, ...] | list[Entry],
    options: BenchOptions,
    jobs: int,
    progress: Progress = log_progress,
    *,
    quiet: bool = False,
    executor: Executor | None = None,
) -> dict[str, str]:
    """`prepare_entry` for every entry not prepared yet (with `options.reuse_bundles`: an earlier, cut-short
    prepare phase is taken up where it stopped), `jobs` processes at a time: each entry's build, then each
    entry's baselines, each part in a spawned process of its own with its share of the CPUs (the compiles are
    CPU-bound and hold the GIL; CUDA does not survive a fork). An entry is noted prepared once both its parts
    are done. Returns the error of each entry that failed; its timing then builds it again. `executor` replaces
    the process pool (its workers keep the caller's threads)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    done = [e.name for e in entries if options.reuse_bundles and is_prepared(e, options)]
    if done:
        progress(f"already prepared: {', '.join(done)}")
    todo = [e for e in entries if e.name not in done]
    parts = (BUILD, BASELINES)
    threads = None if executor is not None else child_threads(jobs)
    progress(f"preparing {len(todo)} entries ({' and '.join(parts)} in processes of their own), {jobs} at a time"
             + (f", {threads} threads each" if threads else ""))
    pool = executor or ProcessPoolExecutor(jobs, mp_context=get_context("spawn"))
    started = time.perf_counter()
    failures: dict[str, str] = {}
    left = {entry.name: set(parts) for entry in todo}
    seconds = {entry.name: 0.0 for entry in todo}
    by_name = {entry.name: entry for entry in todo}
    with pool:
        futures = {pool.submit(_prepare_in_child, entry, options, quiet, threads, part): (entry.name, part)
                   for part in parts for entry in todo}
        for future in as_completed(futures):
            name, part = futures[future]
            left[name].discard(part)
            try:
                seconds[name] += future.result()
            except Exception as exc:
                error = exc.error if isinstance(exc, PrepareFailed) else f"{type(exc).__name__}: {exc}"
                failures.setdefault(name, f"{part}: {error}")
                progress(f"preparing {name} ({part}) failed: {error}")
                if isinstance(exc, PrepareFailed):
                    progress("  where: " + " | ".join(exc.trace.strip().splitlines()[-5:-1]))
            if left[name]:
                continue
            # A failed entry is noted as prepared all the same: a failure is not retried by the next prepare phase
            # (its timing builds it again, and reports what fails there).
            error = failures.get(name)
            _write_prepared_note(options, by_name[name], 0.0 if error else seconds[name], error=error)
            if not error:
                progress(f"prepared {name} ({time.perf_counter() - started:.0f} s since the start)")
    return failures
