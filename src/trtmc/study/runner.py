"""Running a study: every variant built from one checkpoint, then timed, profiled and judged in one process.

The order: the images split (calibration apart from held-out); the checkpoint (random weights are
calibrated on the calibration images, never on the held-out ones); timm fp32's answers on the held-out
images (the bench oracle's reference); the float32 graph, batch norms folded, calibrated once for every
quantized precision; every variant built (`trtmc.build.write_build`, one bundle per largest batch size
its engine must serve: a CUDA inductor engine serves batch 1 and its largest only; with `jobs` > 1,
`jobs` bundles at a time, each in a spawned process); then every engine
loaded and warmed (builds reset Inductor's state, so none is loaded before all are built); every row
(variant x batch size) timed together, round by round, with the bench protocol and clocks; then,
untimed, the CUDA kernels of one call per row, quality and the non-finite scan per row, and the
decisions. A variant that fails to build, load or answer is recorded with its error; the others go on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from ..bench import oracle
from ..bench.results import ENGINE, Row
from ..bench.runner import Photos, Target, default_clock_for, environment
from ..bench.sources import resolve_source
from ..bench.timing import TimedCall, synchronize, time_interleaved
from ..build import RECIPES, BuildRequest, PreparedGraph, Quantization, computed_in, prepare_graph, write_build
from ..bundle import read_bundle
from ..checkpoint import open_checkpoint
from ..families import find_family
from ..passes.precision import PrecisionPolicy, assign_precision
from ..passes.quantize import choose_layers
from ..precision import QUANTIZED_FORMATS
from ..quantization import CalibrationScales, calibrate_images
from ..random_weights import load_timm_model
from ..runtime import Runtime
from . import quality
from .decision import Decision, decide
from .request import REFERENCE, ImageSplit, StudyRequest, split_images
from .results import BundleFacts, RecipeFacts, StudyResult, VariantResult

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
# Chunk of images timm fp32 classifies at a time for the reference (on the CPU, whatever the device).
REFERENCE_CHUNK = 32


def _quiet(message: str) -> None:
    log.info("%s", message)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ---- before the builds ----------------------------------------------------------------------------


def timm_reference(folder: Path, photos: Photos) -> oracle.Reference:
    """timm fp32 eager on the CPU on the held-out images, in chunks (the bench oracle's reference)."""
    model = load_timm_model(folder).float().cpu().eval()
    with torch.no_grad():
        logits = oracle.in_chunks(model, photos.timm_pixels, REFERENCE_CHUNK, pad=False)
    return oracle.Reference(tuple(p.name for p in photos.files), logits.double())


def recipe_facts(prepared: PreparedGraph, precision: str, scales: CalibrationScales) -> RecipeFacts:
    """What `precision`'s recipe picks on the graph, counted by the rule that kept each other op."""
    recipe = RECIPES[precision]
    typed = assign_precision(prepared.graph, PrecisionPolicy(computed_in(precision)))
    choices = choose_layers(typed, recipe, scales)
    kept: dict[str, int] = {}
    for choice in choices:
        if not choice.quantize:
            rule = choice.reason.split(" (")[0].split(":")[0]  # "grouped (groups=96)" -> "grouped"
            kept[rule] = kept.get(rule, 0) + 1
    return RecipeFacts(precision, recipe, sum(c.quantize for c in choices), len(choices), kept)


# ---- building and loading -------------------------------------------------------------------------


def _build_one(request: StudyRequest, prepared: PreparedGraph, variant: str, max_batch: int,
               quantization: Quantization | None, progress: Progress) -> BundleFacts:
    folder = request.work / "bundles"
    folder.mkdir(parents=True, exist_ok=True)
    build = BuildRequest(
        model=str(prepared.checkpoint.folder),
        output=folder / f"{variant}-{request.backend}-{request.device}-b{max_batch}.bundle",
        precision=variant,
        device=request.device,
        backends=(request.backend,),
        max_batch=max_batch,
    )
    started = time.perf_counter()
    path = write_build(build, prepared, quantization, lambda m: progress(f"build {variant} b{max_batch}: {m}"))
    seconds = time.perf_counter() - started
    bundle = read_bundle(path)
    entry = bundle.engines[0]
    return BundleFacts(
        max_batch=max_batch,
        path=path,
        bundle_bytes=path.stat().st_size,
        engine_bytes=sum(len(data) for data in bundle.engine_files(entry.key).values()),
        engine_key=entry.key,
        batching=entry.batching,
        layers=entry.record.get("network_layers"),
        build_seconds=seconds,
    )


def _unserved(request: StudyRequest, bundles: tuple[BundleFacts, ...]) -> list[int]:
    """The batch sizes none of `bundles` serves, smallest first."""
    return [b for b in sorted(request.batch_sizes) if not any(f.batching.accepts(b) for f in bundles)]


def build_variant(request: StudyRequest, prepared: PreparedGraph, variant: str,
                  quantization: Quantization | None, progress: Progress) -> tuple[BundleFacts, ...]:
    """The variant's bundles: one for the largest batch size, and one more for each batch size its
    engine does not serve."""
    bundles = [_build_one(request, prepared, variant, max(request.batch_sizes), quantization, progress)]
    while missing := _unserved(request, tuple(bundles)):
        bundles.append(_build_one(request, prepared, variant, missing[0], quantization, progress))
    return tuple(bundles)


def _build_in_child(request: StudyRequest, folder: Path, variant: str, max_batch: int,
                    scales: tuple[dict[str, float], tuple[str, ...]] | None, quiet: bool) -> BundleFacts:
    """`_build_one` in a spawned process: the checkpoint's graph prepared again (the same graph: it
    depends on the checkpoint alone), the calibrated scales passed in as plain values."""
    from ..progress import Progress as Lines

    say = Lines(quiet)
    prepared = prepare_graph(open_checkpoint(folder), REFERENCE)
    quantization = Quantization(RECIPES[variant], CalibrationScales(*scales)) if scales else None
    return _build_one(request, prepared, variant, max_batch, quantization,
                      lambda message: say(f"[{variant} b{max_batch}] {message}"))


def _plain(quantization: Quantization | None) -> tuple[dict[str, float], tuple[str, ...]] | None:
    """The calibrated scales as values a process pool can pickle (the recipe is a constant by name)."""
    if quantization is None:
        return None
    return dict(quantization.scales.input_amax), tuple(quantization.scales.images)


def build_variants_in_parallel(request: StudyRequest, prepared: PreparedGraph, quantizations: dict[str, Quantization | None],
                               progress: Progress) -> dict[str, tuple[BundleFacts, ...] | str]:
    """`build_variant` for every variant, `request.jobs` bundles at a time, each in a spawned process
    (Inductor's compiles are CPU-bound and hold the GIL): the largest batch size's bundles first, then
    those for the batch sizes they do not serve. Returns each variant's bundles, or its error."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    done: dict[str, tuple[BundleFacts, ...] | str] = {name: () for name in quantizations}
    wave = {name: max(request.batch_sizes) for name in quantizations}
    with ProcessPoolExecutor(request.jobs, mp_context=get_context("spawn")) as pool:
        while wave:
            progress(f"building {len(wave)} bundles, {request.jobs} at a time")
            futures = {name: pool.submit(_build_in_child, request, prepared.checkpoint.folder, name, batch,
                                         # children print their own lines, as quiet as the caller's
                                         _plain(quantizations[name]), getattr(progress, "quiet", True))
                       for name, batch in wave.items()}
            wave = {}
            for name, future in futures.items():
                try:
                    done[name] = done[name] + (future.result(),)
                except Exception as exc:  # a variant that does not build is a finding, not the end of the study
                    done[name] = f"build: {_error(exc)}"
                    continue
                if missing := _unserved(request, done[name]):
                    wave[name] = missing[0]
    return done


def load_targets(request: StudyRequest, bundles: tuple[BundleFacts, ...], progress: Progress) -> dict[int, Target]:
    """batch -> the warmed engine that serves it (the smallest bundle that does)."""
    targets: dict[int, Target] = {}
    for facts in sorted(bundles, key=lambda b: b.max_batch):
        runtime = Runtime.open(facts.path, engine=request.backend)
        runtime.engine.warm_up()  # compile from the bundle's caches, capture the CUDA graphs
        synchronize(runtime.device)
        target = Target.from_runtime(runtime)
        for batch in request.batch_sizes:
            if batch not in targets and runtime.batching.accepts(batch):
                targets[batch] = target
        progress(f"loaded {facts.path.name} ({runtime.batching})")
    return targets


# ---- timing, kernels, quality --------------------------------------------------------------------


def _inputs(pixels: torch.Tensor, batch: int, target: Target) -> torch.Tensor:
    """`batch` held-out images, cycled, on the engine's device in its input dtype."""
    chosen = pixels[torch.arange(batch) % len(pixels)]
    return chosen.to(target.device, target.input_dtype).contiguous()


def kernels_per_call(call: Callable[[], object]) -> int | None:
    """CUDA kernels that one call runs, counted with torch.profiler (copies and fills excluded); None
    when the profiler saw none (a replayed CUDA graph whose kernels it cannot see)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    count = sum(1 for e in prof.events()
                if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset")))
    return count or None


def time_rows(request: StudyRequest, targets: dict[str, dict[int, Target]], pixels: torch.Tensor,
              progress: Progress) -> tuple[list[Row], dict[str, dict[int, int]]]:
    """Every (variant, batch) row timed together with the bench protocol; on CUDA, then the kernels of
    one call of each (variant -> batch -> kernels)."""
    calls: dict[tuple[str, int], TimedCall] = {}
    for variant, served in targets.items():
        for batch, target in served.items():
            x = _inputs(pixels, batch, target)
            calls[(variant, batch)] = TimedCall(lambda t=target, x=x: t.engine(x),
                                                default_clock_for(variant, ENGINE, batch, target.device))
    first_calls, errors = {}, {}
    with torch.no_grad():
        for key, call in calls.items():
            try:
                first_calls[key] = _first_call(call.fn, request.device)
            except Exception as exc:  # a row that cannot run is a finding, not the end of the study
                errors[key] = _error(exc)
        progress(f"timing {len(first_calls)} rows interleaved, round by round")
        outcome = time_interleaved({k: c for k, c in calls.items() if k in first_calls}, request.protocol)
    errors.update(outcome.errors)
    rows, kernels = [], {}
    for variant in request.variants:
        for batch in request.batch_sizes:
            key = (variant, batch)
            row = Row(variant, variant, ENGINE, batch, first_call_s=first_calls.get(key))
            if key not in calls:
                rows.append(replace(row, error="not timed: no engine of this variant serves this batch size"))
            elif key in errors:
                rows.append(replace(row, error=errors[key]))
            else:
                rows.append(replace(row, timing=outcome.timings[key]))
                progress(f"{variant} batch {batch}: {outcome.timings[key].median_ms:.3f} ms")
                counted = kernels_per_call(calls[key].fn) if request.device == "cuda" else None
                if counted is not None:
                    kernels.setdefault(variant, {})[batch] = counted
    return rows, kernels


def _first_call(fn: Callable[[], object], device: str) -> float:
    """The row's first call, timed on its own (the engines are warm: this shows what warming left)."""
    started = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - started


def judge_variant(result: VariantResult, served: dict[int, Target], photos: Photos, ref: oracle.Reference,
                  stress: quality.StressInputs) -> VariantResult:
    """Quality on the held-out images and the non-finite scan, at every batch size the variant serves."""
    tolerance = oracle.tolerance(result.compute)
    measured, scanned = {}, {}
    with torch.no_grad():
        for batch, target in sorted(served.items()):
            def run(chunk, t=target):
                return t.engine(chunk.to(t.device, t.input_dtype).contiguous())

            logits = oracle.in_chunks(run, photos.trtmc_pixels, batch, pad=True)
            measured[batch] = quality.measure(logits, ref, tolerance)
            scanned[batch] = quality.non_finite_names(oracle.in_chunks(run, stress.pixels, batch, pad=True), stress.names)
    return replace(result, quality=measured, stress_non_finite=scanned)


# ---- the study ------------------------------------------------------------------------------------


def _source(request: StudyRequest, split: ImageSplit, progress: Progress):
    weights = "random" if request.random_weights else "checkpoint"
    progress(f"checkpoint: {request.model} ({weights} weights)")
    return resolve_source(request.model, weights, request.work, request.seed, split.calibration)


def build_variants(request: StudyRequest, prepared: PreparedGraph, precisions: tuple[str, ...],
                   scales: CalibrationScales | None, progress: Progress) -> dict[str, VariantResult]:
    """Every variant's bundles, or why it has none."""
    variants = {name: VariantResult(name, computed_in(name)) for name in request.variants}
    buildable = {}
    for name, result in variants.items():
        if result.compute not in precisions:
            variants[name] = replace(result, error=f"the family computes in {', '.join(precisions)}, not {result.compute}")
        else:
            buildable[name] = Quantization(RECIPES[name], scales) if name in QUANTIZED_FORMATS else None
    if request.jobs > 1:
        built = build_variants_in_parallel(request, prepared, buildable, progress)
    else:
        built = {}
        for name, quantization in buildable.items():
            try:
                built[name] = build_variant(request, prepared, name, quantization, progress)
            except Exception as exc:  # a variant that does not build is a finding, not the end of the study
                log.debug("building %s failed", name, exc_info=True)
                built[name] = f"build: {_error(exc)}"
    for name, bundles in built.items():
        variants[name] = replace(variants[name], **({"error": bundles} if isinstance(bundles, str) else {"bundles": bundles}))
    return variants


def load_variants(request: StudyRequest, variants: dict[str, VariantResult],
                  progress: Progress) -> dict[str, dict[int, Target]]:
    """The warmed engines of every variant that built, by batch size; a variant that fails to load
    gets that error in `variants`."""
    targets = {}
    for name, result in variants.items():
        if result.error is None:
            try:
                targets[name] = load_targets(request, result.bundles, progress)
            except Exception as exc:
                log.debug("loading %s failed", name, exc_info=True)
                variants[name] = replace(result, error=f"load: {_error(exc)}")
    return targets


def decisions_for(result: StudyResult) -> tuple[Decision, ...]:
    """The rule applied to each quantized variant (`decision.decide`)."""
    request = result.request
    decisions = []
    for precision in request.quantized:
        variant = result.variant(precision)
        agreements = {b: (q.agreement if (q := variant.quality.get(b)) else None) for b in request.batch_sizes}
        decisions.append(decide(precision, result.times(computed_in(precision)), result.times(precision), agreements,
                                request.decision_batches, request.protocol.margin))
    return tuple(decisions)


def run_study(request: StudyRequest, progress: Progress = _quiet) -> StudyResult:
    """Build, time and judge every variant (see the module docstring)."""
    request.validate()
    started_at, started = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
    split = split_images(request.calibration, request.holdout)
    progress(split.how)
    source = _source(request, split, progress)
    checkpoint = open_checkpoint(source.build_model)
    family, _ = find_family(checkpoint.config.architecture)
    prepared = prepare_graph(checkpoint, REFERENCE)
    photos = Photos.load(split.holdout, source.folder, prepared.preprocess)
    ref = timm_reference(source.folder, photos)
    progress(f"timm fp32 answers on {len(split.holdout)} held-out images: the reference")
    scales = None
    if request.quantized:
        progress(f"calibrating on {len(split.calibration)} images (a float32 run of the graph)")
        scales = calibrate_images(prepared.graph, prepared.preprocess, split.calibration)

    variants = build_variants(request, prepared, family.precisions, scales, progress)
    targets = load_variants(request, variants, progress)
    rows, kernels = time_rows(request, targets, photos.trtmc_pixels, progress)
    for name, counted in kernels.items():
        variants[name] = replace(variants[name], kernels=counted)
    stress = quality.stress_inputs(prepared.preprocess, request.seed)
    for name, served in targets.items():
        try:
            variants[name] = judge_variant(variants[name], served, photos, ref, stress)
        except Exception as exc:
            log.debug("judging %s failed", name, exc_info=True)
            variants[name] = replace(variants[name], error=f"quality: {_error(exc)}")

    result = StudyResult(
        request=request,
        environment=environment(request.device),
        architecture=checkpoint.config.architecture,
        family=family.name,
        weights=source.weights,
        source=f"{checkpoint.source.id} @ {checkpoint.source.revision}",
        split=split,
        reference=quality.measure(ref.logits, ref, oracle.tolerance(REFERENCE)),
        variants=tuple(variants.values()),
        rows=tuple(rows),
        recipes=tuple(recipe_facts(prepared, p, scales) for p in request.quantized),
        calibration=scales,
        decisions=(),
        started=started_at,
        seconds=time.perf_counter() - started,
    )
    return replace(result, decisions=decisions_for(result))
