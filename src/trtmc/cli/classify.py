"""`trtmc classify`: images in (files, folders, @lists, globs), one result per image out, streamed.

The images go through `trtmc.pipeline` (parallel decoding, fixed-size batches, results in input
order). Results print as text, JSON Lines (`--json`, or `--output x.jsonl`) or CSV (`--output x.csv`);
an unreadable file becomes an error record and the run goes on, exiting 1 at the end. With `-v` the
command logs where its time went up to the first result (start-up, imports, bundle, engine, first
batch), the cold-start breakdown.

Image decoding bounds a classify run, far below what even the uncompiled graph runs at on a GPU, so
the command loads engines for a quick start (`LoadOptions`): the CUDA inductor engine answers at once
from its graph, uncompiled, instead of compiling first. `--compiled` asks for the compiled engine,
for runs the engine bounds.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from ..files import write_text_atomically
from ..progress import seconds_since_process_start

if TYPE_CHECKING:
    from ..backends import Engine

log = logging.getLogger("trtmc.classify")

OUTPUT_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}


def add(sub) -> None:
    from ..backends import BACKENDS

    p = sub.add_parser(
        "classify",
        help="classify images with a bundle",
        description="Print the most likely classes of each image, with label names where the checkpoint gave them. "
        "Images are files in any format Pillow reads (JPEG, PNG, WebP, BMP, GIF, TIFF, ...), folders (searched "
        "recursively for image files), @FILE lists (one path per line) or quoted globs ('photos/*.jpg').",
        epilog="examples:\n"
        "  trtmc classify lite0.bundle photo.jpg\n"
        "  trtmc classify lite0.bundle photos/ --top-k 1 --output scores.csv\n"
        "  trtmc classify lite0.bundle @todo.txt 'more/*.png' --json > scores.jsonl\n"
        "  trtmc classify lite0.bundle --image a.jpg b.png --top-k 3 --expect-sha256 $(cat lite0.sha256)\n\n"
        "exit status: 0 when every image was classified, 1 when any could not be (each is reported, the run goes on)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("bundle", type=Path, help="bundle file written by `trtmc build`")
    p.add_argument("images", nargs="*", metavar="IMAGE", help="image files, folders, @FILE lists or quoted globs")
    p.add_argument("--image", nargs="+", action="extend", default=[], metavar="IMAGE", dest="more_images",
                   help="more images, as above (the same as listing them after BUNDLE)")
    p.add_argument("--top-k", type=int, default=5, help="classes to show per image (default 5)")
    p.add_argument("--json", action="store_true",
                   help="JSON Lines on stdout: one object per image with image, engine, logits (all, checkpoint order) "
                        "and top (index, score, label, description), or image and error")
    p.add_argument("-o", "--output", type=Path, metavar="FILE",
                   help="write the results to FILE instead of stdout: .jsonl (as --json) or .csv (image, then index, "
                        "score and label for each of the top-k, then error); written atomically")
    p.add_argument("--batch-size", type=int, metavar="N", help="images per engine call (default: the engine's largest)")
    p.add_argument("--workers", type=int, metavar="N", help="decoding processes (default: one per CPU this process may use)")
    p.add_argument("--resize-on", choices=("auto", "device", "workers"), default="auto",
                   help="where images are resized: 'device' (workers only decode; the engine's device resizes with "
                        "Pillow's exact arithmetic, the same pixels as timm), 'workers' (the decoding processes "
                        "resize and crop), 'auto' (device on a CUDA engine, else workers)")
    p.add_argument("--engine", metavar="NAME",
                   help=f"use this engine: a backend ({', '.join(BACKENDS)}) or an engine key from `trtmc inspect`; "
                        "default: the first that runs here")
    p.add_argument("--compiled", action="store_true",
                   help="compile the engine from the bundle's caches before the first answer (about 15 s on a GPU) "
                        "for faster engine calls: worth it only where the engine, not decoding, bounds the run; "
                        "the default answers at once from the uncompiled graph (same precision). Engines that "
                        "are compiled code already (TensorRT plans, CPU packages) load the same either way")
    p.add_argument("--expect-sha256", metavar="HEX",
                   help="refuse the bundle, before anything in it loads, unless its digest (printed by "
                        "`trtmc inspect`) is HEX: a bundle runs native code, so pin the one you trust")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line on stderr")
    p.set_defaults(run=run)


def _refuse_checkpoints(bundle: Path) -> None:
    """A checkpoint folder or a Hugging Face id where a bundle belongs: say how to make the bundle."""
    text = str(bundle)
    fix = f"build a bundle from it first: `trtmc build {text} -o model.bundle`, then `trtmc classify model.bundle ...`"
    if bundle.is_dir() and (bundle / "config.json").is_file():
        raise ValueError(f"{text} is a checkpoint folder, not a bundle; {fix}")
    if not bundle.exists() and text.count("/") == 1 and not text.startswith((".", "/")) and not text.endswith(".bundle"):
        raise ValueError(f"{text} looks like a Hugging Face model id, not a bundle file; {fix}")


class _Timeline:
    """The cold-start breakdown `-v` logs: each step's seconds, from the process's start."""

    def __init__(self) -> None:
        self.origin = time.perf_counter() - (seconds_since_process_start() or 0.0)
        self.last = self.origin
        self.step("start-up (interpreter and trtmc's command line)")

    def step(self, what: str) -> None:
        now = time.perf_counter()
        log.info("%6.2f s  %s (+%.2f s)", now - self.origin, what, now - self.last)
        self.last = now


def loaded_engine_step(key: str, engine: Engine) -> str:
    """The timeline's line for the engine that loaded, saying when it is the uncompiled quick start."""
    from ..backends.inductor import UncompiledCudaEngine

    how = " (uncompiled, quick start)" if isinstance(engine, UncompiledCudaEngine) else ""
    return f"engine {key} loaded{how}"


def _top(runtime, logits, k: int):
    from ..tasks import ClassScores

    return ClassScores(logits[None], runtime.label_names, runtime.label_descriptions).top(k)[0]


def _text_writer(out: TextIO, runtime, k: int) -> Callable:
    def write(result) -> None:
        print(result.image, file=out)
        if not result.ok:
            print(f"  error: {result.error}", file=out)
            return
        for rank, t in enumerate(_top(runtime, result.logits, k), 1):
            label = f"{t.label}  {t.description}".strip() or "(no label in checkpoint)"
            print(f"  {rank}. {t.index:5d}  {t.score:7.2%}  {label}", file=out)

    return write


def _jsonl_writer(out: TextIO, runtime, k: int) -> Callable:
    def write(result) -> None:
        if not result.ok:
            record = {"image": result.image, "error": result.error}
        else:
            record = {
                "image": result.image,
                "engine": runtime.choice.key,
                "logits": [float(v) for v in result.logits],
                "top": [t.__dict__ for t in _top(runtime, result.logits, k)],
            }
        out.write(json.dumps(record) + "\n")

    return write


def _csv_writer(out: TextIO, runtime, k: int) -> Callable:
    rows = csv.writer(out)
    rows.writerow(["image", *(f"{field}_{rank}" for rank in range(1, k + 1) for field in ("index", "score", "label")), "error"])

    def write(result) -> None:
        if not result.ok:
            rows.writerow([result.image, *[""] * (3 * k), result.error])
            return
        top = _top(runtime, result.logits, k)
        rows.writerow([result.image, *(v for t in top for v in (t.index, f"{t.score:.6g}", t.label)), ""])

    return write


def _output_format(args) -> str:
    if args.output is None:
        return "jsonl" if args.json else "text"
    fmt = OUTPUT_FORMATS.get(args.output.suffix.lower())
    if fmt is None:
        raise ValueError(f"--output {args.output}: give a .jsonl or .csv file name")
    if args.json and fmt != "jsonl":
        raise ValueError(f"--json prints JSON Lines; it cannot go to the CSV file {args.output}")
    if not args.output.parent.is_dir():
        raise ValueError(f"--output {args.output}: folder {args.output.parent} does not exist")
    return fmt


def run(args) -> int:
    timeline = _Timeline()
    if args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1, got {args.top_k}")
    fmt = _output_format(args)
    _refuse_checkpoints(args.bundle)
    from ..pipeline import PipelineOptions, classify_files, expand_images

    specs = [*args.images, *args.more_images]
    if not specs:
        raise ValueError("no images given: list image files, folders, @FILE lists or globs after the bundle")
    paths = expand_images(specs)  # a missing file or empty folder stops here, before any engine loads
    options = PipelineOptions(batch_size=args.batch_size, workers=args.workers, resize_on=args.resize_on)
    options.validate()
    from ..bundle import read_bundle
    from ..runtime import LoadOptions, Runtime

    timeline.step("imports (torch, trtmc's runtime)")
    bundle = read_bundle(args.bundle, args.expect_sha256)
    timeline.step(f"bundle read and verified ({args.bundle})")
    runtime = Runtime(bundle, engine=args.engine, options=LoadOptions(quick_start=not args.compiled))
    timeline.step(loaded_engine_step(runtime.choice.key, runtime.engine))
    # What the first batch may spend its time on: a compiled CUDA engine compiles from its caches there.
    first_batch_work = ": compile from caches, CUDA-graph capture" if args.compiled else ""
    writers = {"text": _text_writer, "jsonl": _jsonl_writer, "csv": _csv_writer}

    def classify(out: TextIO) -> tuple[int, int]:
        from tqdm import tqdm

        write = writers[fmt](out, runtime, args.top_k)
        done = failed = 0
        bar = tqdm(total=len(paths), unit="img", file=sys.stderr, disable=args.quiet or not sys.stderr.isatty())
        with bar:
            for result in classify_files(runtime, paths, options):
                write(result)
                done, failed = done + 1, failed + (not result.ok)
                if done == 1:
                    out.flush()
                    timeline.step(f"first result written (first batch{first_batch_work})")
                bar.update()
        return done, failed

    started = time.perf_counter()
    if args.output is None:
        done, failed = classify(sys.stdout)
    else:
        counts: list[tuple[int, int]] = []
        write_text_atomically(args.output, lambda out: counts.append(classify(out)))
        done, failed = counts[0]
    seconds = time.perf_counter() - started
    timeline.step("all results written")
    if not args.quiet:
        rate = done / seconds if seconds > 0 else float("inf")
        where = f" to {args.output}" if args.output else ""
        print(f"trtmc: {done} images{where}, {failed} failed, {rate:.1f} images/s, {seconds:.2f} s "
              f"({runtime.choice.key})", file=sys.stderr)
    return 1 if failed else 0
