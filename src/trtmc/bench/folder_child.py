"""One side of a folder run, in a process of its own: `python -m trtmc.bench.folder_child REQUEST.json`.

The request (`folder.encode_request`) holds a `TrtmcPass` or a `LoaderPass` and the file to answer in.
The child loads its model and warms it up (compiling, capturing) untimed, lists the folder's image
files as `trtmc classify` does, then times one pass from those file names to every file's top-5
(classes and scores) in memory, and writes a `folder.Measurement` with what `MemoryWatch` saw.
Nothing here is imported by the parent process.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from ..backends.inductor_mends import mend_inductor
from ..files import write_bytes_atomically
from .folder import MEMORY_SAMPLE_SECONDS, LoaderPass, Measurement, TrtmcPass, decode_request
from .timing import synchronize

TOP_K = 5  # what each file's result keeps


def _status_bytes(pid: int | str, field: str) -> int | None:
    """A `/proc/PID/status` memory field (VmHWM, VmRSS) in bytes; None where there is no such file."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _child_pids(parent: int) -> list[str]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii") as f:
                    # The process name (field 2) may hold spaces; the parent id is the second field after it.
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                        pids.append(name)
            except (OSError, ValueError, IndexError):
                pass
    return pids


class MemoryWatch:
    """Peak memory of this process and of its child processes (the DataLoader's workers), from Linux's /proc.

    The process's own peak is VmHWM, the high-water mark of its own address space. `ru_maxrss` would
    not do: Linux carries it over from the process this one was spawned from (measured: a child of a
    500 MB process reported 511 MB with a VmHWM of 9 MB), and a forked worker's from its parent. The
    children are sampled every MEMORY_SAMPLE_SECONDS and once when a pass's last batch arrives (before the
    DataLoader joins its workers): each one's VmHWM, and the sum of VmRSS over the process
    and its children (pages a forked worker shares with its parent count in both: an upper bound).
    Where there is no /proc, the own peak is ru_maxrss and the children are not seen.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.workers_peak = 0
        self.tree_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trtmc-memory-watch", daemon=True)
        self._thread.start()

    def own_peak(self) -> int:
        peak = _status_bytes(self.pid, "VmHWM")
        if peak is None:  # no /proc: the kernel's count; Linux counts kilobytes, macOS bytes
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return peak

    def sample(self) -> None:
        if not os.path.isdir("/proc"):
            return
        tree = _status_bytes(self.pid, "VmRSS") or 0
        for pid in _child_pids(self.pid):
            self.workers_peak = max(self.workers_peak, _status_bytes(pid, "VmHWM") or 0)
            tree += _status_bytes(pid, "VmRSS") or 0
        self.tree_peak = max(self.tree_peak, tree)

    def _watch(self) -> None:
        while not self._stop.wait(MEMORY_SAMPLE_SECONDS):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


class _Kept:
    """The pass's results in memory: per file, its name and top-5 classes and scores (or its error)."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self.classes: list[np.ndarray] = []
        self.scores: list[np.ndarray] = []
        self.errors: list[str] = []

    def add(self, name: str, classes: np.ndarray, scores: np.ndarray) -> None:
        self.files.append(name)
        self.classes.append(classes)
        self.scores.append(scores)

    def fail(self, name: str, error: str) -> None:
        self.add(name, np.full(TOP_K, -1), np.zeros(TOP_K, np.float32))
        self.errors.append(f"{name}: {error}")

    def measurement(self, memory: MemoryWatch, seconds: float, load_seconds: float, before: int, **facts) -> Measurement:
        memory.stop()
        return Measurement(
            files=tuple(self.files),
            top1=tuple(int(c[0]) for c in self.classes),
            errors=tuple(self.errors),
            seconds=seconds,
            load_seconds=load_seconds,
            peak_rss=memory.own_peak(),
            peak_rss_before_pass=before,
            workers_peak_rss=memory.workers_peak,
            tree_peak_rss=max(memory.tree_peak, memory.own_peak()),
            **facts,
        )


def _top(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = min(TOP_K, logits.shape[-1])
    classes = np.argpartition(-logits, k - 1)[:k]
    classes = classes[np.argsort(-logits[classes], kind="stable")]
    return classes, logits[classes]


def run_trtmc(work: TrtmcPass) -> Measurement:
    """trtmc's `classify_files` over the folder, its default decode workers, `work.batch` files an engine call."""
    from ..pipeline import PipelineOptions, classify_files, expand_images
    from ..runtime import Runtime

    memory = MemoryWatch()
    started = time.perf_counter()
    runtime = Runtime.open(work.bundle, engine=work.engine)
    runtime.engine.warm_up()
    synchronize(runtime.device)
    load_seconds = time.perf_counter() - started
    paths = expand_images([work.folder])
    kept = _Kept()
    before = memory.own_peak()
    started = time.perf_counter()
    for result in classify_files(runtime, paths, PipelineOptions(batch_size=work.batch)):
        name = Path(result.image).name
        if result.ok:
            kept.add(name, *_top(result.logits))
        else:
            kept.fail(name, result.error)
    seconds = time.perf_counter() - started
    # classify_files's default: one decode thread per core
    return kept.measurement(memory, seconds, load_seconds, before, workers=os.cpu_count() or 1, batch=work.batch,
                            device=runtime.device)


class ImageFiles(torch.utils.data.Dataset):
    """The dataset a user writes: a list of files, opened with PIL, through timm's eval transform."""

    def __init__(self, paths: list[Path], transform) -> None:
        self.paths, self.transform = paths, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        from PIL import Image

        with Image.open(self.paths[index]) as image:
            return self.transform(image.convert("RGB")), index


def pass_batch_sizes(files: int, batch: int) -> list[int]:
    """The batch sizes a pass over `files` files in batches of `batch` runs: the full one and the last."""
    return sorted({min(files, batch), files % batch} - {0})


def run_loader(work: LoaderPass) -> Measurement:
    """timm behind a DataLoader, as a user writes it: timm's eval transform in `work.workers` processes,
    pinned batches copied asynchronously, the model in the entry's precision, channels_last, compiled."""
    from ..checkpoint import Checkpoint
    from ..pipeline import expand_images
    from ..random_weights import load_timm_model, timm_eval_transform
    from .baselines import TORCH_DTYPES

    memory = MemoryWatch()
    started = time.perf_counter()
    dtype, device, channels_last = TORCH_DTYPES[work.precision], work.device, torch.channels_last
    model = load_timm_model(work.checkpoint).to(device, dtype).to(memory_format=channels_last).eval()
    if work.compile:
        mend_inductor()
        model = torch.compile(model)  # default mode, as a user writes it
    paths = expand_images([work.folder])
    config = Checkpoint(work.checkpoint).config
    shape, k = tuple(config.pretrained.input_size), min(TOP_K, config.num_classes)
    loader = torch.utils.data.DataLoader(
        ImageFiles(paths, timm_eval_transform(work.checkpoint)),
        batch_size=work.batch,
        num_workers=work.workers,
        pin_memory=device == "cuda",
    )
    kept = _Kept()
    with torch.no_grad():
        # Compile for every batch shape the pass meets (the full one and the last) before timing, as
        # trtmc's engine is warmed up before its pass.
        for n in pass_batch_sizes(len(paths), work.batch):
            model(torch.zeros((n, *shape), device=device, dtype=dtype).contiguous(memory_format=channels_last))
        synchronize(device)
        load_seconds = time.perf_counter() - started
        before = memory.own_peak()
        started = time.perf_counter()
        for pixels, index in loader:
            x = pixels.to(device, non_blocking=True).to(dtype).contiguous(memory_format=channels_last)
            scores, classes = model(x).float().topk(k, dim=-1)
            for i, c, s in zip(index.tolist(), classes.cpu().numpy(), scores.cpu().numpy()):
                kept.add(paths[i].name, c, s)
            if len(kept.files) == len(paths):
                # The workers are joined as the loader's iterator ends; a pass shorter than the sampling
                # period would never see them. Their VmHWM now is their peak: read it once, here.
                memory.sample()
        seconds = time.perf_counter() - started
    return kept.measurement(memory, seconds, load_seconds, before, workers=work.workers, batch=work.batch, device=device)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python -m trtmc.bench.folder_child REQUEST.json (got {argv})", file=sys.stderr)
        return 2
    work, answer = decode_request(Path(argv[0]).read_text())
    measured = run_trtmc(work) if isinstance(work, TrtmcPass) else run_loader(work)
    write_bytes_atomically(answer, json.dumps(measured.to_json()).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
