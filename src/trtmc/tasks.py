"""The task `image_to_class_scores`: images in, every class logit out.

Input: image files (JPEG, PNG; grayscale and RGBA become RGB) or host RGB float32 HWC arrays in
[0, 1] of any size, one or a batch (a list, or an NHWC array). Preprocessing is the bundle's
contract (timm's eval transform). Output: all logits as float32 in checkpoint order, plus the
checkpoint's label names and descriptions (empty when it gave none: indices stay model-local) and
the vocabulary those names are (`vocabulary_id`, recorded when the bundle was built; empty when
unknown). The task has no options; invalid input is rejected, before inference, with a message
naming it. The C ABI (sdk/) serves the same task and returns the same fields.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .runtime import Runtime


class InvalidInput(ValueError):
    """An input image or array that the task refuses; the message names it and the problem."""


# Vocabularies recognised by the sha256 of their label names joined with newlines: a checkpoint
# whose names are exactly these, in this order, shares the vocabulary's class indices.
KNOWN_VOCABULARIES = {
    # ImageNet-1k's 1000 WordNet synsets in the standard order (timm.data.ImageNetInfo)
    "385e0240499426c022b773be1ae4da780f057b89c9694c7f47199f62746b6edd": "imagenet-1k",
}


def vocabulary_id(label_names: Sequence[str]) -> str:
    """`imagenet-1k` for ImageNet's synsets in order; "" for any other names (indices stay model-local)."""
    return KNOWN_VOCABULARIES.get(hashlib.sha256("\n".join(label_names).encode()).hexdigest(), "")


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
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput(f"{path}: not a readable image ({exc}); pass a JPEG or PNG file") from exc


def decode_image(path: str | Path) -> np.ndarray:
    """An image file as the task decodes it: RGB float32 HWC in [0, 1] (8-bit values / 255)."""
    return np.asarray(load_image(Path(path)), dtype=np.float32) / np.float32(255.0)


def _check_array(array: np.ndarray, name: str) -> np.ndarray:
    if array.dtype != np.float32:
        raise InvalidInput(f"{name}: arrays must be float32 RGB in [0, 1], got dtype {array.dtype}")
    if array.ndim != 3:
        raise InvalidInput(f"{name}: an image array must be HWC (rank 3), got shape {array.shape}")
    if array.shape[2] != 3:
        raise InvalidInput(f"{name}: an image array needs 3 channels (RGB, HWC), got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise InvalidInput(f"{name}: the image is empty (shape {array.shape})")
    if not np.isfinite(array).all():
        raise InvalidInput(f"{name}: contains NaN or Inf")
    low, high = float(array.min()), float(array.max())
    if low < 0.0 or high > 1.0:
        raise InvalidInput(f"{name}: values must lie in [0, 1], found [{low:g}, {high:g}]; divide 8-bit pixels by 255")
    return array


def _as_items(images: Any) -> list[Any]:
    if isinstance(images, (str, Path)):
        return [images]
    if isinstance(images, np.ndarray):
        if images.ndim == 4:
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
            prepared.append(("file", load_image(Path(item))))
        elif isinstance(item, np.ndarray):
            prepared.append(("array", _check_array(item, name)))
        else:
            raise InvalidInput(f"input #{position}: expected a file path or a float32 HWC array, got {type(item).__name__}")
    spec = runtime.preprocess
    return torch.stack([spec.from_pil(v) if kind == "file" else spec.from_array(v) for kind, v in prepared])


def image_to_class_scores(runtime: Runtime, images: Any, **options: Any) -> ClassScores:
    """Every class logit for each image (see the module docstring for inputs and outputs)."""
    if options:
        raise TypeError(
            f"image_to_class_scores takes no options; got {', '.join(sorted(options))}. "
            "Preprocessing and precision are fixed by the bundle."
        )
    pixels = preprocess_images(runtime, images)
    logits = runtime.logits(pixels)
    vocabulary = str(runtime.bundle.labels.get("vocabulary_id", ""))  # absent from bundles older than it
    return ClassScores(logits.astype(np.float32), runtime.label_names, runtime.label_descriptions, vocabulary)
