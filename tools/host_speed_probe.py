"""How the lent GPU machine's host speed changes, CPU by CPU (issue 12: the task rows follow the host).

Run 13 found the host's speed, probed with a pure-Python loop after every attempt at the task rows
(`trtmc.bench.timing.HostSpeed`), at 0.39-0.90 of its quickest reading. This tool says whether that slowdown is per
CPU (another guest on a
sibling hyperthread: pinning the bench to a quiet CPU would help) or the whole host's (frequency, memory), and
whether the bench's own threads cause it (torch's threaded staging copy, whose workers may spin after it):

1. `--seconds` of probes, round-robin over every CPU this process may use, each pinned to one CPU: the quickest of
   three ~1 ms pure-Python loops, 20 ms apart; a 64 MiB numpy copy on every 16th probe.
2. The same loop unpinned, right after a 256 MiB torch copy on all torch threads, and after a 20 ms sleep,
   alternating.

Writes OUT.json (every reading) and prints a summary per CPU and per phase.

    PYTHONPATH=src python3 tools/host_speed_probe.py OUT.json [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from trtmc.bench.timing import HostSpeed


def _copy_seconds(megabytes: int) -> float:
    import numpy as np

    src = np.ones(megabytes * 2**20 // 8)
    dst = np.empty_like(src)
    started = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    host = HostSpeed()
    readings, copies = [], []
    started = time.perf_counter()
    i = 0
    while time.perf_counter() - started < args.seconds:
        cpu = cpus[i % len(cpus)]
        os.sched_setaffinity(0, {cpu})
        readings.append({"t": round(time.perf_counter() - started, 3), "cpu": cpu, "s": host.probe()})
        if i % 16 == 0:
            copies.append({"t": round(time.perf_counter() - started, 3), "cpu": cpu, "s": _copy_seconds(64)})
        i += 1
        time.sleep(0.02)
    os.sched_setaffinity(0, set(cpus))

    import torch

    big, target = torch.ones(64 * 2**20), torch.empty(64 * 2**20)
    after = {"threaded_copy": [], "sleep": []}
    for k in range(200):
        if k % 2:
            target.copy_(big)
            after["threaded_copy"].append(host.probe())
        else:
            time.sleep(0.02)
            after["sleep"].append(host.probe())
    topology = {}
    for cpu in cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        topology[cpu] = path.read_text().strip() if path.is_file() else ""
    fastest = min(r["s"] for r in readings)
    summary = {}
    for cpu in cpus:
        speeds = sorted(fastest / r["s"] for r in readings if r["cpu"] == cpu)
        summary[cpu] = {"median": round(statistics.median(speeds), 3), "p10": round(speeds[len(speeds) // 10], 3),
                        "p90": round(speeds[9 * len(speeds) // 10], 3), "n": len(speeds)}
        print(f"cpu {cpu:2d} (siblings {topology[cpu]:>6}): speed median {summary[cpu]['median']:.3f}, "
              f"p10 {summary[cpu]['p10']:.3f}, p90 {summary[cpu]['p90']:.3f} ({len(speeds)} probes)")
    # Is the slowdown shared? Speeds of consecutive probes on different CPUs, second by second.
    by_second: dict[int, list[float]] = {}
    for r in readings:
        by_second.setdefault(int(r["t"]), []).append(fastest / r["s"])
    seconds = {s: round(statistics.median(v), 3) for s, v in sorted(by_second.items())}
    print("median speed over all CPUs, second by second:", " ".join(f"{v:.2f}" for v in seconds.values()))
    for name, values in after.items():
        print(f"unpinned, after {name}: speed median {statistics.median(fastest / v for v in values):.3f}")
    copy_ms = [c["s"] * 1e3 for c in copies]
    print(f"64 MiB numpy copies: median {statistics.median(copy_ms):.2f} ms, min {min(copy_ms):.2f}, max {max(copy_ms):.2f}")
    args.out.write_text(json.dumps({"cpus": cpus, "topology": topology, "fastest_s": fastest, "summary": summary,
                                    "by_second": seconds, "readings": readings, "copies": copies,
                                    "after": after, "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
