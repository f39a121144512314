"""Classifying collections of image files: a streaming pipeline from paths to per-file results.

`classify_files(runtime, paths)` yields one `FileResult` per path, in input order, while later files
are still being read. Worker processes decode; the main thread packs fixed-size batches of the engine's
batch size, copies each batch to the device asynchronously, resizes, crops and normalizes it there and
runs the engine while the workers decode the next one. At most a few batches are in flight, so memory
does not grow with the number of files. A file that cannot be read becomes an error result and the run
goes on.

Where the resize runs (`PipelineOptions.resize_on`): on a CUDA engine the workers only decode, writing
full-size pixels into shared, page-locked slots (`trtmc.slots`), and the engine's device resizes and
crops them with Pillow's own fixed-point arithmetic (`trtmc.resample`: the same bytes as timm's PIL
transform). Measured on this repository's CPU machine, decoding is about half of a 512 px JPEG's host
work and the bicubic resize the other half. Elsewhere (a CPU engine, nearest-neighbour resizing, an
image larger than a slot) the workers resize and crop themselves (`PreprocessSpec.crop_pil`) and send
back the 8-bit crop.

Processes, not threads: Pillow releases the GIL inside decode and resize, but not between those
calls. On the H200 machine 16 processes that decode and crop handle 1,386 of the repository's photos a
second, and the whole pipeline with them classified 1,200-1,530 a second (benchmarks/NOTES.md, run 5).

Every file goes through exactly the task's preprocessing (`trtmc.tasks.load_image`, then the bundle's
`PreprocessSpec`: `from_pil` is `crop_pil` then `normalize_bytes`, float32 operations that round the
same on a CPU and a GPU), so its logits are those `image_to_class_scores` gives for it.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import logging
import multiprocessing
import os
import time
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from .preprocess import PreprocessSpec
from .resample import RESAMPLED, DeviceCropper
from .runtime import Runtime
from .slots import SLOT_PIXELS, Slots
from .tasks import InvalidInput, load_image

log = logging.getLogger(__name__)

# What `expand_images` picks up inside folders (other files there are not images to classify).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
RESIZE_PLACES = ("auto", "device", "workers")
RESIZE_CHUNK = 16  # images of one size resized on the device at a time


class NoImages(ValueError):
    """An image argument that names nothing to classify (a missing path, an empty folder)."""


@dataclass(frozen=True)
class PipelineOptions:
    batch_size: int | None = None  # None: the engine's largest batch
    workers: int | None = None  # decode processes; None: one per CPU this process may use
    prefetch_batches: int = 2  # batches decoded ahead of the engine: bounds memory
    threads: bool = False  # decode in threads of this process instead (for hosts that cannot fork)
    resize_on: str = "auto"  # "device": workers decode, the engine's device resizes; "workers": they crop; auto: device on CUDA
    slot_pixels: int = SLOT_PIXELS  # with resize_on device: a larger image is cropped by its worker instead

    def validate(self) -> None:
        if self.resize_on not in RESIZE_PLACES:
            raise ValueError(f"--resize-on must be one of {', '.join(RESIZE_PLACES)}, got {self.resize_on!r}")
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


# A worker's answer for one file: its crop (8-bit HWC), the (height, width) of the full image it wrote
# into the file's slot, or why the file cannot be read.
Decoded = np.ndarray | tuple[int, int] | str

_worker_slots: Slots | None = None  # the slots a decode worker writes into (set by `_attach`)


def _attach(slots: Slots | None) -> None:
    """Pool initializer: a forked worker (or a decode thread) keeps the slots it inherited."""
    global _worker_slots
    _worker_slots = slots


def _decode_files(spec: PreprocessSpec, paths: list[str], slots: list[int] | None) -> list[Decoded]:
    """In a worker: each file decoded into its slot, or cropped here where it has none or does not fit."""
    out: list[Decoded] = []
    for i, path in enumerate(paths):
        try:
            image = load_image(Path(path))
            if slots is not None and _worker_slots is not None:
                hwc = np.asarray(image)
                if _worker_slots.write(slots[i], hwc):
                    out.append(hwc.shape[:2])
                    continue
            out.append(spec.crop_pil(image))
        except InvalidInput as exc:
            out.append(str(exc))
    return out


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _in_threads(options: PipelineOptions, workers: int) -> bool:
    return options.threads or workers == 1


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def _resize_on_device(runtime: Runtime, options: PipelineOptions, workers: int) -> bool:
    """Whether workers only decode and the engine's device resizes (see the module docstring)."""
    possible = runtime.preprocess.interpolation in RESAMPLED and (_in_threads(options, workers) or _can_fork())
    if options.resize_on == "device" and not possible:
        raise ValueError(
            f"--resize-on device needs bilinear or bicubic resizing (this bundle: {runtime.preprocess.interpolation}) "
            "and decode workers that can fork; use --resize-on workers"
        )
    if options.resize_on == "auto":
        return possible and runtime.device == "cuda"
    return options.resize_on == "device"


def _decoder(options: PipelineOptions, workers: int, slots: Slots | None) -> Executor:
    if _in_threads(options, workers):
        return ThreadPoolExecutor(workers, thread_name_prefix="trtmc-decode", initializer=_attach, initargs=(slots,))
    # fork starts workers in milliseconds, they never touch CUDA and they inherit the slots' mapping;
    # spawn where fork does not exist (then without slots: a mapping does not pickle).
    method = "fork" if _can_fork() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_attach,
                               initargs=(slots,) if method == "fork" else (None,))


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
    """A fixed-size host batch and, per input file in order, its row in the batch or its error. Rows
    cropped by a worker are in `pixels`; rows decoded into slots are listed in `decoded` and resized
    on the device when the batch is launched."""

    pixels: torch.Tensor  # [size, H, W, 3] uint8, pinned when the engine runs on CUDA
    entries: list[tuple[str, int | None, str | None]]  # (image, row, error)
    rows: int = 0
    decoded: list[tuple[int, int, int, int]] = field(default_factory=list)  # (row, slot, height, width)
    logits: torch.Tensor | None = None  # the engine's output, once launched

    def __post_init__(self) -> None:
        # Rows are copied through a numpy view of the (pinned) buffer: one memcpy each. torch's copy_
        # splits a 150 KB row across its intra-op threads, which wait for time slices while every core
        # decodes: on the H200 machine (lite0 fp16, 2,002 photos, 16 decode processes) 275 images/s
        # with copy_, 1,210 with this.
        self._rows_view = self.pixels.numpy()

    def _take_row(self, image: str) -> int:
        self.entries.append((image, self.rows, None))
        self.rows += 1
        return self.rows - 1

    def add(self, image: str, cropped: np.ndarray) -> None:
        self._rows_view[self._take_row(image)] = cropped

    def add_decoded(self, image: str, slot: int, height: int, width: int) -> None:
        self.decoded.append((self._take_row(image), slot, height, width))


class _Runner:
    """Copies host batches to the device, resizes and normalizes them there and runs the engine, one
    batch in flight behind the one filling.

    Two host buffers take turns: a batch is launched (asynchronous copies from pinned memory, then the
    resize of slot rows, the normalization and the engine, on CUDA) before the previous batch's results
    are read, so the copies overlap the previous engine call and all of it overlaps the decoding of the
    next batch. A buffer, and a batch's slots, are reused only after its results were read, which
    orders the reuse after its copies.
    """

    def __init__(self, runtime: Runtime, size: int, slots: Slots | None) -> None:
        from .backends.torch_lowering import TORCH_DTYPES

        self.runtime = runtime
        self.size = size  # files per batch
        self.run_size = runtime.batching.run_size(size)  # rows the engine runs: padded up to a size it serves
        self.cuda = runtime.device == "cuda"
        self.dtype = TORCH_DTYPES[runtime.graph.inputs[0].type.dtype]
        self.copy_stream = torch.cuda.Stream() if self.cuda else None
        self.slots = slots
        self.cropper = DeviceCropper(runtime.preprocess) if slots is not None else None
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

    def _copying(self):
        """Where host-to-device copies are issued: the copy stream on CUDA."""
        return torch.cuda.stream(self.copy_stream) if self.cuda else contextlib.nullcontext()

    def _hand_over(self, tensor: torch.Tensor) -> None:
        """The compute stream waits for the copies into `tensor`, which it then owns."""
        if self.cuda:
            compute = torch.cuda.current_stream()
            compute.wait_stream(self.copy_stream)
            tensor.record_stream(compute)

    def _resize_decoded(self, batch: _Batch, nhwc: torch.Tensor) -> None:
        """Slot rows, copied to the device by size, resized and cropped there into their rows of `nhwc`
        (at most `RESIZE_CHUNK` images at a time: the float64 products take 8 bytes per source value)."""
        by_size: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for row, slot, height, width in batch.decoded:
            by_size.setdefault((height, width), []).append((row, slot))
        for (height, width), members in by_size.items():
            for start in range(0, len(members), RESIZE_CHUNK):
                chunk = members[start : start + RESIZE_CHUNK]
                with self._copying():
                    images = torch.empty((len(chunk), height, width, 3), dtype=torch.uint8, device=nhwc.device)
                    for image, (_, slot) in zip(images, chunk):
                        image.copy_(self.slots.pixels(slot, height, width), non_blocking=self.cuda)
                self._hand_over(images)
                rows = torch.tensor([row for row, _ in chunk], device=nhwc.device)
                nhwc.index_copy_(0, rows, self.cropper(images))

    def launch(self, batch: _Batch) -> None:
        if batch.rows == 0:
            return  # only errors: nothing to run
        rows = self.runtime.batching.run_size(batch.rows)
        batch.pixels[batch.rows : rows].zero_()  # padding rows; their logits are dropped
        with self._copying():
            nhwc = batch.pixels[:rows].to("cuda", non_blocking=True) if self.cuda else batch.pixels[:rows]
        self._hand_over(nhwc)
        if batch.decoded:
            self._resize_decoded(batch, nhwc)
        batch.logits = self.runtime.engine(self._pixels(nhwc))

    def results(self, batch: _Batch) -> Iterator[FileResult]:
        logits = batch.logits.float().cpu().numpy() if batch.logits is not None else None
        if batch.decoded:  # reading the logits waited for the engine, which waited for the copies
            self.slots.give_back(slot for _, slot, _, _ in batch.decoded)
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
    workers = options.workers or _usable_cpus()
    # Files go to the workers in small groups (fewer, larger messages), enough groups for every worker.
    group = max(1, min(8, size // workers))
    if isinstance(paths, Sequence):  # no more workers than groups: one photo starts no process pool
        workers = max(1, min(workers, -(-len(paths) // group)))
    window = size * (options.prefetch_batches + 1)  # files decoded ahead: what bounds memory
    # Slots for the files decoded ahead, the group being unpacked, the batch filling and the one in flight.
    slots = Slots(window + group + 2 * size, options.slot_pixels) if _resize_on_device(runtime, options, workers) else None
    runner = _Runner(runtime, size, slots)
    try:
        yield from _stream(runner, _decoder(options, workers, slots), iter(paths), group, window, workers)
    finally:
        if slots is not None:
            started = time.perf_counter()
            slots.close()
            log.info("decode slots released in %.2f s", time.perf_counter() - started)


def _stream(
    runner: _Runner, pool: Executor, source: Iterator, group: int, window: int, workers: int
) -> Iterator[FileResult]:
    slots = runner.slots
    with pool:
        pending: deque[tuple[list[str], list[int] | None, Future]] = deque()
        queued = 0

        def refill() -> None:
            nonlocal queued
            while queued < window:
                names = [str(p) for p in itertools.islice(source, group)]
                if not names:
                    return
                taken = slots.take(len(names)) if slots is not None else None
                pending.append((names, taken, pool.submit(_decode_files, runner.runtime.preprocess, names, taken)))
                queued += len(names)

        started = time.perf_counter()
        refill()
        log.info("decoding: %d %s started in %.2f s, resizing on %s", workers,
                 "threads" if isinstance(pool, ThreadPoolExecutor) else "processes", time.perf_counter() - started,
                 "the device" if slots is not None else "the decoders")
        if slots is not None and runner.cuda:  # the workers forked at the first submission: page-lock the slots now
            started = time.perf_counter()
            pinned = slots.pin()
            log.info("decode slots: %d MB %s in %.2f s", slots.bytes >> 20,
                     "page-locked" if pinned else "left pageable (cudaHostRegister refused)", time.perf_counter() - started)
        previous: _Batch | None = None
        batch = runner.new_batch()
        while pending:
            names, taken, future = pending.popleft()
            queued -= len(names)
            refill()
            for i, (image, decoded) in enumerate(zip(names, future.result())):
                if isinstance(decoded, tuple):
                    batch.add_decoded(image, taken[i], *decoded)
                else:
                    if taken is not None:
                        slots.give_back([taken[i]])
                    if isinstance(decoded, str):
                        batch.entries.append((image, None, decoded))
                        continue
                    batch.add(image, decoded)
                if batch.rows == runner.size:
                    runner.launch(batch)
                    if previous is not None:
                        yield from runner.results(previous)
                    previous, batch = batch, runner.new_batch()
        runner.launch(batch)
        if previous is not None:
            yield from runner.results(previous)
        yield from runner.results(batch)
        started = time.perf_counter()
    log.info("decoding: workers stopped in %.2f s", time.perf_counter() - started)
