"""`trtmc bench`: the command line of the benchmark harness."""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import replace
from pathlib import Path

from .spec import (
    BASELINES,
    DEFAULT_BASELINES,
    PRECISIONS,
    BenchConfig,
    Entry,
    SpecError,
    TimingProtocol,
    default_name,
    load_config,
)

DEFAULT_CONFIG = Path("benchmarks") / "performance.yaml"

DESCRIPTION = """\
Benchmark trtmc against timm in one process on one device. For each entry (a model, a precision,
batch sizes and a protocol) it builds the bundle with `trtmc build` (timed), then times:

  engine scope  device-resident input to complete float32 logits, synchronized (CUDA events);
                trtmc replays a CUDA graph per compiled batch size
  task scope    host RGB float32 arrays in, host logits out (image_to_class_scores: preprocessing,
                transfer, engine, copy back; decoding the photo is not timed)
  baselines     timm's model with the same weights, same device, same batch, engine scope:
                eager fp32; eager in the entry's precision, channels_last;
                torch.compile(mode="reduce-overhead") of the latter; max-autotune on request

Protocol per row: one first call (timed on its own: compile or graph capture), 3 warm-ups, 10
measurements; the median is the result. A row spreading more than the margin (5%) around its
median is re-run once, then marked unstable instead of reported. The headline is baseline ms /
trtmc engine ms, within 1 +- margin counting as on par. Oracle: trtmc's top class on the entry's
photo (engine scope, every batch row) must equal timm fp32 eager's, or the entry fails whatever its
speed. Writes results.json, results.md and latency.png to --out; progress goes to stderr. Exit
status 0 when every entry passed, 1 otherwise (wrong answer, error, unsupported architecture).
"""

EPILOG = """\
examples:
  trtmc bench                                    # every entry of benchmarks/performance.yaml
  trtmc bench --random-weights                   # offline (the GPU machine): random weights in the
                                                 # Hugging Face layout for every non-local model
  trtmc bench --only resnet50 --only vit_base_patch16_224 --batch 1
  trtmc bench --model ghostnet_100 --random-weights --precision fp16 --batch 1 --batch 128
  trtmc bench --model ./my_checkpoint --max-autotune --out bench-ghostnet
  trtmc bench --device cpu --model regnetx_002 --random-weights --precision fp32 --batch 1 \\
              --baseline eager-fp32                # exercise the harness without a GPU
  trtmc bench --list

from a source tree: PYTHONPATH=src python -m trtmc bench --random-weights --out bench-results
"""


def add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark bundles against timm eager and torch.compile",
        description=DESCRIPTION,
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
    what.add_argument("--photo", type=Path, metavar="FILE",
                      help="the oracle's image (default: the entry's, else examples/images/chelsea.png)")
    what.add_argument("--random-weights", action="store_true",
                      help="write a random-weight checkpoint (Hugging Face layout) for every entry whose "
                           "model is not a local folder; needs no network")
    what.add_argument("--seed", type=int, help="seed of the random weights (default: the entry's, 0)")

    how = p.add_argument_group("how")
    how.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                     help="device to build for and time on (default cuda; cpu exercises the harness)")
    how.add_argument("--baseline", action="append", choices=BASELINES, dest="baselines", metavar="KEY",
                     help=f"baseline to time, repeatable; replaces the default set "
                          f"({', '.join(DEFAULT_BASELINES)}); choices: {', '.join(BASELINES)}")
    how.add_argument("--max-autotune", action="store_true",
                     help='also time torch.compile(mode="max-autotune") (its compile takes minutes)')
    how.add_argument("--no-baselines", action="store_true", help="time trtmc only")
    how.add_argument("--prepare-jobs", type=int, default=0, metavar="N",
                     help="first run N entries at a time through their CPU-bound part (random weights, trtmc "
                          "build, cold torch.compile of the baselines, filling Inductor's disk caches), then "
                          "time every entry one after another; build times are then measured under that load")
    how.add_argument("--prepare-only", action="store_true",
                     help="only run the CPU-bound part of each entry (with --prepare-jobs N: N at a time), then exit")
    how.add_argument("--reuse-prepared", action="store_true",
                     help="time with the bundles a --prepare-only run left in --workdir (their build times as recorded)")
    how.add_argument("--warmups", type=int, metavar="N", help="warm-up calls per row (default 3)")
    how.add_argument("--iters", type=int, metavar="N", help="measured calls per row (default 10)")
    how.add_argument("--margin", type=float, metavar="F",
                     help="stability and equivalence margin as a fraction (default 0.05)")

    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, default=Path("bench-results"), metavar="DIR",
                     help="folder for results.json, results.md and latency.png (default bench-results)")
    out.add_argument("--workdir", type=Path, metavar="DIR",
                     help="folder for random-weight checkpoints and bundles (default OUT/work)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=_cmd_bench)


def _protocol_overrides(args) -> dict:
    return {k: v for k, v in (("warmups", args.warmups), ("iters", args.iters), ("margin", args.margin)) if v is not None}


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
                photo=args.photo,
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
        if args.photo:
            changes["photo"] = args.photo
        if args.seed is not None:
            changes["seed"] = args.seed
        entries = tuple(replace(e, **changes) for e in entries)
    overrides = _protocol_overrides(args)
    result = []
    for entry in entries:
        if overrides:
            entry = replace(entry, protocol=replace(entry.protocol, **overrides))
        if args.random_weights and not Path(entry.model).expanduser().is_dir():
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


def _prepare_in_parallel(args, entries, progress) -> None:
    """One `trtmc bench ... --prepare-only --only NAME` subprocess per entry, `--prepare-jobs` at a time."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    argv = _drop_options(sys.argv[1:], ("--prepare-jobs", "--only", "--workdir"))
    workdir = str(args.workdir or args.out / "work")

    def prepare(entry):
        only = [] if args.model else ["--only", entry.name]  # --model names one entry already
        cmd = [sys.executable, "-m", "trtmc", *argv, "--prepare-only", *only, "--workdir", workdir]
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        status = "ok" if done.returncode == 0 else f"failed: {done.stderr.strip()[-300:]}"
        progress(f"prepared {entry.name} in {time.perf_counter() - started:.0f} s: {status}")

    progress(f"preparing {len(entries)} entries, {args.prepare_jobs} at a time")
    with ThreadPoolExecutor(args.prepare_jobs) as pool:
        list(pool.map(prepare, entries))


def _drop_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """argv without the given `--name VALUE` options."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = True
        elif not any(a.startswith(n + "=") for n in names):
            out.append(a)
    return out


def _cmd_bench(args) -> int:
    from ..progress import Progress
    from .report import write_results
    from .runner import BenchOptions, run_bench

    entries = entries_from_args(args)
    if args.list:
        for e in entries:
            print(f"{e.name:28s} {e.precision}  batch {','.join(map(str, e.batch_sizes)):10s} "
                  f"{e.weights:10s} {e.model}")
        return 0
    options = BenchOptions(
        workdir=args.workdir or args.out / "work",
        device=args.device,
        baselines=_baselines(args),
    )
    progress = Progress(args.quiet)
    if args.prepare_jobs > 0:
        _prepare_in_parallel(args, entries, progress)
        options = dataclasses.replace(options, reuse_bundles=True)
    elif args.prepare_only:
        from .runner import prepare_entry

        for entry in entries:
            prepare_entry(entry, options, progress=lambda m, n=entry.name: progress(f"[prepare {n}] {m}"))
    if args.prepare_only:
        return 0
    if args.reuse_prepared:
        options = dataclasses.replace(options, reuse_bundles=True)
    progress(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} on {args.device}; "
             f"baselines: {', '.join(options.baselines) or 'none'}")
    result = run_bench(entries, options, progress=progress, on_result=lambda partial: write_results(partial, args.out))
    written = write_results(result, args.out)
    for e in result.entries:
        line = f"{e.entry.name:28s} {e.status}"
        if e.message:
            line += f": {e.message}"
        print(line)
    for path in written.values():
        print(f"wrote {path}")
    return 0 if result.ok else 1
