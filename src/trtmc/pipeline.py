"""Classifying collections of image files: a streaming pipeline from paths to per-file results.

`classify_files(runtime, paths)` yields one `FileResult` per path, in input order, while later files
are still being read. Worker processes decode, resize and center-crop (`PreprocessSpec.crop_pil`) and
send back 8-bit pixels, a quarter of the float bytes; the main thread packs them into fixed-size
batches of the engine's batch size in pinned host memory, copies each batch to the device
asynchronously, normalizes it there and runs the engine while the workers prepare the next one. At
most a few batches are in flight, so memory does not grow with the number of files. A file that
cannot be read becomes an error result and the run goes on.

Processes, not threads: Pillow releases the GIL inside decode and resize, but not between those
calls. On the H200 machine 16 decode processes alone crop 1,386 of the repository's photos a second,
and the whole pipeline classifies 1,200-1,530 a second (benchmarks/NOTES.md, run 5).

Every file goes through exactly the task's preprocessing (`trtmc.tasks.load_image`, then the bundle's
`PreprocessSpec`: `from_pil` is `crop_pil` then `normalize_bytes`, float32 operations that round the
same on a CPU and a GPU), so its logits are those `image_to_class_scores` gives for it.
"""

from __future__ import annotations

import glob
import itertools
import multiprocessing
import os
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from .preprocess import PreprocessSpec
from .runtime import Runtime
from .tasks import InvalidInput, load_image

# What `expand_images` picks up inside folders (other files there are not images to classify).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


class NoImages(ValueError):
    """An image argument that names nothing to classify (a missing path, an empty folder)."""


@dataclass(frozen=True)
class PipelineOptions:
    batch_size: int | None = None  # None: the engine's largest batch
    workers: int | None = None  # decode processes; None: one per CPU this process may use
    prefetch_batches: int = 2  # batches decoded ahead of the engine: bounds memory
    threads: bool = False  # decode in threads of this process instead (for hosts that cannot fork)

    def validate(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.prefetch_batches < 1:
            raise ValueError(f"prefetch_batches must be at least 1, got {self.prefetch_batches}")


@dataclass(frozen=True)
class FileResult:
    """One file's logits (float32, checkpoint order), or why it could not be classified."""

    image: str
    logits: np.ndarray | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# ---- which files ----------------------------------------------------------------------------------


def _has_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def _folder_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def expand_images(specs: Sequence[str | Path]) -> list[Path]:
    """Files as given, folders (recursively, by image suffix), `@list.txt` (one path per line, relative
    to the list's folder) and quoted globs (`'photos/*.jpg'`), in the order given.

    Raises `NoImages` naming the first argument that yields nothing (a missing file, an empty folder, a
    glob without matches), so a run fails before any engine loads.
    """
    found: list[Path] = []
    for spec in specs:
        text = str(spec)
        if text.startswith("@"):
            listing = Path(text[1:])
            if not listing.is_file():
                raise NoImages(f"{text}: no such list file (an @FILE lists one image path per line)")
            lines = [line.strip() for line in listing.read_text(encoding="utf-8").splitlines()]
            paths = [Path(line) if Path(line).is_absolute() else listing.parent / line for line in lines if line]
            if not paths:
                raise NoImages(f"{text}: the list is empty")
            found += paths  # a listed file that is missing becomes an error record, like any unreadable file
            continue
        path = Path(text).expanduser()
        if path.is_dir():
            images = _folder_images(path)
            if not images:
                raise NoImages(f"{path}: the folder holds no images ({', '.join(IMAGE_SUFFIXES)})")
            found += images
        elif path.exists():
            found.append(path)
        elif _has_glob(text):
            matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(text), recursive=True))
            if not matches:
                raise NoImages(f"{text}: the pattern matches no file")
            for match in matches:
                found += _folder_images(match) if match.is_dir() else [match]
        else:
            raise NoImages(f"{text}: no such file or folder")
    return found


# ---- the pipeline ---------------------------------------------------------------------------------


def _crop_files(spec: PreprocessSpec, paths: list[str]) -> list[np.ndarray | str]:
    """In a worker: each file's cropped 8-bit pixels (HWC), or why it cannot be read."""
    out: list[np.ndarray | str] = []
    for path in paths:
        try:
            out.append(spec.crop_pil(load_image(Path(path))))
        except InvalidInput as exc:
            out.append(str(exc))
    return out


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _decoder(options: PipelineOptions, workers: int) -> Executor:
    if options.threads or workers == 1:
        return ThreadPoolExecutor(workers, thread_name_prefix="trtmc-decode")
    # fork starts workers in milliseconds and they never touch CUDA; spawn where fork does not exist.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method))


def _batch_size(runtime: Runtime, options: PipelineOptions, count: int | None) -> int:
    """The files per batch: as asked, else the engine's largest batch, or, for fewer files than that
    (a known `count`), the smallest size the engine serves that holds them all: classifying one photo
    then compiles and captures the batch-1 graph only, not the largest one."""
    size = options.batch_size or runtime.batching.max_batch
    if options.batch_size is None and count is not None and 0 < count < size:
        size = runtime.batching.run_size(count)
    if size > runtime.batching.max_batch:
        raise ValueError(
            f"--batch-size {size} is larger than this bundle's engine serves ({runtime.batching}); rebuild with "
            f"`trtmc build ... --max-batch {size}` or pass a smaller --batch-size"
        )
    return size


@dataclass
class _Batch:
    """A fixed-size host batch and, per input file in order, its row in the batch or its error."""

    pixels: torch.Tensor  # [size, H, W, 3] uint8, pinned when the engine runs on CUDA
    entries: list[tuple[str, int | None, str | None]]  # (image, row, error)
    rows: int = 0
    logits: torch.Tensor | None = None  # the engine's output, once launched

    def __post_init__(self) -> None:
        # Rows are copied through a numpy view of the (pinned) buffer: one memcpy each. torch's copy_
        # splits a 150 KB row across its intra-op threads, which wait for time slices while every core
        # decodes: on the H200 machine (lite0 fp16, 2,002 photos, 16 decode processes) 275 images/s
        # with copy_, 1,210 with this.
        self._rows_view = self.pixels.numpy()

    def add(self, image: str, cropped: np.ndarray) -> None:
        self._rows_view[self.rows] = cropped
        self.entries.append((image, self.rows, None))
        self.rows += 1


class _Runner:
    """Copies 8-bit host batches to the device, normalizes them there and runs the engine, one batch
    in flight behind the one filling.

    Two host buffers take turns: a batch is launched (asynchronous copy from pinned memory, then the
    normalization and the engine, on CUDA) before the previous batch's results are read, so the copy
    overlaps the previous engine call and both overlap the decoding of the next batch. A buffer is
    refilled only after its batch's results were read, which orders the refill after its copy.
    """

    def __init__(self, runtime: Runtime, size: int) -> None:
        from .backends.torch_lowering import TORCH_DTYPES

        self.runtime = runtime
        self.size = size  # files per batch
        self.run_size = runtime.batching.run_size(size)  # rows the engine runs: padded up to a size it serves
        self.cuda = runtime.device == "cuda"
        self.dtype = TORCH_DTYPES[runtime.graph.inputs[0].type.dtype]
        self.copy_stream = torch.cuda.Stream() if self.cuda else None
        h, w = runtime.preprocess.input_size
        shape = (self.run_size, h, w, 3)
        self.buffers = [torch.zeros(shape, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(2)]
        self.turn = 0

    def new_batch(self) -> _Batch:
        self.turn ^= 1
        return _Batch(self.buffers[self.turn], [])

    def _pixels(self, nhwc: torch.Tensor) -> torch.Tensor:
        """The engine's input: normalized NCHW in its dtype (channels-last on CUDA, as the engine keeps it)."""
        pixels = self.runtime.preprocess.normalize_bytes(nhwc).to(self.dtype)
        return pixels if self.cuda else pixels.contiguous()

    def launch(self, batch: _Batch) -> None:
        if batch.rows == 0:
            return  # only errors: nothing to run
        rows = self.runtime.batching.run_size(batch.rows)
        batch.pixels[batch.rows : rows].zero_()  # padding rows; their logits are dropped
        nhwc = batch.pixels[:rows]
        if not self.cuda:
            batch.logits = self.runtime.engine(self._pixels(nhwc))
            return
        with torch.cuda.stream(self.copy_stream):
            device = nhwc.to("cuda", non_blocking=True)
        compute = torch.cuda.current_stream()
        compute.wait_stream(self.copy_stream)
        device.record_stream(compute)
        batch.logits = self.runtime.engine(self._pixels(device))

    @staticmethod
    def results(batch: _Batch) -> Iterator[FileResult]:
        logits = batch.logits.float().cpu().numpy() if batch.logits is not None else None
        for image, row, error in batch.entries:
            if error is not None:
                yield FileResult(image, error=error)
            else:
                yield FileResult(image, logits=logits[row].copy())


def classify_files(
    runtime: Runtime, paths: Iterable[str | Path], options: PipelineOptions = PipelineOptions()
) -> Iterator[FileResult]:
    """One `FileResult` per path, in the order given, streamed (see the module docstring)."""
    options.validate()
    size = _batch_size(runtime, options, len(paths) if isinstance(paths, Sequence) else None)
    runner = _Runner(runtime, size)
    workers = options.workers or _usable_cpus()
    # Files go to the workers in small groups (fewer, larger messages), enough groups for every worker.
    group = max(1, min(8, size // workers))
    if isinstance(paths, Sequence):  # no more workers than groups: one photo starts no process pool
        workers = max(1, min(workers, -(-len(paths) // group)))
    window = size * (options.prefetch_batches + 1)  # files decoded ahead: what bounds memory
    with _decoder(options, workers) as pool:
        source = iter(paths)
        pending: deque[tuple[list[str], Future]] = deque()
        queued = 0

        def refill() -> None:
            nonlocal queued
            while queued < window:
                names = [str(p) for p in itertools.islice(source, group)]
                if not names:
                    return
                pending.append((names, pool.submit(_crop_files, runtime.preprocess, names)))
                queued += len(names)

        refill()
        previous: _Batch | None = None
        batch = runner.new_batch()
        while pending:
            names, future = pending.popleft()
            queued -= len(names)
            refill()
            for image, cropped in zip(names, future.result()):
                if isinstance(cropped, str):
                    batch.entries.append((image, None, cropped))
                    continue
                batch.add(image, cropped)
                if batch.rows == size:
                    runner.launch(batch)
                    if previous is not None:
                        yield from runner.results(previous)
                    previous, batch = batch, runner.new_batch()
        runner.launch(batch)
        if previous is not None:
            yield from runner.results(previous)
        yield from runner.results(batch)
