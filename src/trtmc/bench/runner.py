"""Running one entry: prepare every row, time them all together, then judge every row's answers.

The order inside an entry: the build, timm's fp32 answers on the oracle's photos (on the CPU, or those
the prepare phase left: `bench.answers`), then every row prepared (trtmc's engine and task scopes and each
baseline, at every batch size), its first call timed on its own (compile, graph capture); then all rows
timed together, round by round (`timing.time_interleaved`); then the oracle on every row, untimed; then,
where the entry asks for it, the folder scope (`bench.folder`: each side in a process of its own, after
this process let go of its models). A wrong trtmc row or folder pass fails the entry whatever its speed; a
wrong baseline is reported as wrong, with no ratio; a row that errors is recorded and the run goes on.

What is timed for trtmc is a `Target`; `Target.from_runtime` adapts a loaded bundle, and tests may
build one around any torch module (the `prepare` parameter) to exercise the harness without compiling.
"""

from __future__ import annotations

import gc
import json
import logging
import operator
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import __version__
from ..backends.inductor import compiling_in_process, describe_cache_use, graph_cache_counts
from ..preprocess import PreprocessSpec
from ..random_weights import load_timm_model, timm_pixels
from . import answers, oracle
from .baselines import make_baseline
from .folder import FolderJob, run_folder_scope, usable_cpus
from .results import ENGINE, TASK, TRTMC, BenchResult, EntryResult, FolderRun, Row
from .sources import ModelSource, resolve_source
from .spec import BASELINE_SPECS, BenchOptions, Entry
from .timing import (Clock, CudaEventClock, HostClock, HostLoad, HostMeter, HostSpeed, TimedCall, Timing, synchronize,
                     time_interleaved)

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
# (subject, scope, batch, device) -> the clock for that row; tests pass scripted clocks.
ClockFor = Callable[[str, str, int, str], Clock]


def default_clock_for(subject: str, scope: str, batch: int, device: str) -> Clock:
    """CUDA events for the engine scope on a GPU; the host clock otherwise (the task scope ends on the host)."""
    if scope == ENGINE and str(device).startswith("cuda"):
        return CudaEventClock()
    return HostClock(device)


def log_progress(message: str) -> None:
    log.info("%s", message)


@dataclass(frozen=True)
class Target:
    """trtmc as timed: the engine (device pixels -> float32 device logits) and the task around it."""

    engine: Callable[[torch.Tensor], torch.Tensor]
    task: Callable[[list], np.ndarray]  # host RGB float32 HWC arrays -> host float32 logits [N, classes]
    preprocess: PreprocessSpec  # turns the photos into the engine scope's pixels
    device: str
    input_dtype: torch.dtype = torch.float32
    batch_sizes: tuple[int, ...] | None = None  # the engine's compiled sizes; None: any batch up to max_batch
    max_batch: int | None = None
    key: str = ""
    build_seconds: float | None = None
    load_seconds: float | None = None
    bundle_bytes: int | None = None
    bundle: Path | None = None  # the bundle file, which the folder scope opens again in its own processes

    @classmethod
    def from_runtime(cls, runtime, **facts: Any) -> "Target":
        from ..backends.torch_lowering import TORCH_DTYPES
        from ..tasks import image_to_class_scores

        return cls(
            engine=runtime.engine,
            task=lambda images: image_to_class_scores(runtime, images).logits,
            preprocess=runtime.preprocess,
            device=runtime.device,
            input_dtype=TORCH_DTYPES[runtime.graph.inputs[0].type.dtype],
            batch_sizes=None if runtime.dynamic_batch else tuple(runtime.batch_sizes),
            max_batch=runtime.max_batch,
            key=runtime.choice.key,
            **facts,
        )

    def unserved(self, batch: int) -> str | None:
        """Why the engine cannot run `batch`, or None."""
        if self.batch_sizes is not None and batch not in self.batch_sizes:
            return f"the engine is compiled for batch sizes {list(self.batch_sizes)}, not {batch}"
        if self.max_batch is not None and batch > self.max_batch:
            return f"the engine serves batches up to {self.max_batch}, not {batch}"
        return None


def build_bundle_for(entry: Entry, source: ModelSource, options: BenchOptions, progress: Progress) -> tuple[Path, float]:
    """`trtmc build` for the entry on the bench device, timed; with `reuse_bundles`, the bundle (and
    its recorded build time) that a prepare phase left in the work folder."""
    from ..build import BuildRequest, build_bundle

    bundles = Path(options.workdir) / "bundles"
    bundles.mkdir(parents=True, exist_ok=True)
    request = BuildRequest(
        model=source.build_model,
        output=bundles / f"{entry.name}-{entry.precision}-{options.backend}.bundle",
        precision=entry.precision,
        device=options.device,
        backends=(options.backend,),
        max_batch=entry.max_batch,
    )
    record = request.output.with_suffix(".build.json")
    if options.reuse_bundles and record.is_file() and request.output.is_file():
        build_seconds = json.loads(record.read_text())["build_seconds"]
        progress(f"using the prepared bundle {request.output} (built in {build_seconds:.1f} s)")
        return request.output, build_seconds
    progress(f"building ({entry.precision}, {options.device}, max batch {entry.max_batch})")
    started = time.perf_counter()
    path = build_bundle(request, lambda message: progress(f"build: {message}"))
    build_seconds = time.perf_counter() - started
    record.write_text(json.dumps({"build_seconds": round(build_seconds, 2)}))
    progress(f"built in {build_seconds:.1f} s: {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return path, build_seconds


def build_target(entry: Entry, source: ModelSource, options: BenchOptions, progress: Progress) -> Target:
    """The entry's bundle built (or reused), loaded and warmed: every CUDA graph captured before timing."""
    from ..runtime import Runtime

    path, build_seconds = build_bundle_for(entry, source, options, progress)
    started, cache = time.perf_counter(), graph_cache_counts()
    runtime = Runtime.open(path, engine=options.backend)
    runtime.engine.warm_up()  # compile from the bundle's caches and capture one CUDA graph per size
    synchronize(runtime.device)
    load_seconds = time.perf_counter() - started
    progress(f"loaded {runtime.choice.key} in {load_seconds:.1f} s{describe_cache_use(cache)}")
    return Target.from_runtime(
        runtime, build_seconds=build_seconds, load_seconds=load_seconds, bundle_bytes=path.stat().st_size, bundle=path
    )


Prepare = Callable[[Entry, ModelSource, BenchOptions, Progress], Target]


@dataclass(frozen=True)
class Contender:
    """One row before it runs: the timed work (its input already in place), the oracle's question
    (every photo, in chunks of the row's batch size: logits [photos, classes]) and its clock."""

    subject: str
    label: str
    scope: str
    batch: int
    tolerance: float  # the oracle's, for this row's precision and input
    call: Callable[[], Any]
    answer: Callable[[], torch.Tensor]
    clock: Clock
    reference: oracle.Reference | None = None  # the row's own (its input path's noise added); else the entry's

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.subject, self.scope, self.batch)

    def failed(self, error: str, first_call_s: float | None = None) -> Row:
        return Row(self.subject, self.label, self.scope, self.batch, first_call_s=first_call_s, error=error)


@dataclass(frozen=True)
class Photos:
    """The oracle's photos in the three forms the rows take them."""

    files: tuple[Path, ...]
    timm_pixels: torch.Tensor  # timm's eval transform: the reference's and the baselines' input
    trtmc_pixels: torch.Tensor  # trtmc's preprocessing: the engine scope's input
    decoded: tuple[np.ndarray, ...]  # host RGB float32 HWC in [0, 1]: the task scope's input

    @classmethod
    def load(cls, files: tuple[Path, ...], folder: Path, preprocess: PreprocessSpec) -> "Photos":
        from PIL import Image

        trtmc, decoded = [], []
        for path in files:
            with Image.open(path) as image:
                rgb = image.convert("RGB")
            trtmc.append(preprocess.from_pil(rgb))
            decoded.append(np.asarray(rgb, dtype=np.float32) / np.float32(255.0))
        return cls(files, timm_pixels(folder, files), torch.stack(trtmc), tuple(decoded))


def _cycled(items, batch: int):
    """`batch` inputs drawn from the photos in turn: what a timed call is given."""
    if isinstance(items, torch.Tensor):
        return items[torch.arange(batch) % len(items)]
    return [items[i % len(items)] for i in range(batch)]


# An entry's rows in their order: a Contender to run, or the Row of one that cannot run.
Plan = list["Contender | Row"]


def _trtmc_plan(entry: Entry, target: Target, photos: Photos, task_ref: oracle.Reference, clock_for: ClockFor) -> Plan:
    plan: Plan = []
    label = f"trtmc {entry.precision}"
    device = target.device
    for batch in entry.batch_sizes:
        problem = target.unserved(batch)
        if problem is not None:
            plan.append(Row(TRTMC, label, ENGINE, batch, error=problem))
        else:
            x = _cycled(photos.trtmc_pixels, batch).to(device, target.input_dtype).contiguous()
            plan.append(Contender(
                TRTMC, label, ENGINE, batch, oracle.tolerance(entry.precision),
                call=lambda x=x: target.engine(x),
                answer=lambda b=batch: oracle.in_chunks(
                    lambda chunk: target.engine(chunk.to(device, target.input_dtype).contiguous()),
                    photos.trtmc_pixels, b, pad=True),
                clock=clock_for(TRTMC, ENGINE, batch, device),
            ))
        images = _cycled(list(photos.decoded), batch)
        plan.append(Contender(
            TRTMC, label, TASK, batch, oracle.tolerance(entry.precision, arrays_in=True),
            call=lambda images=images: target.task(images),
            answer=lambda b=batch: oracle.in_chunks(target.task, list(photos.decoded), b, pad=False),
            clock=clock_for(TRTMC, TASK, batch, device),
            reference=task_ref,
        ))
    return plan


def _baseline_plan(entry: Entry, options: BenchOptions, model, photos: Photos, clock_for: ClockFor) -> Plan:
    plan: Plan = []
    device = options.device
    for key in options.baselines:
        try:
            baseline = make_baseline(key, model, entry.precision, device)
        except Exception as exc:
            log.debug("baseline %s failed", key, exc_info=True)
            label = BASELINE_SPECS[key].label(entry.precision)
            plan += [Row(key, label, ENGINE, b, error=f"{type(exc).__name__}: {exc}") for b in entry.batch_sizes]
            continue
        for batch in entry.batch_sizes:
            x = baseline.prepare(_cycled(photos.timm_pixels, batch).to(device))
            plan.append(Contender(
                key, baseline.label, ENGINE, batch, oracle.tolerance(baseline.precision),
                call=lambda baseline=baseline, x=x: baseline(x),
                answer=lambda baseline=baseline, b=batch: oracle.in_chunks(
                    lambda chunk: baseline(baseline.prepare(chunk.to(device))), photos.timm_pixels, b, pad=True),
                clock=clock_for(key, ENGINE, batch, device),
            ))
    return plan


def _timm_at_precision(model, precision: str, photos: Photos, device: str) -> torch.Tensor:
    """timm's own answers on the photos at `precision`, eager on `device`: the oracle's noise."""
    eager = make_baseline("eager-fp32" if precision == "fp32" else "eager-cl", model, precision, device)
    with torch.no_grad():
        logits = eager(eager.prepare(photos.timm_pixels.to(device)))
    del eager
    free_device_memory(device)
    return logits


def answers_path(options: BenchOptions, entry: Entry) -> Path:
    """Where the prepare phase leaves an entry's `answers.TimmAnswers`."""
    return Path(options.workdir) / "timm-answers" / f"{entry.name}.pt"


def _timm_answers(entry: Entry, options: BenchOptions, source: ModelSource, timm_model, photos: Photos,
                  preprocess: PreprocessSpec, progress: Progress) -> answers.TimmAnswers:
    """timm fp32's answers on the CPU (the oracle's reference, and on the task's array pixels, which resizes float
    arrays where timm resizes 8-bit images): with `reuse_bundles`, those the prepare phase left for the same
    weights, photos and preprocessing; else computed here."""
    if options.reuse_bundles:
        kept = answers.TimmAnswers.load(answers_path(options, entry))
        if kept is not None and kept.answers_for(source.folder, photos.files, preprocess):
            progress("timm fp32's answers on the photos from the prepare phase")
            return kept
    return answers.compute(timm_model, source.folder, photos, preprocess)


def _first_call(contender: Contender, device: str) -> float:
    started = time.perf_counter()
    contender.call()
    synchronize(device)
    return time.perf_counter() - started


def _describe(row: Row) -> str:
    if row.status == "error":
        return f"error: {row.error}"
    t = row.timing
    text = f"{t.median_ms:.3f} ms (spread {t.spread:.1%}, {t.calls_per_round} calls per round"
    text += f", {t.attempts} attempts" if t.attempts > 1 else ""
    if t.host_speed:
        text += f", host speed after the last attempt {t.host_speed[-1]:.2f}"
    text += ")" if t.stable else "): unstable"
    if row.verdict is not None:
        text += f"; {row.verdict.describe()}"
    return text


def time_and_judge(
    plan: Plan, entry: Entry, ref: oracle.Reference, device: str, progress: Progress, host: HostSpeed | None = None
) -> tuple[list[Row], HostLoad | None]:
    """Each contender's first call (timed on its own), then all of them timed interleaved (`host` probing the
    host's speed after each attempt at the rows timed on it), then judged; the rows in the plan's order, and
    what the host's CPUs did during the rounds."""
    rows: dict[tuple, Row] = {}
    first_calls: dict[tuple, float] = {}
    ready = []
    started, cache = time.perf_counter(), graph_cache_counts()
    for c in plan:
        if isinstance(c, Row):
            progress(f"{c.label} {c.scope}, batch {c.batch}: {_describe(c)}")
            continue
        try:
            first_calls[c.key] = _first_call(c, device)
            ready.append(c)
        except Exception as exc:  # a crashing row is a result to report, not the end of the entry
            log.debug("%s %s batch %d failed", c.label, c.scope, c.batch, exc_info=True)
            rows[c.key] = c.failed(f"{type(exc).__name__}: {exc}")
            progress(f"{c.label} {c.scope}, batch {c.batch}: {_describe(rows[c.key])}")
    progress(f"first calls of {len(ready)} rows in {time.perf_counter() - started:.1f} s{describe_cache_use(cache)}; "
             "timing them interleaved, round by round")
    meter = HostMeter().start()
    outcome = time_interleaved({c.key: TimedCall(c.call, c.clock) for c in ready}, entry.protocol, host)
    host = meter.stop()
    if host is not None:
        progress(f"the CPUs while timing: {host.busy:.0%} busy, {host.others:.0%} of it not this process, "
                 f"{host.steal:.0%} stolen by the hypervisor")
    for c in ready:
        first = first_calls[c.key]
        if c.key in outcome.errors:
            rows[c.key] = c.failed(outcome.errors[c.key], first)
        else:
            rows[c.key] = _judged(c, outcome.timings[c.key], first, ref)
        progress(f"{c.label} {c.scope}, batch {c.batch}: {_describe(rows[c.key])}")
    return [c if isinstance(c, Row) else rows[c.key] for c in plan], host


def _judged(c: Contender, timing: Timing, first_call_s: float, ref: oracle.Reference) -> Row:
    try:
        verdict = oracle.judge(c.answer(), c.reference or ref, c.tolerance)
    except Exception as exc:
        log.debug("the oracle's run of %s %s batch %d failed", c.label, c.scope, c.batch, exc_info=True)
        return c.failed(f"answering the oracle: {type(exc).__name__}: {exc}", first_call_s)
    return Row(c.subject, c.label, c.scope, c.batch, timing, first_call_s, verdict)


def free_device_memory(device: str) -> None:
    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


def unsupported_reason(architecture: str, precision: str) -> str | None:
    from ..families import UnsupportedModel, find_family

    try:
        family, _ = find_family(architecture)
    except UnsupportedModel as exc:
        return str(exc)
    if precision not in family.precisions:
        return f"{architecture} ({family.name}) supports precisions {', '.join(family.precisions)}, not {precision}"
    return None


def _folder_job(entry: Entry, options: BenchOptions, source: ModelSource, target: Target) -> FolderJob | None:
    if entry.folder is None:
        return None
    if target.bundle is None:
        raise ValueError(f"the folder scope opens the entry's bundle file, and {target.key or 'this engine'} came "
                         "without one; prepare the entry with build_target")
    return FolderJob(entry.folder, target.bundle, options.backend, source.folder, entry.precision, options.device,
                     entry.max_batch, Path(options.workdir))


def run_entry(
    entry: Entry,
    options: BenchOptions,
    *,
    prepare: Prepare = build_target,
    clock_for: ClockFor = default_clock_for,
    progress: Progress = log_progress,
    host: HostSpeed | None = None,
) -> EntryResult:
    """Build, time and judge one entry; every failure becomes the entry's status, never an exception. `host`
    (one per run: it learns the host's full speed) probes the host after each attempt at the rows timed on it."""
    facts: dict[str, Any] = {"margin": entry.protocol.margin}
    try:
        files = oracle.photo_files(entry.photos)
        progress(f"checkpoint: {entry.model} ({entry.weights} weights)")
        source = resolve_source(entry.model, entry.weights, options.workdir, entry.seed, files)
        facts.update(architecture=source.architecture, weights=source.weights)
        unsupported = unsupported_reason(source.architecture, entry.precision)
        if unsupported:
            progress(f"skipped: {unsupported}")
            return EntryResult(entry, "unsupported", unsupported, **facts)
        timm_model = load_timm_model(source.folder)
        with torch.no_grad():
            target = prepare(entry, source, options, progress)
            folder_job = _folder_job(entry, options, source, target)
            facts.update(
                engine_key=target.key,
                build_seconds=target.build_seconds,
                load_seconds=target.load_seconds,
                bundle_bytes=target.bundle_bytes,
            )
            photos = Photos.load(files, source.folder, target.preprocess)
            timm_answers = _timm_answers(entry, options, source, timm_model, photos, target.preprocess, progress)
            ref = oracle.Reference(tuple(p.name for p in files), timm_answers.reference)
            model = timm_model.to(options.device).eval()  # after the CPU's answers, which the prepare may have left
            ref = ref.with_noise(_timm_at_precision(model, entry.precision, photos, options.device))
            task_ref = ref.with_noise(timm_answers.on_array_pixels)
            facts["reference"] = ref
            progress(f"timm fp32 answers on {len(files)} photos (and timm {entry.precision}'s noise): the oracle's reference")
            plan = _trtmc_plan(entry, target, photos, task_ref, clock_for)
            plan += _baseline_plan(entry, options, model, photos, clock_for)
            rows, facts["host"] = time_and_judge(plan, entry, ref, options.device, progress, host)
            del plan, target, model
        del timm_model
        free_device_memory(options.device)
        folder_runs = () if folder_job is None else run_folder_scope(folder_job, files, ref, progress)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        log.debug("%s failed", entry.name, exc_info=True)
        progress(f"error: {type(exc).__name__}: {exc}")
        return EntryResult(entry, "error", f"{type(exc).__name__}: {exc}", **facts)

    status, message = entry_status(rows, folder_runs)
    progress(f"{status}{': ' + message if message else ''}")
    return EntryResult(entry, status, message, rows=tuple(rows), folder_runs=folder_runs, **facts)


def entry_status(rows: list[Row], folder_runs: tuple[FolderRun, ...] = ()) -> tuple[str, str]:
    """(status, message) of an entry from trtmc's rows and folder passes: failed on a wrong answer,
    error where one could not run, else passed; the baselines' rows never fail an entry."""
    ours = [(f"trtmc {r.scope} batch {r.batch}", r) for r in rows if r.subject == TRTMC]
    ours += [(f"trtmc folder of {run.images} images", run.trtmc) for run in folder_runs]
    wrong = [(what, r) for what, r in ours if r.status == "wrong"]
    if wrong:
        return "failed", "wrong answer: " + "; ".join(f"{what}: {r.verdict.describe()}" for what, r in wrong)
    broken = [(what, r) for what, r in ours if r.status == "error"]
    if broken:
        return "error", "; ".join(f"{what}: {r.error}" for what, r in broken)
    return "passed", ""


def source_digest() -> str:
    """A digest of trtmc's own source files (each one's path and code, in path order): which code produced a result,
    whatever a machine's git says. The same call on a checkout gives the same digest (on Python 3.10 to 3.13 alike).
    The code is the file without its comments and blank lines (`code_text`), so that correcting a comment after a
    bench keeps its records good for `--resume`."""
    import hashlib

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        code = code_text(path.read_text(encoding="utf-8"))
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + code.encode() + b"\0")
    return digest.hexdigest()[:16]


def code_text(source: str) -> str:
    """Python source without its comments, trailing spaces and blank lines: what runs, as text. Comments are found
    by the tokenizer, so a `#` inside a string stays."""
    import io
    import tokenize

    lines = source.split("\n")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            lines[row - 1] = lines[row - 1][:column]
    return "\n".join(line.rstrip() for line in lines if line.strip())


def environment(device: str) -> dict[str, Any]:
    """What the numbers were measured on, and by which code (so `--resume` never mixes two codes)."""
    env: dict[str, Any] = {
        "trtmc": __version__,
        "trtmc_source": source_digest(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.machine()} {' '.join(platform.libc_ver())}".strip(),
        "host_kernel": platform.release(),
        "device": device,
        # os.cpu_count() counts the host's CPUs; a container may let this process use fewer.
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
    }
    try:
        import timm

        env["timm"] = timm.__version__
    except ImportError:
        pass
    if str(device).startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            device_name=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
            matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
        )
    else:
        env["device_name"] = platform.processor() or platform.machine() or "cpu"
        env["threads"] = torch.get_num_threads()
    return env


RECORDS = "timed"  # the workdir folder of finished entries' records, which --resume reads

# What a record may differ in from the run that takes it, the report listing every value: the lent GPU machines'
# host kernel changed between two sessions while the GPU, its software and the code stayed (run 31 refused all 34
# of run 30's records for it alone).
HOST_DETAILS = ("host_kernel",)


def same_machine(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two environments are one code on one machine and versions, but for `HOST_DETAILS`."""
    def kept(env: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in env.items() if k not in HOST_DETAILS}
    return kept(a) == kept(b)


def _listing_hosts(env: dict[str, Any], envs: list[dict[str, Any]]) -> dict[str, Any]:
    """`env` with each of `HOST_DETAILS` listing every value that it and `envs` hold, for a report of records."""
    return {**env, **{detail: ", ".join(sorted({str(e.get(detail)) for e in [env, *envs]})) for detail in HOST_DETAILS}}


def _record_path(workdir: Path, entry: Entry) -> Path:
    return Path(workdir) / RECORDS / f"{entry.name}.pickle"


def _timed_with(options: BenchOptions) -> tuple:
    """The options that change what an entry's rows are."""
    return options.device, options.backend, tuple(options.baselines)


def _save_record(options: BenchOptions, result: EntryResult, env: dict[str, Any], started_at: str) -> None:
    """A finished entry's result, with the environment and the start of the run that timed it."""
    import pickle

    from ..files import write_bytes_atomically

    path = _record_path(options.workdir, result.entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"result": result, "environment": env, "options": _timed_with(options), "started": started_at}
    write_bytes_atomically(path, pickle.dumps(record))


def _read_record(workdir: Path, entry: Entry) -> dict[str, Any] | None:
    """The record a run left for `entry`'s name in `workdir`: None if there is none or it does not unpickle (a
    record of another trtmc version)."""
    import pickle

    path = _record_path(workdir, entry)
    if not path.is_file():
        return None
    try:
        return pickle.loads(path.read_bytes())
    except Exception:
        log.debug("unreadable record %s", path, exc_info=True)
        return None


def _resumed_record(options: BenchOptions, entry: Entry, env: dict[str, Any]) -> dict[str, Any] | None:
    """The record of the result an earlier run timed for `entry` in this workdir (its result, environment and
    start), if the entry is the same (model, precision, batch sizes, protocol...), and so are the environment
    (machine, versions: `same_machine`) and the options that make its rows (device, backend, baselines); None
    otherwise."""
    record = _read_record(options.workdir, entry)
    if record is None:
        return None  # time the entry again
    if (record["result"].entry, record["options"]) != (entry, _timed_with(options)):
        return None
    return record if same_machine(record["environment"], env) else None


def recorded_entries(entries: tuple[Entry, ...] | list[Entry], workdir: Path) -> list[Entry]:
    """Those of `entries` that have a record in `workdir`, in their order: the part of a bench cut short that a
    report can hold (`recorded_result` then checks each record)."""
    return [entry for entry in entries if _record_path(workdir, entry).is_file()]


def recorded_result(entries: tuple[Entry, ...] | list[Entry], workdir: Path) -> BenchResult:
    """The report of `entries` from their records in `workdir` alone, as on the machine that timed them (its
    environment, its options): for a bench whose last call ran out of time before its report. Nothing is timed or
    judged again. Every entry needs a record of that very entry, and all records one environment and one set of
    options; a ValueError says which ones do not."""
    started, clock = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
    records = {}
    for entry in entries:
        record = _read_record(workdir, entry)
        if record is None:
            raise ValueError(f"{entry.name} has no record in {Path(workdir) / RECORDS} that this code reads: "
                             "time it first")
        if record["result"].entry != entry:
            raise ValueError(f"{entry.name}'s record is of another definition of the entry: time it again")
        records[entry.name] = record
    first = next(iter(records.values()))
    for key, same in (("environment", same_machine), ("options", operator.eq)):
        differ = [name for name, record in records.items() if not same(record[key], first[key])]
        if differ:
            raise ValueError(f"records differ in {key} ({', '.join(differ)} against {entries[0].name}): "
                             "one report holds one code on one machine with one set of options")
    env = _listing_hosts(first["environment"], [r["environment"] for r in records.values()])
    device, backend, baselines = first["options"]
    options = BenchOptions(workdir=Path(workdir), device=device, baselines=baselines, backend=backend, resume=True)
    return BenchResult(env, options, tuple(r["result"] for r in records.values()), started,
                       time.perf_counter() - clock, {name: r["started"] for name, r in records.items()})


def run_bench(
    entries: tuple[Entry, ...] | list[Entry],
    options: BenchOptions,
    *,
    prepare: Prepare = build_target,
    clock_for: ClockFor = default_clock_for,
    progress: Progress = log_progress,
    on_result: Callable[[BenchResult], None] | None = None,
) -> BenchResult:
    """Every entry in turn (one failing never stops the others); `on_result` sees the results so
    far after each entry timed here, so a run cut short still leaves its finished rows behind. Each finished
    entry is also recorded in the workdir; with `options.resume`, an entry recorded there by an earlier
    run on the same machine and versions is taken from its record instead of timed again, so a long
    bench can run as several shorter ones."""
    options.validate()
    Path(options.workdir).mkdir(parents=True, exist_ok=True)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    started = time.perf_counter()
    env = environment(options.device)
    results, resumed, resumed_envs = [], {}, []
    host = HostSpeed()

    def so_far() -> BenchResult:
        return BenchResult(_listing_hosts(env, resumed_envs), options, tuple(results), started_at,
                           time.perf_counter() - started, dict(resumed))

    # Every compile here (the baselines' first calls, trtmc's engines from their caches) runs in this process:
    # a pool of compile workers would start a process per core beside the rounds, and stop and start again
    # between entries. After a prepare phase the caches answer; without one, cold compiles are slower.
    with compiling_in_process():
        for index, entry in enumerate(entries, 1):
            prefix = f"[{index}/{len(entries)} {entry.name}]"
            earlier = _resumed_record(options, entry, env) if options.resume else None
            if earlier is not None:
                results.append(earlier["result"])
                resumed[entry.name] = earlier["started"]
                resumed_envs.append(earlier["environment"])
                progress(f"{prefix} {earlier['result'].status}: timed by the run started {earlier['started']} "
                         "(--resume)")
            else:
                results.append(run_entry(entry, options, prepare=prepare, clock_for=clock_for,
                                         progress=lambda m, p=prefix: progress(f"{p} {m}"), host=host))
                _save_record(options, results[-1], env, started_at)
                if on_result is not None:  # a resumed entry is safe in its record: the final report lists it
                    on_result(so_far())
    return so_far()
