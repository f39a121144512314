"""Why a folder classifies at the rate it does (issue 10): decoding alone, then the whole pipeline.

    python3 tools/pipeline_probe.py BUNDLE FOLDER OUT_DIR

Prints and writes OUT_DIR/pipeline-probe.json: the CPUs this process may use (before torch, after
opening the bundle), images/s of decoding alone in worker processes (before and after the engine is
loaded), images/s of `classify_files` (twice), and OUT_DIR/pipeline-profile.txt, the main thread's 30 most
expensive functions during the second run (profiled). Run 5's record also timed the pipeline with rows copied
by torch's `copy_`, by replacing a private method; this version reads public APIs only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

AFFINITY_AT_START = len(os.sched_getaffinity(0))
WORKERS = min(16, os.cpu_count() or 1)


def _crop_files(spec, paths: list[str]) -> list:
    """In a worker: what the pipeline's decoders do with each file (decode, resize, center-crop)."""
    from trtmc.tasks import load_image

    return [spec.crop_pil(load_image(Path(path))) for path in paths]


def _decode_rate(spec, files: list[str], workers: int) -> float:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    started = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(_crop_files, spec, files[i : i + 4]) for i in range(0, len(files), 4)]
        for future in futures:
            future.result()
    return round(len(files) / (time.perf_counter() - started), 1)


def main(argv: list[str]) -> int:
    bundle, folder, out = Path(argv[0]), Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    import cProfile
    import io
    import pstats

    import torch

    from trtmc.bundle import read_bundle
    from trtmc.pipeline import PipelineOptions, classify_files, expand_images
    from trtmc.preprocess import PreprocessSpec

    files = [str(p) for p in expand_images([folder])]
    record: dict = {"cpus_at_start": AFFINITY_AT_START, "cpu_count": os.cpu_count(), "files": len(files)}
    spec = PreprocessSpec.from_json(read_bundle(bundle).json("runtime.json"))
    record["decode_fork_before_engine"] = _decode_rate(spec, files, WORKERS)
    from trtmc.runtime import Runtime

    runtime = Runtime.open(bundle)
    runtime.engine.warm_up()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    record["cpus_after_engine"] = len(os.sched_getaffinity(0))
    record["decode_fork_after_engine"] = _decode_rate(spec, files, WORKERS)
    for name in ("pipeline", "pipeline_again"):
        options = PipelineOptions()
        profiler = cProfile.Profile() if name == "pipeline_again" else None  # the profiler slows what it sees
        started = time.perf_counter()
        if profiler:
            profiler.enable()
        count = sum(1 for _ in classify_files(runtime, files, options))
        record[name] = round(count / (time.perf_counter() - started), 1)
        if profiler:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
            (out / "pipeline-profile.txt").write_text(text.getvalue())
    (out / "pipeline-probe.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
