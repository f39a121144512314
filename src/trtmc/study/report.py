"""A study's outputs: study.md (the report), study.json (everything measured) and study.png (the plot).

study.md follows the founding FP8 studies: summary and decision, recipe, method, results, what was
not tried, when to revisit, and the command that made it. Every paragraph that describes how a
number was made is written from the constants and functions the run used (`timing.describe`,
`quality.describe`, `decision.rule_text`, `RANDOM_WEIGHTS_TEXT`); unstable and failed rows are shown
as such, never as numbers to compare.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from ..bench import timing
from ..bench.results import Row
from ..bench.sources import RANDOM_WEIGHTS_TEXT
from ..files import write_bytes_atomically
from ..precision import PRECISIONS
from ..random_weights import INSTALL
from . import quality
from .decision import rule_text
from .request import REFERENCE
from .results import StudyResult

log = logging.getLogger(__name__)

STUDY_JSON = "study.json"
STUDY_MD = "study.md"
STUDY_PNG = "study.png"
SCHEMA = 1
BASELINE = "fp16"  # the ratios' denominator: what a quantized precision has to beat


# ---- cells -------------------------------------------------------------------------------------


def _number(value: float | None, pattern: str, missing: str = "—") -> str:
    return missing if value is None else format(value, pattern)


def _row_cell(row: Row | None) -> str:
    """A row's median in ms, or what it is instead of a result."""
    if row is None:
        return "—"
    if row.status == "error":
        return "error"
    if row.status == "unstable":
        return f"unstable (±{row.timing.spread:.0%})"
    return f"{row.median_ms:.3f}"


def _ratio_cell(result: StudyResult, variant: str, baseline: str, batch: int) -> str:
    """baseline ms / variant ms as `1.23x`, or — where either row is not a result."""
    ratio = result.ratio(variant, baseline, batch)
    return "—" if ratio is None else f"{ratio:.2f}x"


def _mb(size: int | None) -> str:
    return "—" if not size else f"{size / 2**20:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


# ---- sections ----------------------------------------------------------------------------------


def _title(result: StudyResult) -> list[str]:
    request, env = result.request, result.environment
    if request.quantized:
        studied = f"{' and '.join(request.quantized)} against {BASELINE}"
    else:
        studied = f"{' and '.join(v for v in request.variants if v != REFERENCE) or REFERENCE} against {REFERENCE}"
    return [
        f"# trtmc study: {result.architecture}, {studied}",
        "",
        f"{env.get('device_name', env['device'])} · {request.backend} engine · torch {env['torch']} · trtmc "
        f"{env['trtmc']}" + (f" · timm {env['timm']}" if "timm" in env else "")
        + f" · {result.started} · {result.seconds / 60:.1f} min · {result.weights} weights ({result.source})",
    ]


def _summary_table(result: StudyResult) -> list[str]:
    request = result.request
    variants = list(result.variants)
    header = ["Item"] + [v.name for v in variants]
    first = min(request.batch_sizes)
    rows = []
    for batch in request.batch_sizes:
        cells = []
        for v in variants:
            ratio = result.ratio(v.name, BASELINE, batch) if v.name != BASELINE else None
            cells.append(_row_cell(result.row(v.name, batch)) + ("" if ratio is None else f" ({ratio:.2f}x)"))
        rows.append([f"Latency, batch {batch} (ms; x: fp16 ms / its ms)"] + cells)
    rows.append(["Bundle size (MiB)"] + [_mb(v.primary.bundle_bytes if v.primary else None) for v in variants])
    rows.append(["Engine size (MiB)"] + [_mb(v.primary.engine_bytes if v.primary else None) for v in variants])
    big = max(request.batch_sizes)
    if request.backend == "tensorrt":
        rows.append(["TensorRT network layers"] + [_number(v.primary.layers if v.primary else None, "d") for v in variants])
    else:
        rows.append([f"CUDA kernels per call, batch {big}"]
                    + [_number(v.kernels.get(big), "d") for v in variants])
    q = {v.name: v.quality.get(first) for v in variants}
    rows.append([f"Top-1 agreement with timm fp32, batch {first}"] + [_number(x.agreement if x else None, ".2%") for x in q.values()])
    rows.append([f"KL mean, batch {first}"] + [_number(x.kl_mean if x else None, ".2g") for x in q.values()])
    labelled = result.reference.labelled
    if labelled:
        rows.append([f"Top-1 against the labels ({labelled} images; timm fp32 {result.reference.label_top1:.2%})"]
                    + [_number(x.label_top1 if x else None, ".2%") for x in q.values()])
    rows.append(["Non-finite outputs (held-out and stress inputs, every batch size)"]
                + [str(v.non_finite()) if v.quality else "—" for v in variants])
    return _table(header, rows)


def _decision_lines(result: StudyResult) -> list[str]:
    request = result.request
    lines = []
    if not result.decisions:
        lines.append("No quantized precision was studied: there is nothing to ship or refuse.")
    for d in result.decisions:
        verdict = "ships" if d.ships else "is not shipped"
        lines.append(f"- **{d.precision} {verdict}**: {d.evidence() if d.ships else '; '.join(d.reasons)}.")
        variant = result.variant(d.precision)
        stressed = sum(len(s) for s in variant.stress_non_finite.values()) if variant else 0
        if stressed:
            lines.append(f"  Non-finite logits on {stressed} stress input(s) (see the non-finite scan); the rule does "
                         "not weigh them, review them before shipping.")
    lines += ["", rule_text(request.decision_batches, request.protocol.margin)]
    if result.weights == "random":
        lines += ["", "These are **random weights**: top-1 agreement on them is a proxy for agreement on a trained "
                  "model, so a decision made here must be confirmed on real weights before it is committed."]
    if request.device == "cpu":
        lines += ["", "This study ran on the **CPU**: its times are CPU times, so its speed findings say nothing "
                  "about a GPU."]
    return lines


def _recipe_lines(result: StudyResult) -> list[str]:
    if not result.recipes:
        return ["No quantized precision was studied."]
    images = len(result.calibration.images) if result.calibration else 0
    lines = []
    for facts in result.recipes:
        recipe, fmt, compute = facts.recipe, PRECISIONS[facts.precision], result.variant(facts.precision).compute
        kept = ", ".join(f"{rule}: {n}" for rule, n in facts.kept.items()) or "none"
        outliers = facts.kept.get("outlier", 0)
        overrides = ", ".join(f"{o.pattern} -> {'quantized' if o.quantize else 'kept'}" for o in recipe.overrides) or "none"
        weight = f"per output channel, amax / {fmt.largest:g}" if recipe.per_channel_weights else f"per tensor, amax / {fmt.largest:g}"
        lines += [f"### {facts.precision} ({fmt.dtype.value})", ""]
        lines += _table(["Choice", "Decision"], [
            ["Quantized", f"{facts.quantized} of {facts.total} convolution and linear ops"],
            [f"Kept in {compute}, by rule", kept],
            ["Weight scale", f"{weight} of the batch-norm-folded kernel, at build time"],
            ["Activation scale", f"static, per tensor, max \\|x\\| / {fmt.largest:g} over the {images} calibration "
                                 "images, from a float32 run of the graph"],
            ["Outlier rule", f"a scale above {recipe.outlier_ratio:g}x the median of its kind stays unquantized; "
                             f"measured: {outliers} outlier(s)"],
            ["Stays unquantized by structure", _kept_rules(recipe)],
            ["Overrides", overrides],
        ])
        lines.append("")
    return lines


def _kept_rules(recipe) -> str:
    rules = [f"convolutions reading <= {recipe.stem_channels} channels (the stem)"]
    rules += ["depthwise and grouped convolutions"] if recipe.keep_grouped else []
    rules += ["ops on one position per image (1x1 maps, pooled vectors)"] if recipe.keep_single_position else []
    rules += ["the classifier"] if recipe.keep_classifier else []
    return "; ".join(rules)


def _method_lines(result: StudyResult) -> list[str]:
    request = result.request
    env = result.environment
    clocks = sorted({r.timing.clock for r in result.rows if r.timing is not None}) or ["none ran"]
    bundles = {v.name: ", ".join(f"max batch {b.max_batch} ({b.batching})" for b in v.bundles) for v in result.variants}
    lines = [
        f"- Machine: {env.get('device_name', env['device'])}; " + ", ".join(f"{k} {v}" for k, v in env.items()
                                                                          if k not in ("device_name",)) + ".",
        f"- Checkpoint: {result.architecture} ({result.family} family), {result.source}.",
        f"- Variants: {', '.join(request.variants)}, each built from the same checkpoint and graph by `trtmc build`'s "
        f"code with the {request.backend} engine for {request.device}; fp8 and int8 compute in fp16 between their "
        "quantize and dequantize ops. Bundles: " + "; ".join(f"{k}: {v or 'none'}" for k, v in bundles.items()) + ".",
        f"- Images: {result.split.how}.",
        f"- Speed: engine scope (device pixels in, float32 logits out), every variant and batch size timed in this one "
        f"process. {timing.describe(request.protocol)} Clock: {', '.join(clocks)}.",
        "- Kernels: on CUDA, the kernels torch.profiler records during one engine call (the replay of its CUDA graph, "
        "input and output copies included; memcpy and memset excluded); TensorRT engines report their network "
        "layers instead. Sizes: the bundle file and its engine files, for the bundle of the largest batch size.",
        f"- {quality.describe()}",
    ]
    if result.weights == "random":
        lines.append(f"- Weights: {RANDOM_WEIGHTS_TEXT} Here the photos are the calibration images, never the "
                     "held-out ones.")
    return lines


def _results_lines(result: StudyResult) -> list[str]:
    request = result.request
    speed = []
    for v in result.variants:
        for batch in request.batch_sizes:
            row = result.row(v.name, batch)
            t = row.timing if row else None
            speed.append([
                v.name, str(batch), _row_cell(row), "—" if t is None else f"{t.spread:.1%}",
                _ratio_cell(result, v.name, BASELINE, batch), _ratio_cell(result, v.name, REFERENCE, batch),
                _number(v.kernels.get(batch), "d"),
            ])
    lines = ["### Speed", ""]
    lines += _table(["Variant", "Batch", "ms", "spread", "x vs fp16", "x vs fp32", "CUDA kernels"], speed)
    ref = result.reference
    quality_rows = [["timm fp32 (reference)", "—", "—", "—", "—", _number(ref.label_top1, ".2%"), "—", "0"]]
    for v in result.variants:
        for batch, q in v.quality.items():
            quality_rows.append([v.name, str(batch), f"{q.agreement:.2%}", _number(q.kl_mean, ".3g"),
                                 _number(q.kl_p99, ".3g"), _number(q.label_top1, ".2%"), q.verdict.describe(most=1),
                                 str(q.non_finite)])
    lines += ["", f"### Quality ({ref.images} held-out images)", ""]
    lines += _table(["Variant", "Batch", "Top-1 agreement", "KL mean", f"KL p{quality.KL_PERCENTILE}",
                     "Top-1 vs labels", "Bench oracle", "Non-finite images"], quality_rows)
    scan = [[v.name, str(b), str(v.quality[b].non_finite) if b in v.quality else "—", ", ".join(names) or "none"]
            for v in result.variants for b, names in v.stress_non_finite.items()]
    lines += ["", "### Non-finite scan", ""]
    lines += _table(["Variant", "Batch", "Held-out images", "Stress inputs with non-finite logits"], scan)
    problems = [f"- {v.name}: {v.error}" for v in result.variants if v.error]
    problems += [f"- {r.subject} batch {r.batch}: {r.error}" for r in result.rows if r.error]
    if problems:
        lines += ["", "### Problems", "", *problems]
    return lines


def _not_tried_lines(result: StudyResult) -> list[str]:
    request = result.request
    unstudied = [p for p in ("fp16", "bf16", "fp8", "int8") if p not in request.variants]
    lines = [
        "- Calibration statistics other than max |x| (percentile, entropy), per-channel activation scales, "
        "quantization-aware training: not measured.",
        "- Recipe variants: only the default recipe of each format (trtmc.quantization), without overrides.",
        "- The task scope (decoding and preprocessing included) was not timed: engine scope only.",
        f"- Batch sizes other than {', '.join(map(str, request.batch_sizes))}.",
        f"- {len(result.split.holdout)} held-out images: one image moves the agreement by "
        f"{1 / max(len(result.split.holdout), 1):.1%}.",
    ]
    if unstudied:
        lines.append(f"- Precisions not studied here: {', '.join(unstudied)}.")
    if request.backend == "inductor" and request.quantized:
        lines.append(
            "- Quantized kernels other than GEMMs: " + ("on CUDA " if request.device == "cuda" else "on CUDA (not run "
            "here) ") + "the inductor engine runs a quantized 1x1 convolution or linear op (widths multiples of "
            "16; INT8 also >= 17 rows per image, for torch._int_mm) as one FP8 torch._scaled_mm or INT8 "
            "torch._int_mm GEMM, its input's quantize fused into the producer by Inductor; every other quantized "
            "op (3x3, depthwise, grouped convolutions) runs as an fp16 convolution of its dequantized weight, "
            "computed once when the graph is traced: PyTorch has no FP8 or INT8 convolution kernels to call. "
            "Fused FP8/INT8 convolutions (TensorRT on a GPU it runs on) were not measured.")
    if request.backend == "reference":
        lines.append("- A compiled engine: the reference engine runs the graph op by op, uncompiled, so its times "
                     "measure the study's steps, not a deployable engine.")
    others = [b for b in ("tensorrt", "inductor") if b != request.backend]
    lines.append(f"- Other engines: {', '.join(others)}.")
    return lines


def _revisit_lines(result: StudyResult) -> list[str]:
    lines = []
    for d in result.decisions:
        if d.ships:
            continue
        if any(r.startswith("batch") for r in d.reasons):
            gemms = "GEMMs that fuse their quantize epilogues in the inductor engine; "
            lines.append(f"- {d.precision}, speed: an engine whose {d.precision} kernels beat fp16 at these batch "
                         f"sizes ({gemms}TensorRT on a GPU it runs on), or quantize fused into its producers.")
        if any("agreement" in r for r in d.reasons):
            lines.append(f"- {d.precision}, quality: a calibration or recipe that keeps >= 99% agreement (percentile "
                         "or entropy statistics, per-channel activation scales, fewer quantized layers).")
    if result.weights == "random":
        lines.append("- Real weights for this model: agreement on random weights is a proxy.")
    if result.request.device == "cpu":
        lines.append("- A GPU run: the times here are CPU times.")
    lines.append("- A new torch, Triton or TensorRT version, or another GPU: re-run the command below; the "
                 "decision holds for the versions and device above only.")
    return lines


def to_markdown(result: StudyResult) -> str:
    lines = _title(result)
    sections: list[tuple[str, Callable[[StudyResult], list[str]]]] = [
        ("Summary and decision", lambda r: _summary_table(r) + [""] + _decision_lines(r)),
        ("Recipe", _recipe_lines),
        ("Method", _method_lines),
        ("Results", _results_lines),
        ("What was not tried", _not_tried_lines),
        ("When to revisit", _revisit_lines),
        ("Command", lambda r: ["```sh", r.request.command(), "```"]),
    ]
    for title, section in sections:
        lines += ["", f"## {title}", "", *section(result)]
    return "\n".join(lines) + "\n"


# ---- JSON and the plot ---------------------------------------------------------------------------


def to_json(result: StudyResult) -> dict[str, Any]:
    request = result.request
    return {
        "schema": SCHEMA,
        "command": request.command(),
        "started": result.started,
        "seconds": round(result.seconds, 1),
        "environment": dict(result.environment),
        "model": request.model,
        "architecture": result.architecture,
        "family": result.family,
        "weights": result.weights,
        "source": result.source,
        "device": request.device,
        "backend": request.backend,
        "batch_sizes": list(request.batch_sizes),
        "decision_batches": list(request.decision_batches),
        "protocol": asdict(request.protocol),
        "images": {"how": result.split.how, "calibration": [p.name for p in result.split.calibration],
                   "holdout": [p.name for p in result.split.holdout]},
        "reference": result.reference.to_json(),
        "recipes": [r.to_json() for r in result.recipes],
        "calibration": None if result.calibration is None else result.calibration.to_json(),
        "variants": [v.to_json() for v in result.variants],
        "rows": [r.to_json() for r in result.rows],
        "speedup_vs_fp16": {v.name: {str(b): result.ratio(v.name, BASELINE, b) for b in request.batch_sizes}
                            for v in result.variants},
        "decisions": [d.to_json() for d in result.decisions],
        "rule": rule_text(request.decision_batches, request.protocol.margin),
    }


def _points(result: StudyResult, variant: str, value: Callable[[Row], float | None]) -> list[tuple[int, float, bool]]:
    """(batch, value, a result?) of the variant's timed rows; unstable rows are drawn but not results."""
    points = []
    for batch in result.request.batch_sizes:
        row = result.row(variant, batch)
        if row is not None and row.timing is not None and (y := value(row)) is not None:
            points.append((batch, y, row.status == "ok"))
    return points


def plot(result: StudyResult, path: Path) -> Path | None:
    """Latency against batch size per variant (left) and each variant's speed-up over fp16 (right),
    unstable rows as hollow markers; None (with a warning) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed, so %s is not drawn: %s", path.name, INSTALL)
        return None
    request = result.request

    def speedup(row: Row) -> float | None:
        fp16 = result.row(BASELINE, row.batch)
        return None if fp16 is None or fp16.timing is None else fp16.timing.median_ms / row.timing.median_ms

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for index, v in enumerate(result.variants):
        panels = [(left, _points(result, v.name, lambda r: r.timing.median_ms))]
        panels += [(right, _points(result, v.name, speedup))] if v.name != BASELINE else []
        for ax, points in panels:
            if not points:
                continue
            batches, values, _ = zip(*points)
            ax.plot(batches, values, marker="o", color=f"C{index}", label=v.name)
            hollow = [(b, y) for b, y, ok in points if not ok]
            if hollow:
                ax.plot(*zip(*hollow), linestyle="none", marker="o", markersize=9, markerfacecolor="white",
                        markeredgecolor=f"C{index}")
    right.axhline(1.0, color="k", linewidth=1)
    right.axhline(1.0 + request.protocol.margin, color="k", linewidth=1, linestyle="--", label="ship threshold")
    for ax, ylabel in ((left, "median latency (ms)"), (right, "fp16 ms / variant ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(request.batch_sizes), [str(b) for b in request.batch_sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    left.set_yscale("log")
    decided = "; ".join(d.summary() if d.ships else f"{d.precision}: not shipped" for d in result.decisions)
    env = result.environment
    fig.suptitle(f"trtmc study: {result.architecture} on {env.get('device_name', env['device'])}, "
                 f"{request.backend} engine (hollow: unstable, not a result)" + (f"\n{decided}" if decided else ""),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(result: StudyResult, out: Path) -> dict[str, Path]:
    """study.json, study.md and study.png in `out` (created if missing); the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    texts = {"json": (STUDY_JSON, json.dumps(to_json(result), indent=1) + "\n"), "markdown": (STUDY_MD, to_markdown(result))}
    written = {key: write_bytes_atomically(out / name, text.encode()) for key, (name, text) in texts.items()}
    png = plot(result, out / STUDY_PNG)
    return written if png is None else {**written, "plot": png}
