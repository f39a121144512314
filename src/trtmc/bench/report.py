"""The bench's outputs: `results.json` (everything), `results.md` (the tables), `latency.png` (the plot).

The headline is the ratio expert-baseline ms / trtmc engine ms, with the absolute times beside it; the
folder scope, where an entry runs it, has its own table: images/s of trtmc and of the DataLoader
baseline, their ratio and each side's peak RSS. Unstable rows, errors and wrong answers are shown as
such, never as numbers to compare; a wrong trtmc row fails its entry, so none of that entry's ratios
is shown. The protocol paragraph of
results.md is written from the same constants and functions the run used (`timing.describe`,
`oracle.describe`, `SCOPE_TEXT`, `BASELINE_SPECS`), never by hand.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..files import write_bytes_atomically
from ..random_weights import INSTALL
from . import oracle, timing
from .folder import MEMORY_SAMPLE_SECONDS
from .results import ENGINE, FOLDER, SCOPE_TEXT, TASK, TRTMC, BenchResult, EntryResult, FolderSide, Row
from .sources import RANDOM_WEIGHTS_TEXT
from .spec import BASELINE_SPECS, HEADLINE

log = logging.getLogger(__name__)

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
PLOT_PNG = "latency.png"
# 3: the folder scope (entries' "folder" and "folder_runs"); 4: entries' "host", rows' discarded attempts as lists;
# 5: rows timed on the host carry "host_speed" (timing.HostSpeed)
SCHEMA = 5
# One colour per subject in every panel; trtmc's task scope is its engine colour, dashed.
COLORS = {TRTMC: "C0", HEADLINE: "k", "eager-fp32": "C1", "eager-cl": "C2", "reduce-overhead": "C3", "max-autotune": "C4"}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def entry_to_json(result: EntryResult) -> dict[str, Any]:
    entry = result.entry
    batches = list(entry.batch_sizes)
    baselines = [s for s in result.subjects() if s != TRTMC]
    return {
        "name": entry.name,
        "model": entry.model,
        "precision": entry.precision,
        "batch_sizes": batches,
        "weights": result.weights or entry.weights,
        "seed": entry.seed,
        "photos": None if entry.photos is None else str(entry.photos),
        "protocol": asdict(entry.protocol),
        "status": result.status,
        "message": result.message,
        "architecture": result.architecture,
        "engine": result.engine_key,
        "build_seconds": _round(result.build_seconds, 2),
        "load_seconds": _round(result.load_seconds, 2),
        "bundle_bytes": result.bundle_bytes,
        "oracle": None if result.reference is None else result.reference.to_json(),
        "headline": {str(b): _round(result.headline(b), 4) for b in batches},  # expert ms / trtmc engine ms
        "speedup": {key: {str(b): _round(result.ratio(key, b), 4) for b in batches} for key in baselines},
        "rows": [row.to_json() for row in result.rows],
        "host": None if result.host is None else result.host.to_json(),  # the CPUs while the rows were timed
        "folder": None if entry.folder is None else asdict(entry.folder),
        "folder_runs": [run.to_json() for run in result.folder_runs],  # ratio: trtmc images/s / baseline's
    }


def to_json(result: BenchResult) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for e in result.entries:
        counts[e.status] = counts.get(e.status, 0) + 1
    rows = [r for e in result.entries for r in e.rows]
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
        "resumed": dict(result.resumed),  # entry -> start of the earlier run that timed it (--resume)
        "summary": {
            "entries": len(result.entries),
            **counts,
            "unstable_rows": sum(1 for r in rows if r.status == "unstable"),
            "wrong_rows": sum(1 for r in rows if r.status == "wrong"),
            "headline": {e.entry.name: {str(b): _round(e.headline(b), 4) for b in e.entry.batch_sizes}
                         for e in result.entries},
            "folder": {e.entry.name: {str(run.images): _round(run.ratio, 4) for run in e.folder_runs}
                       for e in result.entries if e.folder_runs},
        },
        "entries": [entry_to_json(e) for e in result.entries],
    }


def _ms(value: float) -> str:
    if value < 10:
        return f"{value:.3f} ms"
    if value < 100:
        return f"{value:.2f} ms"
    return f"{value:.1f} ms" if value < 10000 else f"{value / 1e3:.2f} s"


def _cell(row: Row | None) -> str:
    """A row's own time, or what it is instead of a result."""
    if row is None:
        return ""
    if row.status == "error":
        return "error"
    if row.status == "wrong":
        return f"**wrong** on {row.verdict.wrong_photos}/{row.verdict.photos} photos"
    if row.status == "unstable":
        return f"unstable (±{row.timing.spread:.0%})"
    return _ms(row.median_ms)


def _ratio_text(result: EntryResult, ratio: float) -> str:
    verdict = result.verdict(ratio)
    text = f"{ratio:.2f}×"
    return f"**{text}**" if verdict == "faster" else f"{text} {verdict}" if verdict == "slower" else f"{text} ≈"


def _ratio_cell(result: EntryResult, key: str, batch: int) -> str:
    row = result.row(key, ENGINE, batch)
    if row is None or row.status != "ok":
        return _cell(row)
    ratio = result.ratio(key, batch)
    if ratio is None:  # trtmc's row is not a result, or the entry failed
        return f"— ({_ms(row.median_ms)})"
    return f"{_ratio_text(result, ratio)} ({_ms(row.median_ms)})"


def _oracle_cell(result: EntryResult, batch: int) -> str:
    ours = [r for r in (result.row(TRTMC, scope, batch) for scope in (ENGINE, TASK)) if r is not None]
    judged = [r for r in ours if r.verdict is not None]
    if not judged:
        return "—"
    wrong = [r for r in judged if not r.verdict.right]
    if wrong:
        return "**WRONG** " + ", ".join(f"{r.scope} {r.verdict.wrong_photos}/{r.verdict.photos}" for r in wrong)
    return f"right {judged[0].verdict.photos}/{judged[0].verdict.photos}"


def _protocol_lines(result: BenchResult) -> list[str]:
    entries = result.entries
    protocols = list(dict.fromkeys(e.entry.protocol for e in entries))
    if len(protocols) == 1:
        protocol = timing.describe(protocols[0])
    else:
        protocol = " ".join(f"{e.entry.name}: {timing.describe(e.entry.protocol)}" for e in entries)
    clocks: dict[str, set[str]] = {}
    for r in (r for e in entries for r in e.rows if r.timing is not None):
        clocks.setdefault(r.scope, set()).add(r.timing.clock)
    lines = [protocol, ""]
    lines += [f"- **{scope}** scope: {SCOPE_TEXT[scope]}; clock: {', '.join(sorted(clocks.get(scope, {'none ran'})))}."
              for scope in (ENGINE, TASK)]
    lines += [f"- **{BASELINE_SPECS[key].header}**: {BASELINE_SPECS[key].description}." for key in result.options.baselines]
    counts = {len(e.reference.photos) for e in entries if e.reference is not None}
    folders = {str(e.entry.photos or oracle.SHIPPED_PHOTOS) for e in entries}
    if counts:
        lines += ["", oracle.describe(", ".join(sorted(folders)), counts.pop() if len(counts) == 1 else None)]
    if any(e.weights == "random" for e in entries):
        lines += ["", RANDOM_WEIGHTS_TEXT]
    lines += [
        "",
        f"Each baseline cell is *baseline ms / trtmc engine ms* (bold: trtmc faster by more than the margin; "
        f"≈: within it), with the baseline's time beside it; **{BASELINE_SPECS[HEADLINE].header}** is the headline.",
    ]
    return lines


def _headline_lines(result: BenchResult) -> list[str]:
    label = BASELINE_SPECS[HEADLINE].header
    lines = [f"| model | precision | batch | oracle | trtmc engine | {label} | {label} ms / trtmc ms |", "|---|---|---|---|---|---|---|"]
    for e in result.entries:
        for batch in e.entry.batch_sizes if e.rows else ():
            ours, theirs = e.row(TRTMC, ENGINE, batch), e.row(HEADLINE, ENGINE, batch)
            ratio = e.headline(batch)
            cells = [e.entry.name, e.entry.precision, str(batch), _oracle_cell(e, batch), _cell(ours), _cell(theirs),
                     "—" if ratio is None else _ratio_text(e, ratio)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _build_lines(result: BenchResult) -> list[str]:
    lines = [
        "| model | architecture | weights | engine | build | load | bundle | first call of each compiled baseline "
        "| CPUs while timing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in result.entries:
        compiled = []
        for key in result.options.baselines:
            seconds = e.first_call_seconds(key) if not key.startswith("eager") else {}
            if seconds:
                compiled.append(f"{key}: " + ", ".join(f"b{b} {s:.1f} s" for b, s in seconds.items()))
        cells = [
            e.entry.name,
            e.architecture or "",
            e.weights or e.entry.weights,
            e.engine_key or "",
            "" if e.build_seconds is None else f"{e.build_seconds:.1f} s",
            "" if e.load_seconds is None else f"{e.load_seconds:.1f} s",
            "" if e.bundle_bytes is None else f"{e.bundle_bytes / 1e6:.1f} MB",
            "; ".join(compiled),
            "" if e.host is None else f"{e.host.busy:.0%} busy, {e.host.others:.0%} others, {e.host.steal:.0%} steal",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [
        "",
        "Build: `trtmc build` on the bench device, wall time. Load: opening the bundle and capturing its",
        "CUDA graphs, in the bench process (warmer than a fresh one). CPUs while timing: shares of all the",
        "machine's CPU time during the entry's rounds that was busy, busy outside the bench process, and",
        "stolen by the hypervisor (/proc/stat): what a row timed on the host competes with.",
    ]


def _row_lines(result: BenchResult) -> list[str]:
    lines = ["| model | row | scope | batch | median | spread | calls per round | attempts | host speed after each | "
             "oracle |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in result.entries:
        for r in e.rows:
            t = r.timing
            cells = [e.entry.name, r.label, r.scope, str(r.batch)]
            cells += [""] * 5 if t is None else [_ms(t.median_ms), f"{t.spread:.1%}", str(t.calls_per_round), str(t.attempts),
                                                 " ".join(f"{v:.2f}" for v in t.host_speed)]
            cells.append(r.error or ("" if r.verdict is None else r.verdict.describe()))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _gib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**30:.2f} GiB"


def _folder_cell(side: FolderSide) -> str:
    if side.status == "error":
        return "error"
    if side.status == "wrong":
        return f"**wrong** on {side.verdict.wrong_photos}/{side.verdict.photos} files"
    return f"{side.images_per_s:.1f} images/s"


def _folder_rss(side: FolderSide) -> str:
    if side.peak_rss is None:
        return ""
    text = _gib(side.peak_rss)
    if side.workers_peak_rss:
        text += f" ({_gib(side.tree_peak_rss)} with its workers)"
    return text


def _folder_lines(result: BenchResult) -> list[str]:
    """The folder scope's tables: the comparison, then what each side ran with."""
    entries = [e for e in result.entries if e.folder_runs]
    lines = [
        f"The **{FOLDER}** scope: {SCOPE_TEXT[FOLDER]}.",
        "",
        "| model | precision | images | oracle | trtmc | DataLoader baseline | trtmc / baseline | trtmc peak RSS | "
        "baseline peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        for run in e.folder_runs:
            judged = [s for s in (run.trtmc, run.baseline) if s.verdict is not None]
            wrong = [s for s in judged if not s.verdict.right]
            oracle_cell = ("**WRONG** " + ", ".join(f"{s.subject} {s.verdict.wrong_photos}/{s.verdict.photos}" for s in wrong)
                           if wrong else f"right {judged[0].verdict.photos}/{run.images}" if judged else "—")
            ratio = "—" if run.ratio is None else _ratio_text(e, run.ratio)
            cells = [e.entry.name, e.entry.precision, str(run.images), oracle_cell, _folder_cell(run.trtmc),
                     _folder_cell(run.baseline), ratio, _folder_rss(run.trtmc), _folder_rss(run.baseline)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | images | side | device | workers | batch | load (untimed) | pass | peak RSS before the pass | "
        "peak RSS | a worker's peak RSS | with its workers | problem |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        for run in e.folder_runs:
            for side in (run.trtmc, run.baseline):
                cells = [e.entry.name, str(run.images), side.label, side.device or "", str(side.workers or 0),
                         str(side.batch or ""), "" if side.load_seconds is None else f"{side.load_seconds:.1f} s",
                         "" if side.seconds is None else f"{side.seconds:.2f} s", _gib(side.peak_rss_before_pass),
                         _gib(side.peak_rss), _gib(side.workers_peak_rss) if side.workers_peak_rss else "",
                         _gib(side.tree_peak_rss) if side.workers_peak_rss else "",
                         side.error or ("" if side.verdict is None or side.verdict.right else side.verdict.describe())]
                lines.append("| " + " | ".join(cells) + " |")
    return lines + [
        "",
        "Workers: trtmc's decode processes, the DataLoader's worker processes. Peak RSS: the process's own high-water "
        "mark (VmHWM) over its life, loading included; a worker's: the largest VmHWM of a worker process; with its "
        f"workers: the largest sum of the RSS of the process and its workers, sampled every {MEMORY_SAMPLE_SECONDS:g} s "
        "(pages a worker shares with the process it was forked from count in both: an upper bound).",
    ]


def _resumed_lines(result: BenchResult) -> list[str]:
    if not result.resumed:
        return []
    runs = ", ".join(f"{name} ({started})" for name, started in result.resumed.items())
    return [f"Timed in more than one run (`--resume`): {len(result.resumed)} of {len(result.entries)} entries come "
            f"from earlier runs in the same work folder, on this machine with these versions and options: {runs}. "
            "The time above is this run's.", ""]


def to_markdown(result: BenchResult) -> str:
    env = result.environment
    baselines = list(result.options.baselines)
    lines = [
        "# trtmc bench",
        "",
        f"{env.get('device_name', env['device'])} · torch {env['torch']} · trtmc {env['trtmc']}"
        + (f" (source {env['trtmc_source']})" if "trtmc_source" in env else "")
        + (f" · timm {env['timm']}" if "timm" in env else "")
        + f" · {result.started} · {result.seconds / 60:.1f} min",
        "",
        *_resumed_lines(result),
        "## Headline: trtmc's engine against the expert baseline",
        "",
        *_headline_lines(result),
        "",
        "## Every row",
        "",
    ]
    header = ["model", "precision", "batch", "oracle", "trtmc engine", "trtmc task"]
    header += [f"vs {BASELINE_SPECS[k].header}" for k in baselines]
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
            elif r.status == "wrong" and r.subject != TRTMC:
                notes.append(f"- {e.entry.name}: {r.label} batch {r.batch} answers wrong: {r.verdict.describe()}")
    if any(e.folder_runs for e in result.entries):
        lines += ["", "## Folder scope: files in, results out", "", *_folder_lines(result)]
    lines += ["", "## Protocol", "", *_protocol_lines(result)]
    lines += ["", "## Builds", "", *_build_lines(result)]
    lines += ["", "## Rows", "", *_row_lines(result)]
    if notes:
        lines += ["", "## Problems", ""] + notes
    return "\n".join(lines) + "\n"


def _panel_title(e: EntryResult) -> str:
    title = f"{e.entry.name} {e.entry.precision}"
    if e.status != "passed":
        return title + f" [{e.status.upper()}]"
    ratios = [(b, e.headline(b)) for b in e.entry.batch_sizes]
    shown = ", ".join(f"b{b} {r:.2f}×" for b, r in ratios if r is not None)
    return title + (f"\n{BASELINE_SPECS[HEADLINE].header} / trtmc: {shown}" if shown else "")


def plot(result: BenchResult, path: Path) -> Path | None:
    """Median latency against batch size, one panel per model, the headline ratio in each title; None
    (with a warning) without matplotlib.

    Unstable and wrong rows are drawn as hollow markers: visible, but marked as not being results.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    except ImportError:
        log.warning("matplotlib is not installed, so %s is not drawn: %s", path.name, INSTALL)
        return None
    panels = [e for e in result.entries if any(r.timing is not None for r in e.rows)]
    columns = max(1, min(3, len(panels)))
    rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.9 * rows), squeeze=False)
    for ax, e in zip(axes.flat, panels):
        series: dict[tuple[str, str], list[Row]] = {}
        for r in e.rows:
            if r.timing is not None:
                series.setdefault((r.label, r.scope), []).append(r)
        for (label, scope), points in series.items():
            points.sort(key=lambda r: r.batch)
            subject = points[0].subject
            bold = subject in (TRTMC, HEADLINE)
            color = COLORS.get(subject, "C7")
            ax.plot(
                [r.batch for r in points],
                [r.timing.median_ms for r in points],
                marker="o",
                linestyle="--" if scope == TASK else "-",
                linewidth=2.2 if bold else 1.2,
                color=color,
                label=f"{label} ({scope})" if subject == TRTMC else label,
            )
            hollow = [r for r in points if r.status in ("unstable", "wrong")]
            if hollow:
                ax.plot([r.batch for r in hollow], [r.timing.median_ms for r in hollow], linestyle="none",
                        marker="o", markersize=9, markerfacecolor="white", markeredgecolor=color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        values = [r.timing.median_ms for r in e.rows if r.timing is not None]
        # Label minor ticks only within a decade: over wider ranges they pile up.
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g") if max(values) < 10 * min(values) else NullFormatter())
        ax.set_xticks(list(e.entry.batch_sizes), [str(b) for b in e.entry.batch_sizes])
        ax.set_title(_panel_title(e), fontsize=10)
        ax.set_xlabel("batch size")
        ax.set_ylabel("median latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if not panels:
        axes.flat[0].text(0.5, 0.5, "no timings (see results.md)", ha="center", va="center")
    device = result.environment.get("device_name", result.environment["device"])
    fig.suptitle(f"trtmc bench: {device} (hollow markers: unstable or wrong, not results)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_results(result: BenchResult, out: Path, *, draw: bool = True) -> dict[str, Path]:
    """results.json, results.md and, with `draw`, latency.png in `out` (created if missing); the paths
    written. Drawing takes seconds with many entries: a run's partial reports leave it to the final one."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    path = out / RESULTS_JSON
    write_bytes_atomically(path, (json.dumps(to_json(result), indent=1) + "\n").encode())
    written["json"] = path
    path = out / RESULTS_MD
    write_bytes_atomically(path, to_markdown(result).encode())
    written["markdown"] = path
    png = plot(result, out / PLOT_PNG) if draw else None
    if png is not None:
        written["plot"] = png
    return written
