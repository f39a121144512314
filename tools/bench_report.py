"""A bench's report from its records alone, for a bench whose last GPU call ran out of time before its report.

`tools/gpu_bench.sh run` leaves every timed entry's record in timed.tar.gz; its `report` step reads them back on the
same machine (`trtmc bench --resume`). When the device time ends first, this renders the same results.json,
results.md and latency.png here from the records' own results, environment and options
(`trtmc.bench.runner.recorded_result`, then `write_results`): nothing is timed or judged again. Every entry of
benchmarks/performance.yaml (or --config), as `trtmc bench --random-weights` defines it, needs a record of that very
entry. As in a `--resume` report, each entry is listed with the start of the run that timed it, and the report's
time is this assembly's. With --partial (a bench whose session ended before every entry was timed), the report
holds the entries that have a record and names the others.

    python tools/bench_report.py timed.tar.gz --out benchmarks/results/RUN [--config benchmarks/performance.yaml]
        [--partial]
"""

from __future__ import annotations

import argparse
import tarfile
import tempfile
from pathlib import Path

from trtmc.bench.report import write_results
from trtmc.bench.runner import recorded_entries, recorded_result
from trtmc.bench.spec import load_config

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "benchmarks" / "performance.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, help="a call's timed.tar.gz (a folder timed/ of NAME.pickle inside)")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json, results.md, latency.png")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the bench's entries, in their order")
    parser.add_argument("--partial", action="store_true",
                        help="report only the entries with a record (a bench cut short), naming the others")
    args = parser.parse_args()
    entries = [e.with_random_weights() for e in load_config(args.config).entries]  # as `trtmc bench --random-weights`
    with tempfile.TemporaryDirectory() as workdir:
        with tarfile.open(args.records) as tar:
            tar.extractall(workdir, filter="data")
        if args.partial:
            recorded = recorded_entries(entries, Path(workdir))
            missing = [e.name for e in entries if e not in recorded]
            entries = recorded
            print(f"{len(entries)} entries with a record; without one: {', '.join(missing) or 'none'}")
        try:
            result = recorded_result(entries, Path(workdir))
        except ValueError as exc:
            raise SystemExit(f"{args.records}: {exc}") from None
    for path in write_results(result, args.out).values():
        print(f"wrote {path}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
