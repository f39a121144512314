"""The bench's outputs: `results.json` (everything), `results.md` (the tables), `latency.png` (the plot).

The headline of each row is the ratio baseline ms / trtmc engine ms, with the absolute times beside
it. Unstable rows, errors and wrong answers are shown as such, never as numbers to compare.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .runner import TRTMC, BenchResult, EntryResult, Row
from .timing import ENGINE, TASK
from ..files import write_bytes_atomically

log = logging.getLogger(__name__)

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
PLOT_PNG = "latency.png"
SCHEMA = 1
# Table headers for the baselines; the entry's precision is in its own column.
HEADERS = {
    "eager-fp32": "timm eager fp32",
    "eager-cl": "timm eager CL",
    "reduce-overhead": "compile reduce-overhead",
    "max-autotune": "compile max-autotune",
}


# One colour per subject in every panel; trtmc's task scope is its engine colour, dashed.
COLORS = {TRTMC: "C0", "eager-fp32": "C1", "eager-cl": "C2", "reduce-overhead": "C3", "max-autotune": "C4"}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def entry_to_json(result: EntryResult) -> dict[str, Any]:
    entry = result.entry
    batches = list(entry.batch_sizes)
    baselines = [s for s in result.subjects() if s != TRTMC]
    ratios = {
        key: {str(b): _round(result.ratio(key, b), 4) for b in batches} for key in baselines
    }
    return {
        "name": entry.name,
        "model": entry.model,
        "precision": entry.precision,
        "batch_sizes": batches,
        "weights": result.weights or entry.weights,
        "seed": entry.seed,
        "photo": None if entry.photo is None else str(entry.photo),
        "protocol": asdict(entry.protocol),
        "status": result.status,
        "message": result.message,
        "architecture": result.architecture,
        "engine": result.engine_key,
        "build_seconds": _round(result.build_seconds, 2),
        "load_seconds": _round(result.load_seconds, 2),
        "bundle_bytes": result.bundle_bytes,
        "oracle": {
            "timm": None if result.reference is None else result.reference.to_json(),
            "failures": list(result.oracle_failures),
        },
        "speedup": ratios,  # baseline ms / trtmc engine ms, per batch size
        "rows": [row.to_json() for row in result.rows],
    }


def to_json(result: BenchResult) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for e in result.entries:
        counts[e.status] = counts.get(e.status, 0) + 1
    unstable = sum(1 for e in result.entries for r in e.rows if r.status == "unstable")
    return {
        "schema": SCHEMA,
        "started": result.started,
        "seconds": round(result.seconds, 1),
        "environment": result.environment,
        "options": {
            "device": result.options.device,
            "baselines": list(result.options.baselines),
            "workdir": str(result.options.workdir),
        },
        "summary": {"entries": len(result.entries), **counts, "unstable_rows": unstable},
        "entries": [entry_to_json(e) for e in result.entries],
    }


def _ms(value: float) -> str:
    if value < 10:
        return f"{value:.3f} ms"
    if value < 100:
        return f"{value:.2f} ms"
    return f"{value:.1f} ms" if value < 10000 else f"{value / 1e3:.2f} s"


def _cell(row: Row | None) -> str:
    if row is None:
        return ""
    if row.status == "error":
        return "error"
    if row.status == "unstable":
        return f"unstable (±{row.timing.spread:.0%})"
    return _ms(row.median_ms)


def _ratio_cell(result: EntryResult, key: str, batch: int) -> str:
    row = result.row(key, ENGINE, batch)
    if row is None:
        return ""
    if row.status != "ok":
        return _cell(row)
    ratio = result.ratio(key, batch)
    if ratio is None:
        return f"— ({_ms(row.median_ms)})"
    verdict = result.verdict(ratio)
    text = f"{ratio:.2f}×"
    text = f"**{text}**" if verdict == "faster" else f"{text} {verdict}" if verdict == "slower" else f"{text} ≈"
    return f"{text} ({_ms(row.median_ms)})"


def _oracle_cell(result: EntryResult, batch: int) -> str:
    if result.reference is None:
        return ""
    ours = [result.row(TRTMC, scope, batch) for scope in (ENGINE, TASK)]
    judged = [r for r in ours if r is not None and r.status != "error"]
    if not judged:
        return "—"
    wrong = [r for r in judged if r.top_classes != (result.reference.top_class,) or not r.finite]
    if wrong:
        got = ",".join(str(c) for c in wrong[0].top_classes)
        return f"**WRONG** {got}≠{result.reference.top_class}"
    return f"ok {result.reference.top_class}"


def to_markdown(result: BenchResult) -> str:
    env = result.environment
    baselines = list(result.options.baselines)
    protocols = {(e.entry.protocol.warmups, e.entry.protocol.iters, e.entry.protocol.margin) for e in result.entries}
    if len(protocols) == 1:
        warmups, iters, margin = protocols.pop()
        protocol = f"{warmups} warm-up calls then {iters} measured calls per row, median reported; margin {margin:.0%}"
    else:
        protocol = "per-entry protocols (see results.json); median reported"
    lines = [
        "# trtmc bench",
        "",
        f"{env.get('device_name', env['device'])} · torch {env['torch']} · trtmc {env['trtmc']}"
        + (f" · timm {env['timm']}" if "timm" in env else "")
        + f" · {result.started} · {result.seconds / 60:.1f} min",
        "",
        f"Protocol: {protocol}. A row whose samples stray further than the margin from their median is",
        "re-run once, then shown as unstable. **engine**: device-resident input to complete float32 logits,",
        "synchronized (CUDA events on a GPU; trtmc replays a CUDA graph per batch size). **task**: the",
        "decoded photo as host RGB float32 arrays in, host logits out (image_to_class_scores: resize, crop,",
        "normalize, transfer, engine, copy back). Each baseline cell is",
        "*baseline ms / trtmc engine ms* (bold: trtmc faster by more than the margin; ≈: within it),",
        "with the baseline's time beside it. Oracle: trtmc's engine top class on the photo must be",
        "timm fp32 eager's; a wrong answer fails the entry whatever its speed.",
        "",
    ]
    header = ["model", "precision", "batch", "oracle", "trtmc engine", "trtmc task"]
    header += [f"vs {HEADERS.get(k, k)}" for k in baselines]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes = []
    for e in result.entries:
        if not e.rows:
            cells = [e.entry.name, e.entry.precision, ", ".join(map(str, e.entry.batch_sizes)), e.status]
            cells += [""] * (len(header) - len(cells))
            lines.append("| " + " | ".join(cells) + " |")
            notes.append(f"- **{e.entry.name}** ({e.status}): {e.message}")
            continue
        for batch in e.entry.batch_sizes:
            cells = [
                e.entry.name,
                e.entry.precision,
                str(batch),
                _oracle_cell(e, batch),
                _cell(e.row(TRTMC, ENGINE, batch)),
                _cell(e.row(TRTMC, TASK, batch)),
            ]
            cells += [_ratio_cell(e, key, batch) for key in baselines]
            lines.append("| " + " | ".join(cells) + " |")
        if e.status != "passed":
            notes.append(f"- **{e.entry.name}** ({e.status}): {e.message}")
        for r in e.rows:
            if r.status == "error" and not (e.status == "error" and r.subject == TRTMC):  # already in the message
                notes.append(f"- {e.entry.name}: {r.label} {r.scope} batch {r.batch}: {r.error}")
    lines += ["", "## Builds", ""]
    lines += [
        "| model | architecture | weights | engine | build | load | bundle | first call of each compiled baseline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in result.entries:
        compiled = []
        for key in baselines:
            if key.startswith("eager"):
                continue
            seconds = e.first_call_seconds(key)
            if seconds:
                compiled.append(f"{key}: " + ", ".join(f"b{b} {s:.1f} s" for b, s in seconds.items()))
        lines.append(
            "| "
            + " | ".join(
                [
                    e.entry.name,
                    e.architecture or "",
                    e.weights or e.entry.weights,
                    e.engine_key or "",
                    "" if e.build_seconds is None else f"{e.build_seconds:.1f} s",
                    "" if e.load_seconds is None else f"{e.load_seconds:.1f} s",
                    "" if e.bundle_bytes is None else f"{e.bundle_bytes / 1e6:.1f} MB",
                    "; ".join(compiled),
                ]
            )
            + " |"
        )
    lines += [
        "",
        "Build: `trtmc build` on the bench device, wall time. Load: opening the bundle and capturing its",
        "CUDA graphs, in the bench process (warmer than a fresh one).",
    ]
    if notes:
        lines += ["", "## Problems", ""] + notes
    return "\n".join(lines) + "\n"


def plot(result: BenchResult, path: Path) -> Path | None:
    """Median latency against batch size, one panel per model; None (with a warning) without matplotlib.

    Unstable medians are drawn as hollow markers: visible, but marked as not being results.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    except ImportError:
        log.warning("matplotlib is not installed, so %s is not drawn: pip install matplotlib", path.name)
        return None
    panels = [e for e in result.entries if any(r.timing is not None for r in e.rows)]
    columns = max(1, min(3, len(panels)))
    rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.8 * rows), squeeze=False)
    for ax, e in zip(axes.flat, panels):
        series: dict[tuple[str, str], list[Row]] = {}
        for r in e.rows:
            if r.timing is not None:
                series.setdefault((r.label, r.scope), []).append(r)
        for (label, scope), points in series.items():
            points.sort(key=lambda r: r.batch)
            trtmc = points[0].subject == TRTMC
            color = COLORS.get(points[0].subject, "C7")
            ax.plot(
                [r.batch for r in points],
                [r.timing.median_ms for r in points],
                marker="o",
                linestyle="--" if scope == TASK else "-",
                linewidth=2.2 if trtmc else 1.2,
                color=color,
                label=f"{label} ({scope})" if trtmc else label,
            )
            unstable = [r for r in points if r.status == "unstable"]
            if unstable:
                ax.plot([r.batch for r in unstable], [r.timing.median_ms for r in unstable], linestyle="none",
                        marker="o", markersize=9, markerfacecolor="white", markeredgecolor=color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        values = [r.timing.median_ms for r in e.rows if r.timing is not None]
        # Label minor ticks only within a decade: over wider ranges they pile up.
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g") if max(values) < 10 * min(values) else NullFormatter())
        ax.set_xticks(list(e.entry.batch_sizes), [str(b) for b in e.entry.batch_sizes])
        title = f"{e.entry.name} {e.entry.precision}"
        if e.status != "passed":
            title += f" [{e.status.upper()}]"
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("batch size")
        ax.set_ylabel("median latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if not panels:
        axes.flat[0].text(0.5, 0.5, "no timings (see results.md)", ha="center", va="center")
    device = result.environment.get("device_name", result.environment["device"])
    fig.suptitle(f"trtmc bench: {device} (hollow markers: unstable, not results)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_results(result: BenchResult, out: Path) -> dict[str, Path]:
    """results.json, results.md and latency.png in `out` (created if missing); the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    path = out / RESULTS_JSON
    write_bytes_atomically(path, (json.dumps(to_json(result), indent=1) + "\n").encode())
    written["json"] = path
    path = out / RESULTS_MD
    write_bytes_atomically(path, to_markdown(result).encode())
    written["markdown"] = path
    png = plot(result, out / PLOT_PNG)
    if png is not None:
        written["plot"] = png
    return written
