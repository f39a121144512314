"""On the GPU machine: the folder pipeline's device resize against its worker resize, on CUDA.

    PYTHONPATH=src python3 tools/device_resize_check.py BUNDLE OUT.json [FOLDER]

Classifies the repository's photos, plus noise images of awkward sizes written to a scratch folder, with
`resize_on="device"` (workers decode into page-locked shared slots, the GPU resizes with Pillow's fixed-point
arithmetic) and `resize_on="workers"` (each worker crops with Pillow), and records whether every file's
logits are bit-identical, whether the slots were page-locked, and, with FOLDER, images/s over it of the
device resize with the default slots and with slots of 640 x 480 pixels (less memory to page-lock; larger images
are cropped by their worker) and of the workers' resize, two passes each, interleaved. The pipeline's phase
timings (`-v` lines: workers started, slots page-locked, workers stopped, slots released) are printed.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from trtmc.pipeline import PipelineOptions, classify_files, expand_images
from trtmc.runtime import Runtime
from trtmc.slots import Slots


def _noise_files(folder: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    files = []
    for i, (h, w) in enumerate([(333, 91), (91, 333), (7, 300), (1, 1), (224, 224), (517, 389), (768, 1024)]):
        path = folder / f"noise_{i}_{h}x{w}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        files.append(path)
    return files


def _pass(runtime, paths, resize_on, **options):
    started = time.perf_counter()
    results = list(classify_files(runtime, paths, PipelineOptions(resize_on=resize_on, **options)))
    return results, len(paths) / (time.perf_counter() - started)


def main(bundle: str, out: str, folder: str | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="trtmc: %(message)s")
    runtime = Runtime.open(bundle)
    runtime.engine.warm_up()
    report: dict = {"bundle": bundle, "engine": runtime.choice.key, "device": runtime.device}
    if runtime.device == "cuda":
        slots = Slots(4)
        report["slots_page_locked"] = slots.pin()
        slots.close()
    with tempfile.TemporaryDirectory() as scratch:
        photos = sorted(p for p in Path("examples/images").iterdir() if p.suffix in (".jpg", ".png"))
        paths = photos + _noise_files(Path(scratch))
        device, _ = _pass(runtime, paths, "device")
        workers, _ = _pass(runtime, paths, "workers")
    differ = [a.image for a, b in zip(device, workers) if not (a.ok and b.ok and np.array_equal(a.logits, b.logits))]
    report["files"] = len(paths)
    report["files_whose_logits_differ"] = differ
    if folder:
        files = expand_images([folder])
        variants = {"device": {}, "device_640x480_slots": {"slot_pixels": 640 * 480}, "workers": {}}
        for _ in range(2):  # each twice, interleaved
            for name, options in variants.items():
                _, rate = _pass(runtime, files, "workers" if name == "workers" else "device", **options)
                print(f"{name}: {rate:.1f} images/s", flush=True)
                report.setdefault(f"images_per_s_{name}", []).append(round(rate, 1))
        report["folder_files"] = len(files)
    Path(out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
