"""The task `image_to_class_scores`: images in, every class logit out.

Input: image files in any format Pillow reads (JPEG, PNG, WebP, BMP, GIF, TIFF, ...; grayscale,
palette, CMYK and RGBA become RGB, 16-bit grayscale is scaled to 8 bits) or host RGB float32 HWC arrays
in [0, 1] of any size, one or a batch (a list, or an NHWC array). Preprocessing is the bundle's
contract (timm's eval transform). Output: all logits as float32 in checkpoint order, plus the
checkpoint's label names and descriptions (empty when it gave none: indices stay model-local) and
the vocabulary those names are (`vocabulary_id`, recorded when the bundle was built; empty when
unknown). The task has no options; invalid input is rejected, before inference, with a message
naming it. The C ABI (sdk/) serves the same task and returns the same fields.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .runtime import Runtime


class InvalidInput(ValueError):
    """An input image or array that the task refuses; the message names it and the problem."""


@dataclass(frozen=True)
class TopClass:
    index: int
    score: float  # softmax probability
    label: str
    description: str


@dataclass(frozen=True)
class ClassScores:
    logits: np.ndarray  # [N, classes] float32, checkpoint order
    label_names: tuple[str, ...] = ()
    label_descriptions: dict[str, str] = field(default_factory=dict)
    vocabulary_id: str = ""  # e.g. "imagenet-1k"; empty when the names are no known vocabulary

    def top(self, k: int = 5) -> list[list[TopClass]]:
        """The k most likely classes of each image, most likely first."""
        if k < 1:
            raise ValueError(f"top-k needs k >= 1, got {k}")
        logits = torch.from_numpy(self.logits).double()
        probs = torch.softmax(logits, dim=-1)
        values, indices = probs.topk(min(k, logits.shape[-1]), dim=-1)
        result = []
        for row_values, row_indices in zip(values.tolist(), indices.tolist()):
            row = []
            for score, index in zip(row_values, row_indices):
                label = self.label_names[index] if index < len(self.label_names) else ""
                row.append(TopClass(index, float(score), label, self.label_descriptions.get(label, "")))
            result.append(row)
        return result


def _describe(item: Any, position: int) -> str:
    return str(item) if isinstance(item, (str, Path)) else f"array #{position}"


# Pillow's 16-bit grayscale modes; `convert("RGB")` clips them at 255 (a 16-bit photo comes out white).
_SIXTEEN_BIT_GRAY = ("I;16", "I;16L", "I;16B", "I;16N")


def _to_rgb(image, path: Path):
    """RGB with 8 bits per channel, as timm's loader gives, for every mode Pillow opens.

    16-bit grayscale is scaled (v / 257, rounded) rather than clipped; 16-bit RGB(A) PNGs already open
    as 8-bit RGB(A). 32-bit integer and float images have no agreed range, so they are refused.
    """
    from PIL import Image

    if image.mode in _SIXTEEN_BIT_GRAY or (image.mode == "I" and image.format == "PNG"):
        gray = np.asarray(image, dtype=np.float64)
        return Image.fromarray(np.round(gray / 257.0).clip(0, 255).astype(np.uint8), "L").convert("RGB")
    if image.mode in ("I", "F"):
        raise InvalidInput(
            f"{path}: {image.mode!r} images ({'32-bit integer' if image.mode == 'I' else 'floating-point'} "
            "pixels) have no agreed range; convert it to 8-bit RGB, or pass a float32 HWC array in [0, 1]"
        )
    return image.convert("RGB")


def load_image(path: Path):
    """An image file as an 8-bit RGB PIL image; every unreadable file is an `InvalidInput` naming it."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise InvalidInput(f"{path}: no such image file")
    try:
        with Image.open(path) as image:
            image.load()
            if image.width == 0 or image.height == 0:
                raise InvalidInput(f"{path}: the image is empty (0 pixels)")
            return _to_rgb(image, path)
    except Image.DecompressionBombError as exc:
        raise InvalidInput(
            f"{path}: refused as a possible decompression bomb ({exc}); shrink the image, or raise "
            "PIL.Image.MAX_IMAGE_PIXELS in your own code if you trust the file"
        ) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput(
            f"{path}: not a readable image ({exc}); pass a file Pillow can open (JPEG, PNG, WebP, BMP, GIF, TIFF, ...)"
        ) from exc


def decode_image(path: str | Path) -> np.ndarray:
    """An image file as the task decodes it: RGB float32 HWC in [0, 1] (8-bit values / 255)."""
    return np.asarray(load_image(Path(path)), dtype=np.float32) / np.float32(255.0)


def _check_array_layout(array: np.ndarray, name: str) -> np.ndarray:
    """dtype and shape, on the host; the values are checked on the engine's device (`_check_values`)."""
    if array.dtype != np.float32:
        raise InvalidInput(f"{name}: arrays must be float32 RGB in [0, 1], got dtype {array.dtype}")
    if array.ndim != 3:
        raise InvalidInput(f"{name}: an image array must be HWC (rank 3), got shape {array.shape}")
    if array.shape[2] != 3:
        raise InvalidInput(f"{name}: an image array needs 3 channels (RGB, HWC), got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise InvalidInput(f"{name}: the image is empty (shape {array.shape})")
    return array


def _check_values(extremes: list[tuple[str, torch.Tensor]]) -> None:
    """Each array's (min, max), computed where the copy for the engine put its pixels, read in one go. The
    min and max carry any NaN or Inf."""
    if not extremes:
        return
    values = torch.stack([pair for _, pair in extremes]).tolist()
    for (name, _), (low, high) in zip(extremes, values):
        if not (np.isfinite(low) and np.isfinite(high)):
            raise InvalidInput(f"{name}: contains NaN or Inf")
        if low < 0.0 or high > 1.0:
            raise InvalidInput(f"{name}: values must lie in [0, 1], found [{low:g}, {high:g}]; divide 8-bit pixels by 255")


def _as_items(images: Any) -> list[Any]:
    if isinstance(images, (str, Path)):
        return [images]
    if isinstance(images, np.ndarray):
        if images.ndim == 4:
            if images.shape[0] == 0:
                raise InvalidInput(f"no images given: the NHWC batch is empty (shape {images.shape})")
            return list(images)
        if images.ndim == 3:
            return [images]
        raise InvalidInput(f"an image array must be HWC (rank 3) or NHWC (rank 4), got shape {images.shape}")
    if isinstance(images, Sequence):
        if len(images) == 0:
            raise InvalidInput("no images given")
        return list(images)
    raise InvalidInput(f"images must be file paths or float32 HWC arrays, got {type(images).__name__}")


def preprocess_images(runtime: Runtime, images: Any) -> torch.Tensor:
    """Validate every input, then turn them all into one normalized NCHW float32 batch."""
    items = _as_items(images)
    prepared = []
    for position, item in enumerate(items):
        name = _describe(item, position)
        if isinstance(item, (str, Path)):
            prepared.append((name, load_image(Path(item))))
        elif isinstance(item, np.ndarray):
            prepared.append((name, _check_array_layout(item, name)))
        else:
            raise InvalidInput(f"input #{position}: expected a file path or a float32 HWC array, got {type(item).__name__}")
    spec, device = runtime.preprocess, torch.device(runtime.device)
    # Files crop in PIL on the host (timm's exact transform). Arrays go to the engine's device as they are and
    # resize there (`_arrays_to_pixels`); their values are checked there too, every array's min and max read at
    # once, before the engine runs.
    pixels: list[torch.Tensor | None] = [None] * len(prepared)
    arrays = [(i, name, value) for i, (name, value) in enumerate(prepared) if isinstance(value, np.ndarray)]
    for i, chw in _arrays_to_pixels(spec, arrays, device):
        pixels[i] = chw
    for i, (name, value) in enumerate(prepared):
        if not isinstance(value, np.ndarray):
            pixels[i] = spec.from_pil(value).to(device)
    return torch.stack(pixels)


# Arrays travel to the engine's device in chunks of about this many bytes: each chunk is copied into one
# host buffer (page-locked on a GPU) and sent in one transfer, instead of one pageable transfer per array;
# only a chunk's raw pixels are on the device at a time (the resized crops stay).
STAGING_BYTES = 64 * 2**20


def _chunks(arrays: list, budget: int):
    """`arrays` ((index, name, array) in order) in runs of at most `budget` bytes (an array larger than the
    budget is a run of its own)."""
    run, size = [], 0
    for item in arrays:
        if run and size + item[2].nbytes > budget:
            yield run
            run, size = [], 0
        run.append(item)
        size += item[2].nbytes
    if run:
        yield run


def _read_only_tensor(array: np.ndarray) -> torch.Tensor:
    """The array's memory as a tensor, only to be read (torch refuses negative strides, and warns that a
    read-only array could be written through the tensor: the staging copy only reads it)."""
    if any(stride < 0 for stride in array.strides):
        array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def staged(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """The arrays on `device`, through one host buffer and one transfer: page-locked for a GPU, whose copy
    then runs asynchronously (torch's pinned-memory cache hands the buffer out again only after it).

    The copy into the buffer is torch's `copy_`, split over its intra-op threads: on the H200 machine, 128
    photos (423 MB) took 13.6 ms where numpy's one-thread `copyto` took 62.5, and the task at batch 128 went
    82.4 -> 32.5 ms, and in the bench 80 -> 30 ms for resnet50 (benchmarks/NOTES.md, run 11). The bench's task
    rows were noisier with it there (5 of 44 stable at their first attempt, 10 with numpy's copy; a guess not
    yet measured: a copy over 16 threads waits for the slowest of them)."""
    host = torch.empty(sum(a.size for a in arrays), dtype=torch.float32, pin_memory=device.type == "cuda")
    offset = 0
    for array in arrays:
        host[offset : offset + array.size].view(array.shape).copy_(_read_only_tensor(array))
        offset += array.size
    moved = host.to(device, non_blocking=True)
    views, offset = [], 0
    for array in arrays:
        views.append(moved[offset : offset + array.size].view(array.shape))
        offset += array.size
    return views


def _arrays_to_pixels(spec, arrays: list, device: torch.device):
    """(index, normalized CHW on `device`) for each (index, name, HWC array), after every array's values
    are checked; arrays of one size in a chunk are checked and resized together."""
    extremes, done = [], []
    for chunk in _chunks(arrays, STAGING_BYTES):
        by_size: dict[tuple[int, int], list[tuple[int, str, torch.Tensor]]] = {}
        for (index, name, _), hwc in zip(chunk, staged([a for _, _, a in chunk], device)):
            by_size.setdefault(hwc.shape[:2], []).append((index, name, hwc))
        for group in by_size.values():
            nhwc = torch.stack([hwc for _, _, hwc in group]) if len(group) > 1 else group[0][2][None]
            low, high = nhwc.flatten(1).aminmax(dim=1)
            extremes += [(index, name, pair) for (index, name, _), pair in zip(group, torch.stack([low, high], dim=1))]
            done += zip([index for index, _, _ in group], spec.from_arrays(nhwc).contiguous())
    _check_values([(name, pair) for _, name, pair in sorted(extremes, key=lambda e: e[0])])  # the first bad array named
    return done


def image_to_class_scores(runtime: Runtime, images: Any, **options: Any) -> ClassScores:
    """Every class logit for each image (see the module docstring for inputs and outputs)."""
    if options:
        raise TypeError(
            f"image_to_class_scores takes no options; got {', '.join(sorted(options))}. "
            "Preprocessing and precision are fixed by the bundle."
        )
    pixels = preprocess_images(runtime, images)
    logits = runtime.logits(pixels)
    return ClassScores(logits.astype(np.float32), runtime.label_names, runtime.label_descriptions, runtime.vocabulary_id)
