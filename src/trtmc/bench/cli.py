"""`trtmc bench`: the command line of the benchmark harness.

Importing this module loads neither torch, timm nor matplotlib (`trtmc --help` stays fast); the help
text is written from the constants the run uses (scopes, baselines, protocol, oracle).
"""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import replace
from pathlib import Path

from ..random_weights import INSTALL
from . import oracle, timing
from .results import ENGINE, FOLDER, SCOPE_TEXT, TASK
from .spec import (
    BASELINE_SPECS,
    BASELINES,
    DEFAULT_BASELINES,
    FOLDER_BASELINES,
    HEADLINE,
    LOADER_WORKERS_CAP,
    PRECISIONS,
    BenchConfig,
    BenchOptions,
    Entry,
    FolderSpec,
    SpecError,
    TimingProtocol,
    default_name,
    load_config,
)

DEFAULT_CONFIG = Path("benchmarks") / "performance.yaml"
WIDTH = 100


def _paragraph(text: str, label: str = "", indent: int = 0) -> str:
    """`text` wrapped for the help screen, after `label` in a column `indent` wide."""
    lead = f"  {label:{indent - 2}s}" if label else ""
    return textwrap.fill(text, WIDTH, initial_indent=lead, subsequent_indent=" " * len(lead))


def _description() -> str:
    photos = len(oracle.photo_files()) if oracle.PHOTOS.is_dir() else None
    return "\n\n".join([
        _paragraph("Benchmark trtmc against timm in one process on one device. For each entry (a model, a "
                   "precision, batch sizes and a protocol) it builds the bundle with `trtmc build` (timed), then "
                   "times, at every batch size:"),
        "\n".join(_paragraph(SCOPE_TEXT[scope], f"{scope} scope", 18) for scope in (ENGINE, TASK)),
        _paragraph(f"and each baseline: timm's model with the same weights, on the same device, at the same batch "
                   f"size, engine scope (default: {', '.join(DEFAULT_BASELINES)}; the headline ratio is {HEADLINE} "
                   f"ms / trtmc engine ms):"),
        "\n".join(_paragraph(BASELINE_SPECS[key].description, key, 18) for key in BASELINES),
        _paragraph(f"With --folder-images N (or an entry's `folder:`), also the {FOLDER} scope: "
                   + SCOPE_TEXT[FOLDER] + "."),
        _paragraph(timing.describe(TimingProtocol())),
        _paragraph(oracle.describe(oracle.SHIPPED_PHOTOS, photos)),
        _paragraph("Writes results.json, results.md and latency.png to --out; progress goes to stderr. Exit status "
                   "0 when every entry passed, 1 otherwise (wrong answer, error, unsupported architecture). Needs "
                   f"timm (random weights, baselines, oracle) and matplotlib (the plot): {INSTALL}"),
    ])


EPILOG = """\
examples:
  trtmc bench                                    # every entry of benchmarks/performance.yaml
  trtmc bench --random-weights                   # offline (the GPU machine): random weights in the
                                                 # Hugging Face layout for every non-local model
  trtmc bench --only resnet50 --only vit_base_patch16_224 --batch 1
  trtmc bench --model ghostnet_100 --random-weights --precision fp16 --batch 1 --batch 128
  trtmc bench --model ./my_checkpoint --max-autotune --out bench-ghostnet
  trtmc bench --model examples/checkpoints/tf_efficientnet_lite0.in1k --batch 64 --no-baselines \\
              --folder-images 2002 --folder-images 20000   # files in, results out, against a DataLoader
  trtmc bench --device cpu --model regnetx_002 --random-weights --precision fp32 --batch 1 \\
              --baseline eager-fp32                # exercise the harness without a GPU
  trtmc bench --list

from a source tree: PYTHONPATH=src python -m trtmc bench --random-weights --out bench-results
"""


def add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark bundles against timm eager and torch.compile",
        description=_description(),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to run")
    what.add_argument("--config", type=Path, metavar="FILE",
                      help=f"benchmark entries (YAML; default {DEFAULT_CONFIG} when --model is not given)")
    what.add_argument("--only", action="append", metavar="NAME", default=[],
                      help="run only this entry of the config; repeatable")
    what.add_argument("--list", action="store_true", help="list the config's entries and exit")
    what.add_argument("--model", metavar="MODEL",
                      help="bench one model instead of a config: Hugging Face id, checkpoint folder, "
                           "or timm architecture name (with --random-weights)")
    what.add_argument("--name", help="entry name for --model (default: the model's short name)")
    what.add_argument("--precision", choices=PRECISIONS,
                      help="precision of --model (default fp16); with a config, overrides every entry's")
    what.add_argument("--batch", type=int, action="append", metavar="N",
                      help="batch size, repeatable (default for --model: 1 and 128); with a config, "
                           "overrides every entry's")
    what.add_argument("--photos", type=Path, metavar="DIR",
                      help=f"the oracle's folder of images (default: the entry's, else {oracle.SHIPPED_PHOTOS})")
    what.add_argument("--random-weights", action="store_true",
                      help="write a random-weight checkpoint (Hugging Face layout) for every entry whose "
                           "model is not a local folder; needs no network")
    what.add_argument("--seed", type=int, help="seed of the random weights (default: the entry's, 0)")
    what.add_argument("--folder-images", type=int, action="append", metavar="N",
                      help="also run the folder scope on a folder of N image files (the oracle's photos copied "
                           "round-robin into --workdir), repeatable; with a config, replaces every entry's counts")
    what.add_argument("--loader-workers", type=int, metavar="N",
                      help=f"the folder scope's DataLoader num_workers (default: the cores, at most {LOADER_WORKERS_CAP})")
    what.add_argument("--folder-baseline", choices=FOLDER_BASELINES,
                      help="how the folder scope's DataLoader baseline runs timm: compile (default: torch.compile, "
                           "default mode) or eager (no compile: a quick check of the harness on a CPU)")

    how = p.add_argument_group("how")
    how.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                     help="device to build for and time on (default cuda; cpu exercises the harness)")
    how.add_argument("--backend", default="inductor", metavar="NAME",
                     help="the trtmc engine to build and time: inductor (default), tensorrt where TensorRT runs, "
                          "or reference (the uncompiled graph)")
    how.add_argument("--baseline", action="append", choices=BASELINES, dest="baselines", metavar="KEY",
                     help=f"baseline to time, repeatable; replaces the default set "
                          f"({', '.join(DEFAULT_BASELINES)}); choices: {', '.join(BASELINES)}")
    how.add_argument("--max-autotune", action="store_true",
                     help='also time torch.compile(mode="max-autotune") (its compile takes minutes)')
    how.add_argument("--no-baselines", action="store_true",
                     help="time trtmc only (the folder scope still runs its DataLoader baseline)")
    how.add_argument("--prepare-jobs", type=int, default=0, metavar="N",
                     help="first run the entries' CPU-bound part in N processes at a time (random weights; each "
                          "entry's trtmc build and, in a process of its own, the cold torch.compile of its "
                          "baselines, filling Inductor's disk caches), then time every entry one after another; "
                          "build times are then measured under that load")
    how.add_argument("--prepare-only", action="store_true",
                     help="only run the CPU-bound part of each entry (with --prepare-jobs N: N at a time), then exit")
    how.add_argument("--reuse-prepared", action="store_true",
                     help="time with the bundles a --prepare-only run left in --workdir (their build times as recorded)")
    how.add_argument("--resume", action="store_true",
                     help="take every entry that an earlier run in the same --workdir finished, on this machine with "
                          "these versions and the same entry settings (the host's kernel release may differ; the report "
                          "lists each), from its record (WORKDIR/timed/) instead of timing it again; the report says "
                          "which. A long bench can so run as several shorter ones, e.g. --only A --only B, then "
                          "--resume over all entries")
    default = TimingProtocol()
    how.add_argument("--warmups", type=int, metavar="N", help=f"warm-up rounds per row (default {default.warmups})")
    how.add_argument("--iters", type=int, metavar="N", help=f"measured rounds per row (default {default.iters})")
    how.add_argument("--margin", type=float, metavar="F",
                     help=f"stability and equivalence margin as a fraction (default {default.margin:g})")
    how.add_argument("--round-ms", type=float, metavar="MS",
                     help=f"the least length of a round of back-to-back calls (default {default.round_ms:g})")
    how.add_argument("--host-round-ms", type=float, metavar="MS",
                     help=f"the least length of a round of a row timed on the host clock, the task scope "
                          f"(default {default.host_round_ms:g})")

    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, default=Path("bench-results"), metavar="DIR",
                     help="folder for results.json, results.md and latency.png (default bench-results)")
    out.add_argument("--workdir", type=Path, metavar="DIR",
                     help="folder for random-weight checkpoints and bundles (default OUT/work)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=_cmd_bench)


def _protocol_overrides(args) -> dict:
    given = (("warmups", args.warmups), ("iters", args.iters), ("margin", args.margin), ("round_ms", args.round_ms),
             ("host_round_ms", args.host_round_ms))
    return {k: v for k, v in given if v is not None}


def _with_folder(entry: Entry, args) -> Entry:
    """`entry` with the command line's folder-scope options applied."""
    folder = entry.folder
    if args.folder_images:
        folder = FolderSpec(tuple(args.folder_images)) if folder is None else replace(folder, images=tuple(args.folder_images))
    if folder is None:
        return entry
    if args.loader_workers is not None:
        folder = replace(folder, loader_workers=args.loader_workers)
    if args.folder_baseline is not None:
        folder = replace(folder, baseline=args.folder_baseline)
    return replace(entry, folder=folder)


def entries_from_args(args) -> tuple[Entry, ...]:
    """The entries the command line asks for, overrides applied and validated."""
    if args.model is not None:
        if args.config is not None or args.only:
            raise SpecError("--model benches one model; it cannot be combined with --config or --only")
        local = Path(args.model).expanduser().exists()
        entries: tuple[Entry, ...] = (
            Entry(
                name=args.name or default_name(args.model),
                model=str(Path(args.model).expanduser().resolve()) if local else args.model,
                precision=args.precision or "fp16",
                batch_sizes=tuple(args.batch or (1, 128)),
                photos=args.photos,
                seed=args.seed or 0,
                protocol=TimingProtocol(),
            ),
        )
    else:
        if args.name is not None:
            raise SpecError("--name names the --model entry; config entries have their own names")
        config: BenchConfig = load_config(args.config or DEFAULT_CONFIG)
        entries = config.select(args.only)
        changes = {}
        if args.precision:
            changes["precision"] = args.precision
        if args.batch:
            changes["batch_sizes"] = tuple(args.batch)
        if args.photos:
            changes["photos"] = args.photos
        if args.seed is not None:
            changes["seed"] = args.seed
        entries = tuple(replace(e, **changes) for e in entries)
    entries = tuple(_with_folder(e, args) for e in entries)
    if (args.loader_workers is not None or args.folder_baseline) and not any(e.folder for e in entries):
        raise SpecError("--loader-workers and --folder-baseline set up the folder scope: add --folder-images N "
                        "(or a `folder:` to the entries)")
    overrides = _protocol_overrides(args)
    result = []
    for entry in entries:
        if overrides:
            entry = replace(entry, protocol=replace(entry.protocol, **overrides))
        if args.random_weights:
            entry = entry.with_random_weights()
        entry.validate(f"entry {entry.name}")
        if entry.weights == "checkpoint" and "/" not in entry.model and not Path(entry.model).expanduser().exists():
            raise SpecError(
                f"entry {entry.name}: {entry.model!r} is a timm architecture name, not a checkpoint: pass "
                f"--random-weights (or set `weights: random`), or give a Hugging Face id such as timm/{entry.model}"
            )
        result.append(entry)
    return tuple(result)


def _baselines(args) -> tuple[str, ...]:
    if args.no_baselines:
        if args.baselines or args.max_autotune:
            raise SpecError("--no-baselines cannot be combined with --baseline or --max-autotune")
        return ()
    keys = list(dict.fromkeys(args.baselines or DEFAULT_BASELINES))
    if args.max_autotune and "max-autotune" not in keys:
        keys.append("max-autotune")
    return tuple(keys)


def _cmd_bench(args) -> int:
    from ..progress import Progress
    from ..random_weights import require_timm

    entries = entries_from_args(args)
    if args.list:
        for e in entries:
            print(f"{e.name:28s} {e.precision}  batch {','.join(map(str, e.batch_sizes)):10s} "
                  f"{e.weights:10s} {e.model}")
        return 0
    try:
        require_timm()
    except RuntimeError as exc:
        raise RuntimeError(f"trtmc bench needs timm (random weights, baselines, the oracle): {INSTALL}") from exc
    from .report import write_results
    from .prepare import prepare_entries, prepare_entry
    from .runner import run_bench

    options = BenchOptions(
        workdir=args.workdir or args.out / "work",
        device=args.device,
        baselines=_baselines(args),
        reuse_bundles=args.reuse_prepared,
        backend=args.backend,
        resume=args.resume,
    )
    progress = Progress(args.quiet)
    if args.prepare_jobs > 0:
        prepare_entries(entries, options, args.prepare_jobs, progress, quiet=args.quiet)
        options = replace(options, reuse_bundles=True)
    elif args.prepare_only:
        for entry in entries:
            prepare_entry(entry, options, progress=lambda m, n=entry.name: progress(f"[prepare {n}] {m}"))
    if args.prepare_only:
        return 0
    progress(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} on {args.device}; "
             f"baselines: {', '.join(options.baselines) or 'none'}")
    # After each entry timed, its rows so far (a run cut short keeps them); the plot only once, at the end.
    result = run_bench(entries, options, progress=progress,
                       on_result=lambda partial: write_results(partial, args.out, draw=False))
    written = write_results(result, args.out)
    for e in result.entries:
        line = f"{e.entry.name:28s} {e.status}"
        if e.message:
            line += f": {e.message}"
        print(line)
    for path in written.values():
        print(f"wrote {path}")
    return 0 if result.ok else 1
