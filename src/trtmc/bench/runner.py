"""Running one entry: build, time trtmc in both scopes, time the baselines, then judge the answers.

The order inside an entry is fixed: timm's fp32 reference on the CPU (the oracle's answer), the
build, trtmc's engine and task scopes at every batch size, then each baseline at every batch size
(compiled baselines one at a time, so their caches never mix). Argmax and finiteness are read from
each row's last output only after its timing is done. A trtmc top class that differs from timm's
fails the entry whatever its speed; a row that errors is recorded and the run goes on.

What is timed for trtmc is a `Target`; `Target.from_runtime` adapts a loaded bundle, and tests may
build one around any torch module to exercise the harness without compiling.
"""

from __future__ import annotations

import gc
import json
import logging
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import __version__
from ..preprocess import PreprocessSpec
from .baselines import describe, make_baseline
from .spec import BASELINES, DEFAULT_BASELINES, Entry, SpecError, TimingProtocol
from .timing import ENGINE, TASK, Timer, Timing, default_timer, synchronize, time_row
from .weights import ModelSource, Reference, load_timm_model, reference, resolve_source

log = logging.getLogger(__name__)

TRTMC = "trtmc"
REPO_PHOTO = Path(__file__).resolve().parents[3] / "examples" / "images" / "chelsea.png"

Progress = Callable[[str], None]
# (subject, scope, batch, device) -> the timer for that row; tests pass scripted timers.
TimerFor = Callable[[str, str, int, str], Timer]


def _default_timer_for(subject: str, scope: str, batch: int, device: str) -> Timer:
    return default_timer(scope, device)


def _quiet(message: str) -> None:
    log.info("%s", message)


@dataclass(frozen=True)
class BenchOptions:
    workdir: Path  # random-weight checkpoints and bundles go here
    device: str = "cuda"
    baselines: tuple[str, ...] = DEFAULT_BASELINES
    reuse_bundles: bool = False  # use bundles (and their recorded build times) from a prepare phase

    def validate(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise SpecError(f"--device {self.device!r}: choose cuda or cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise SpecError(
                "--device cuda: PyTorch sees no CUDA GPU here; pass --device cpu to exercise the harness "
                "(its times are then CPU times)"
            )
        for key in self.baselines:
            if key not in BASELINES:
                raise SpecError(f"--baseline {key!r}: choose from {', '.join(BASELINES)}")


@dataclass(frozen=True)
class Target:
    """trtmc as timed: the engine (device pixels -> float32 device logits) and the task around it."""

    engine: Callable[[torch.Tensor], torch.Tensor]
    task: Callable[[list], np.ndarray]  # image files -> host float32 logits [N, classes]
    preprocess: PreprocessSpec  # turns the photo into the engine scope's pixels
    device: str
    input_dtype: torch.dtype = torch.float32
    batch_sizes: tuple[int, ...] | None = None  # the engine's compiled sizes; None: any batch up to max_batch
    max_batch: int | None = None
    key: str = ""
    build_seconds: float | None = None
    load_seconds: float | None = None
    bundle_bytes: int | None = None

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
            max_batch=getattr(runtime, "max_batch", None),
            key=runtime.choice.key,
            **facts,
        )


def build_target(entry: Entry, source: ModelSource, options: BenchOptions, progress: Progress) -> Target:
    """`trtmc build` for the entry on the bench device (timed), then the bundle loaded and warmed."""
    from ..build import BuildRequest, build_bundle
    from ..runtime import Runtime

    bundles = Path(options.workdir) / "bundles"
    bundles.mkdir(parents=True, exist_ok=True)
    request = BuildRequest(
        model=source.build_model,
        output=bundles / f"{entry.name}-{entry.precision}.bundle",
        precision=entry.precision,
        device=options.device,
        max_batch=entry.max_batch,
    )
    record = request.output.with_suffix(".build.json")
    if options.reuse_bundles and record.is_file() and request.output.is_file():
        path = request.output
        build_seconds = json.loads(record.read_text())["build_seconds"]
        progress(f"using the prepared bundle {path} (built in {build_seconds:.1f} s)")
    else:
        progress(f"building ({entry.precision}, {options.device}, max batch {entry.max_batch})")
        started = time.perf_counter()
        path = build_bundle(request, lambda message: progress(f"build: {message}"))
        build_seconds = time.perf_counter() - started
        record.write_text(json.dumps({"build_seconds": round(build_seconds, 2)}))
    progress(f"built in {build_seconds:.1f} s: {path} ({path.stat().st_size / 1e6:.1f} MB)")
    started = time.perf_counter()
    runtime = Runtime.open(path, engine="inductor")
    warm_up = getattr(runtime.engine, "warm_up", None)
    if warm_up is not None:  # compile from the bundle's caches and capture one CUDA graph per size
        warm_up()
    synchronize(runtime.device)
    load_seconds = time.perf_counter() - started
    progress(f"loaded {runtime.choice.key} in {load_seconds:.1f} s")
    return Target.from_runtime(
        runtime, build_seconds=build_seconds, load_seconds=load_seconds, bundle_bytes=path.stat().st_size
    )


Prepare = Callable[[Entry, ModelSource, BenchOptions, Progress], Target]


@dataclass(frozen=True)
class Row:
    """One subject timed at one batch size in one scope."""

    subject: str  # "trtmc" or a baseline key
    label: str
    scope: str  # "engine" or "task"
    batch: int
    timing: Timing | None = None
    first_call_s: float | None = None  # the untimed first call: compile / graph capture for compiled subjects
    top_classes: tuple[int, ...] = ()  # distinct argmax over the batch's rows (every row is the photo)
    finite: bool | None = None
    error: str | None = None

    @property
    def status(self) -> str:
        if self.error is not None or self.timing is None:
            return "error"
        return "ok" if self.timing.stable else "unstable"

    @property
    def median_ms(self) -> float | None:
        """The result, or None when the row is not one (unstable or errored)."""
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
            "top_classes": list(self.top_classes),
            "finite": self.finite,
            "error": self.error,
            "timing": None if self.timing is None else self.timing.to_json(),
        }


@dataclass(frozen=True)
class EntryResult:
    entry: Entry
    status: str  # passed | failed (wrong answer) | error | unsupported
    message: str = ""
    architecture: str | None = None
    weights: str | None = None
    engine_key: str | None = None
    build_seconds: float | None = None
    load_seconds: float | None = None
    bundle_bytes: int | None = None
    reference: Reference | None = None
    oracle_failures: tuple[str, ...] = ()
    rows: tuple[Row, ...] = ()
    margin: float = 0.05

    def row(self, subject: str, scope: str, batch: int) -> Row | None:
        return next((r for r in self.rows if (r.subject, r.scope, r.batch) == (subject, scope, batch)), None)

    def subjects(self) -> list[str]:
        return list(dict.fromkeys(r.subject for r in self.rows))

    def ratio(self, baseline: str, batch: int) -> float | None:
        """baseline ms / trtmc engine ms: the headline; None unless both rows are results and the answer was right."""
        if self.status != "passed":
            return None
        ours, theirs = self.row(TRTMC, ENGINE, batch), self.row(baseline, ENGINE, batch)
        if ours is None or theirs is None or ours.median_ms is None or theirs.median_ms is None:
            return None
        return theirs.median_ms / ours.median_ms

    def verdict(self, ratio: float) -> str:
        if ratio > 1 + self.margin:
            return "faster"
        if ratio < 1 - self.margin:
            return "slower"
        return "on par"

    def first_call_seconds(self, subject: str) -> dict[int, float]:
        return {r.batch: r.first_call_s for r in self.rows if r.subject == subject and r.scope == ENGINE and r.first_call_s is not None}


def _photo(entry: Entry) -> Path:
    if entry.photo is not None:
        return Path(entry.photo)
    if REPO_PHOTO.is_file():
        return REPO_PHOTO
    raise SpecError(f"{entry.name}: no photo given and {REPO_PHOTO} is not here; pass --photo FILE or set 'photo:'")


def _logits(output: Any) -> torch.Tensor:
    tensor = torch.from_numpy(output) if isinstance(output, np.ndarray) else output
    return tensor.detach().float().reshape(tensor.shape[0], -1).cpu()


def time_subject(
    subject: str,
    label: str,
    scope: str,
    batch: int,
    fn: Callable[[], Any],
    protocol: TimingProtocol,
    timer: Timer,
    device: str,
) -> Row:
    """The first call (timed on its own), the protocol, then the answer read from the last output."""
    try:
        started = time.perf_counter()
        fn()
        synchronize(device)
        first_call_s = time.perf_counter() - started
        timing, output = time_row(fn, protocol, timer, lambda: synchronize(device))
        logits = _logits(output)
        return Row(
            subject,
            label,
            scope,
            batch,
            timing,
            first_call_s,
            tuple(sorted(set(logits.argmax(-1).tolist()))),
            bool(torch.isfinite(logits).all()),
        )
    except Exception as exc:  # a crashing subject is a result to report, not the end of the run
        log.debug("%s %s batch %d failed", label, scope, batch, exc_info=True)
        return Row(subject, label, scope, batch, error=f"{type(exc).__name__}: {exc}")


def _describe_row(row: Row) -> str:
    if row.status == "error":
        return f"error: {row.error}"
    t = row.timing
    text = f"{t.median_ms:.3f} ms (spread {t.spread:.1%}"
    text += ", re-run" if t.attempts > 1 else ""
    text += ")" if t.stable else "): unstable"
    return text


def _oracle(ref: Reference, rows: list[Row]) -> list[str]:
    failures = []
    for row in rows:
        if row.subject != TRTMC or row.scope != ENGINE or row.status == "error":
            continue
        where = f"{row.scope} scope, batch {row.batch}"
        if not row.finite:
            failures.append(f"{where}: non-finite logits")
        if row.top_classes != (ref.top_class,):
            got = ", ".join(str(c) for c in row.top_classes)
            failures.append(f"{where}: top class {got} where timm's is {ref.top_class}")
    return failures


def _free(device: str) -> None:
    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


def run_entry(
    entry: Entry,
    options: BenchOptions,
    *,
    prepare: Prepare = build_target,
    timer_for: TimerFor = _default_timer_for,
    progress: Progress = _quiet,
) -> EntryResult:
    """Build, time and judge one entry; every failure becomes the entry's status, never an exception."""
    facts: dict[str, Any] = {"margin": entry.protocol.margin}
    try:
        photo = _photo(entry)
        progress(f"checkpoint: {entry.model} ({entry.weights} weights)")
        source = resolve_source(entry.model, entry.weights, options.workdir, entry.seed)
        facts.update(architecture=source.architecture, weights=source.weights)
        unsupported = _unsupported(source.architecture, entry.precision)
        if unsupported:
            progress(f"skipped: {unsupported}")
            return EntryResult(entry, "unsupported", unsupported, **facts)
        timm_model = load_timm_model(source.folder)
        ref = reference(timm_model, source.folder, photo)
        facts["reference"] = ref
        progress(f"timm fp32 top class on {photo.name}: {ref.top_class} (top-2 gap {ref.gap:.3g})")
        with torch.no_grad():
            target = prepare(entry, source, options, progress)
            facts.update(
                engine_key=target.key,
                build_seconds=target.build_seconds,
                load_seconds=target.load_seconds,
                bundle_bytes=target.bundle_bytes,
            )
            from PIL import Image

            with Image.open(photo) as image:
                pixels = target.preprocess.from_pil(image).unsqueeze(0)
            rows = _time_trtmc(entry, target, pixels, photo, timer_for, progress)
            del target
            _free(options.device)
            rows += _time_baselines(entry, options, timm_model, pixels, timer_for, progress)
        del timm_model
        _free(options.device)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        log.debug("%s failed", entry.name, exc_info=True)
        progress(f"error: {type(exc).__name__}: {exc}")
        return EntryResult(entry, "error", f"{type(exc).__name__}: {exc}", **facts)

    failures = _oracle(ref, rows)
    broken = [r for r in rows if r.subject == TRTMC and r.status == "error"]
    if failures:
        status = "failed"
        message = "wrong answer: " + "; ".join(failures) + f" (timm's top-2 logit gap on the photo: {ref.gap:.3g})"
    elif broken:
        status, message = "error", "; ".join(f"trtmc {r.scope} batch {r.batch}: {r.error}" for r in broken)
    else:
        status, message = "passed", ""
    progress(f"{status}{': ' + message if message else ''}")
    return EntryResult(entry, status, message, oracle_failures=tuple(failures), rows=tuple(rows), **facts)


def source_input_size(folder: Path) -> tuple[int, int, int]:
    from ..checkpoint import Checkpoint

    return Checkpoint(folder).config.pretrained.input_size


def prepare_entry(entry: Entry, options: BenchOptions, progress: Progress = _quiet) -> None:
    """The slow, CPU-bound part of an entry, so several can run in parallel before timing: random
    weights, the trtmc build (its time recorded beside the bundle) and the cold compiles of the
    torch.compile baselines, which fill Inductor's on-disk caches for the timed run."""
    source = resolve_source(entry.model, entry.weights, options.workdir, entry.seed)
    if _unsupported(source.architecture, entry.precision):
        return
    with torch.no_grad():
        build_target(entry, source, options, progress)
        _free(options.device)
        compiled = [k for k in options.baselines if k in ("reduce-overhead", "max-autotune")]
        if not compiled:
            return
        timm_model = load_timm_model(source.folder).to(options.device)
        pixels = torch.zeros((1,) + tuple(source_input_size(source.folder)))
        for key in compiled:
            baseline = make_baseline(key, timm_model, entry.precision, options.device)
            for batch in entry.batch_sizes:
                x = baseline.prepare(pixels.expand(batch, -1, -1, -1).to(options.device))
                for _ in range(3):
                    baseline.call(x)
                synchronize(options.device)
                progress(f"prepared {key} batch {batch}")


def _unsupported(architecture: str, precision: str) -> str | None:
    from ..families import UnsupportedModel, find_family

    try:
        family, _ = find_family(architecture)
    except UnsupportedModel as exc:
        return str(exc)
    if precision not in family.precisions:
        return f"{architecture} ({family.name}) supports precisions {', '.join(family.precisions)}, not {precision}"
    return None


def _time_trtmc(entry, target: Target, pixels, photo: Path, timer_for: TimerFor, progress: Progress) -> list[Row]:
    from PIL import Image

    with Image.open(photo) as image:
        decoded = np.asarray(image.convert("RGB"), dtype=np.float32) / np.float32(255.0)
    rows = []
    label = f"trtmc {entry.precision}"
    for batch in entry.batch_sizes:
        if target.batch_sizes is not None and batch not in target.batch_sizes:
            error = f"the engine is compiled for batch sizes {list(target.batch_sizes)}, not {batch}"
            row = Row(TRTMC, label, ENGINE, batch, error=error)
        elif target.max_batch is not None and batch > target.max_batch:
            row = Row(TRTMC, label, ENGINE, batch, error=f"the engine serves batches up to {target.max_batch}, not {batch}")
        else:
            x = pixels.expand(batch, -1, -1, -1).to(target.device, target.input_dtype).contiguous()
            row = time_subject(
                TRTMC, label, ENGINE, batch, lambda: target.engine(x), entry.protocol,
                timer_for(TRTMC, ENGINE, batch, target.device), target.device,
            )
            del x
        progress(f"{label} engine, batch {batch}: {_describe_row(row)}")
        rows.append(row)
        # Host RGB float32 arrays in [0, 1]: preprocessing, transfer, inference and the copy back are
        # timed; decoding the JPEG is not (it is the caller's, and would dominate at batch 128).
        images = [decoded] * batch
        row = time_subject(
            TRTMC, label, TASK, batch, lambda: target.task(images), entry.protocol,
            timer_for(TRTMC, TASK, batch, target.device), target.device,
        )
        progress(f"{label} task, batch {batch}: {_describe_row(row)}")
        rows.append(row)
    return rows


def _time_baselines(entry, options: BenchOptions, timm_model, pixels, timer_for: TimerFor, progress: Progress) -> list[Row]:
    rows = []
    device = options.device
    model = timm_model.to(device).eval()
    for key in options.baselines:
        label = describe(key, entry.precision)
        try:
            baseline = make_baseline(key, model, entry.precision, device)
        except Exception as exc:
            log.debug("baseline %s failed", key, exc_info=True)
            for batch in entry.batch_sizes:
                rows.append(Row(key, label, ENGINE, batch, error=f"{type(exc).__name__}: {exc}"))
            progress(f"{label}: error: {exc}")
            continue
        for batch in entry.batch_sizes:
            x = baseline.prepare(pixels.expand(batch, -1, -1, -1).to(device))
            row = time_subject(
                key, label, ENGINE, batch, lambda: baseline.call(x), entry.protocol,
                timer_for(key, ENGINE, batch, device), device,
            )
            del x
            suffix = f", first call {row.first_call_s:.1f} s" if row.first_call_s and row.first_call_s > 1 else ""
            progress(f"{label}, batch {batch}: {_describe_row(row)}{suffix}")
            rows.append(row)
        del baseline
        _free(device)
    timm_model.cpu()
    return rows


def environment(device: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    env: dict[str, Any] = {
        "trtmc": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
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


@dataclass(frozen=True)
class BenchResult:
    environment: dict[str, Any]
    options: BenchOptions
    entries: tuple[EntryResult, ...]
    started: str
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(e.status == "passed" for e in self.entries)


def run_bench(
    entries: tuple[Entry, ...] | list[Entry],
    options: BenchOptions,
    *,
    prepare: Prepare = build_target,
    timer_for: TimerFor = _default_timer_for,
    progress: Progress = _quiet,
    on_result: Callable[[BenchResult], None] | None = None,
) -> BenchResult:
    """Every entry in turn (one failing never stops the others); `on_result` sees the results so
    far after each entry, so a run cut short still leaves its finished rows behind."""
    options.validate()
    Path(options.workdir).mkdir(parents=True, exist_ok=True)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    started = time.perf_counter()
    results = []
    for index, entry in enumerate(entries, 1):
        prefix = f"[{index}/{len(entries)} {entry.name}]"
        results.append(
            run_entry(entry, options, prepare=prepare, timer_for=timer_for, progress=lambda m, p=prefix: progress(f"{p} {m}"))
        )
        if on_result is not None:
            on_result(BenchResult(environment(options.device), options, tuple(results), started_at,
                                  time.perf_counter() - started))
    return BenchResult(environment(options.device), options, tuple(results), started_at, time.perf_counter() - started)
