"""Why the bench's task rows drift (issue 12): the task at batch 1 and 128 timed round by round beside its
parts and beside two probes of the host's own speed, so that what moves with what can be read off.

Rows (each one round, interleaved, ROUNDS rounds): the task as the bench times it (host clock, float32 photos),
and at batch 128 again with the staging copy done by torch's threaded `copy_`;
the engine alone (CUDA events); the staging copy of 128 photos into a page-locked buffer by numpy (one thread,
as `tasks.staged` does) and by torch's `copy_` (its intra-op threads); the page-locked -> device transfer
(CUDA events); a pure-Python loop (the core's clock: no memory traffic) and a numpy copy of 64 MiB between two
pageable buffers (the host's memory bandwidth). Then one task call at batch 128 under torch.profiler: the host
ops with the most self time. Writes OUT.json: per row the samples, median, spread, and each row's correlation
with the task rows across rounds.

    PYTHONPATH=src python tools/task_lab.py BUNDLE OUT.json [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

PHOTOS = Path(__file__).resolve().parents[1] / "examples" / "images"


def decoded_photos() -> list[np.ndarray]:
    from PIL import Image

    out = []
    for path in sorted(PHOTOS.iterdir()):
        if path.suffix.lower() in (".jpg", ".png"):
            with Image.open(path) as image:
                out.append(np.asarray(image.convert("RGB"), dtype=np.float32) / np.float32(255.0))
    return out


def per_call(clock):
    """The bench's round clock (`trtmc.bench.timing`) as milliseconds per call."""
    return lambda fn, calls: clock(fn, calls) / calls


def main() -> None:
    from trtmc.runtime import Runtime
    from trtmc.tasks import image_to_class_scores

    bundle, out = Path(sys.argv[1]), Path(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    runtime = Runtime.open(bundle)
    runtime.engine.warm_up()
    photos = decoded_photos()
    b128 = [photos[i % len(photos)] for i in range(128)]
    total = sum(a.size for a in b128)
    pinned = torch.empty(total, dtype=torch.float32, pin_memory=True)
    flat = pinned.numpy()
    device_copy = torch.empty(total, dtype=torch.float32, device="cuda")
    src64, dst64 = np.ones(16 * 2**20, np.float32), np.empty(16 * 2**20, np.float32)
    shape = runtime.graph.inputs[0].type.shape
    pixels = torch.rand((128, *shape[1:]), device="cuda")

    def copy_numpy():
        offset = 0
        for a in b128:
            np.copyto(flat[offset : offset + a.size].reshape(a.shape), a)
            offset += a.size

    def copy_torch():
        offset = 0
        for a in b128:
            pinned[offset : offset + a.size].copy_(torch.from_numpy(a).view(-1))
            offset += a.size

    import trtmc.tasks as tasks

    numpy_staged = tasks.staged

    def threaded_staged(arrays, device):  # `tasks.staged` with torch's threaded copy_ for numpy's
        host = torch.empty(sum(a.size for a in arrays), dtype=torch.float32, pin_memory=True)
        views, offset = [], 0
        for a in arrays:
            host[offset : offset + a.size].copy_(torch.from_numpy(a).view(-1))
            offset += a.size
        moved = host.to(device, non_blocking=True)
        offset = 0
        for a in arrays:
            views.append(moved[offset : offset + a.size].view(a.shape))
            offset += a.size
        return views

    def task_threaded_staging():
        tasks.staged = threaded_staged
        try:
            return image_to_class_scores(runtime, b128)
        finally:
            tasks.staged = numpy_staged

    def python_loop():
        s = 0
        for i in range(200_000):
            s += i
        return s

    from trtmc.bench.timing import CudaEventClock, HostClock

    host_ms, event_ms = per_call(HostClock("cuda")), per_call(CudaEventClock())
    rows = {  # name: (fn, clock, calls per round)
        "task_b1": (lambda: image_to_class_scores(runtime, [photos[0]]), host_ms, 20),
        "task_b128": (lambda: image_to_class_scores(runtime, b128), host_ms, 1),
        "task_b128_threaded_copy": (task_threaded_staging, host_ms, 1),
        "engine_b128": (lambda: runtime.engine(pixels), event_ms, 5),
        "copy_numpy_b128": (copy_numpy, host_ms, 1),
        "copy_torch_b128": (copy_torch, host_ms, 1),
        "h2d_b128": (lambda: device_copy.copy_(pinned, non_blocking=True), event_ms, 2),
        "python_loop": (python_loop, host_ms, 2),
        "memcpy_64MiB": (lambda: np.copyto(dst64, src64), host_ms, 4),
    }
    for fn, clock, calls in rows.values():  # warm-up
        clock(fn, calls)
    samples: dict[str, list[float]] = {name: [] for name in rows}
    started = time.perf_counter()
    for _ in range(rounds):
        for name, (fn, clock, calls) in rows.items():
            samples[name].append(clock(fn, calls))
    seconds = time.perf_counter() - started

    def normalized(name):
        m = statistics.median(samples[name])
        return [s / m for s in samples[name]]

    def correlation(a, b):
        return float(np.corrcoef(normalized(a), normalized(b))[0, 1])

    result = {"bundle": bundle.name, "rounds": rounds, "seconds": round(seconds, 1), "threads": torch.get_num_threads(),
              "staged_mb": round(total * 4 / 1e6, 1), "rows": {}}
    for name in rows:
        m = statistics.median(samples[name])
        result["rows"][name] = {
            "median_ms": round(m, 4),
            "spread": round(max(abs(s - m) for s in samples[name]) / m, 4),
            "stable_windows_of_10": sum(
                max(abs(s - statistics.median(w)) for s in w) <= 0.05 * statistics.median(w)
                for w in (samples[name][i : i + 10] for i in range(0, rounds - 9, 10))),
            "corr_task_b128": round(correlation(name, "task_b128"), 3),
            "corr_task_b1": round(correlation(name, "task_b1"), 3),
            "normalized": [round(s, 3) for s in normalized(name)],
        }
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        image_to_class_scores(runtime, b128)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60)
    result["profile_task_b128"] = table
    out.write_text(json.dumps(result, indent=1))
    for name, row in result["rows"].items():
        print(f"{name:16} {row['median_ms']:9.3f} ms spread {row['spread']:.3f} stable/10 {row['stable_windows_of_10']}"
              f" corr128 {row['corr_task_b128']:+.2f} corr1 {row['corr_task_b1']:+.2f}")
    print(table)


if __name__ == "__main__":
    main()
