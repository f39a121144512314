"""Run a command and append its wall time and peak resident memory to a JSON Lines file.

    python tools/measure.py OUT.jsonl NAME -- trtmc classify lite0.bundle photos/ --top-k 1 -q

Used by tools/gpu_session.sh for the cold-start and folder numbers in benchmarks/NOTES.md: the
first-answer time of `trtmc classify` is the wall time of a fresh process, and peak RSS is
ru_maxrss over the process tree (Linux reports it in KiB).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    out, name, command = argv[0], argv[1], argv[3:]
    started = time.perf_counter()
    done = subprocess.run(command)
    wall = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    record = {"name": name, "command": command, "returncode": done.returncode, "wall_s": round(wall, 3), "peak_rss_mb": round(peak_kib / 1024, 1)}
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
