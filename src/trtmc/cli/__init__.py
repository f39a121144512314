"""The `trtmc` command: one module per subcommand (build, classify, inspect and families, decode,
study), plus `bench` from trtmc.bench.cli. Importing it loads neither torch nor TensorRT: `trtmc --help`
stays fast, and each command imports what it needs when it runs."""

from __future__ import annotations

import argparse
import logging
import sys

from ..bench.cli import add_bench
from . import build, classify, decode, inspect, study

DESCRIPTION = """\
trtmc turns a timm image classifier (a Hugging Face id such as timm/ghostnet_100.in1k, or a local
folder with config.json + model.safetensors) into one self-describing bundle file, compiled by
TensorRT and/or PyTorch Inductor, and classifies images with it.

  trtmc build timm/ghostnet_100.in1k -o ghostnet.bundle
  trtmc classify ghostnet.bundle photo.jpg
"""

VERBOSE_HELP = "log details, timings and tracebacks on errors (before or after the command)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trtmc", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build.add(sub)
    classify.add(sub)
    inspect.add(sub)
    inspect.add_families(sub)
    decode.add(sub)
    add_bench(sub)
    study.add(sub)
    for command in sub.choices.values():
        # `trtmc classify -v ...` as well as `trtmc -v classify ...`; SUPPRESS keeps the top-level value
        # when the flag is not repeated after the command.
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="trtmc: %(message)s")
    # torch's C++ extension loader warns about a missing CUDA toolkit on CPU machines: not ours to report.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("trtmc: interrupted", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, OSError, TypeError) as exc:  # one clear line; -v shows the traceback
        if args.verbose:
            raise
        print(f"trtmc: error: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: Exception) -> str:
    """The error's first line: details (a native library's report, a hub's message) stay for -v."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    more = " (more with -v)" if len(lines) > 1 else ""
    return lines[0] + more
