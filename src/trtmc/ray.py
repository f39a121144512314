"""Classifying a Ray Dataset with a bundle, in two `map_batches` stages: `CropImages` on CPU tasks, then
`ClassifyBatch` on actors that hold the engine.

This is Ray Data's pattern for batch inference: the per-image host work in its own stateless stage, which
Ray spreads over as many CPU tasks as there are free cores, and the actors (one engine each, on a GPU
where there is one) doing only what needs the engine.

- `CropImages(bundle)` (an instance: Ray runs it as tasks) resizes and center-crops each image exactly as
  the task does (timm's eval transform, in PIL) to the bundle's input size. A batch carries the images as
  an `image` column of HWC uint8 RGB arrays, as `ray.data.read_images(..., mode="RGB")` yields them, or
  as a `path` column of file names. It returns the batch with a `crop` column (uint8 NHWC, the bundle's
  input size) in place of the full-size `image` column, so the decoded photos never travel further.
- `ClassifyBatch` (a class: Ray runs it on actors, each opening the bundle once) normalizes a batch's
  `crop` column on the engine's device, runs the engine and adds `logits` (float32, every class in
  checkpoint order) and the top-k `top_indices`, `top_scores` and `top_labels` (a list of names per row).
  It also takes an `image` or `path` column and crops it itself, as before. Its output carries no pixel
  column: `image` and `crop` are dropped, every other column (`path`, ...) is kept.

Pixels go through exactly the task's preprocessing, so the logits are those `image_to_class_scores`
gives for the same files.

    import ray
    from trtmc.ray import ClassifyBatch, CropImages

    ds = ray.data.read_images("photos/", mode="RGB", include_paths=True)
    ds = ds.map_batches(CropImages("lite0.bundle"))  # no batch_size: Ray fuses it into the read tasks
    ds = ds.map_batches(ClassifyBatch, fn_constructor_kwargs={"bundle": "lite0.bundle"},
                        compute=ray.data.ActorPoolStrategy(size=2), batch_size=64, num_gpus=1)
    ds.write_parquet("scores/")

Ray fuses a stage run as tasks into the stage after it when the two ask for the same resources (after a
read, only when the second has no `batch_size`). So `CropImages` without a `batch_size` runs inside the read
tasks: each crops the photos it decoded, and only the crops reach the object store. The actors must ask for
other resources than the tasks (`num_gpus`; on CPUs alone, e.g. `num_cpus=2`), or Ray fuses the crop into
the actors, and each crops on its one core again.

Actors load their engine for a quick start by default (`quick_start=True`, as `trtmc classify` does):
a CUDA inductor engine answers from its graph uncompiled rather than compiling in every actor first.
Pass `"quick_start": False` in `fn_constructor_kwargs` for the compiled engine.

Ray itself is not imported here: this module only needs numpy, PIL and trtmc (`pip install 'trtmc[ray]'`
installs Ray for the driver).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .bundle import read_bundle
from .preprocess import PreprocessSpec
from .runtime import LoadOptions, Runtime
from .tasks import ClassScores, InvalidInput, load_image

# The columns that hold pixels: `ClassifyBatch` returns neither.
PIXEL_COLUMNS = ("image", "crop")
_READ_IMAGES = "ray.data.read_images(..., mode='RGB')"


def _without_pixels(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's other columns (`path`, ids, ...), as both stages pass them on."""
    return {name: column for name, column in batch.items() if name not in PIXEL_COLUMNS}


def crop_batch(spec: PreprocessSpec, batch: dict[str, Any]) -> np.ndarray:
    """A batch's `image` (HWC uint8 RGB arrays) or else `path` column resized and center-cropped as 8-bit
    NHWC, exactly as the task crops files (`PreprocessSpec.crop_pil`)."""
    from PIL import Image

    if "image" in batch:
        crops = []
        for position, array in enumerate(batch["image"]):
            array = np.asarray(array)
            if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
                raise InvalidInput(
                    f"image #{position}: expected an HWC uint8 RGB array ({_READ_IMAGES}), "
                    f"got {array.dtype} {array.shape}"
                )
            crops.append(spec.crop_pil(Image.fromarray(array, "RGB")))
    elif "path" in batch:
        crops = [spec.crop_pil(load_image(Path(str(p)))) for p in batch["path"]]
    else:
        raise InvalidInput(
            f"the batch needs an 'image' or a 'path' column, it has {', '.join(batch) or 'none'}; read the "
            f"images with {_READ_IMAGES} (an 'image' column) or pass their file names as 'path'"
        )
    if not crops:
        return np.zeros((0, *spec.input_size, 3), np.uint8)
    return np.stack(crops)


class CropImages:
    """`Dataset.map_batches(CropImages(bundle))`: the full-size `image` (or `path`) column becomes a `crop`
    column of the bundle's input size; every other column is kept. Without a `batch_size`, Ray runs it inside
    the read tasks (module docstring).

    Made on the driver from the bundle's preprocessing contract only (no engine is loaded); Ray ships that
    small object to stateless CPU tasks. `bundle` is a bundle path (checked as `read_bundle` checks it,
    against `expect_sha256` when given) or a `PreprocessSpec`.
    """

    def __init__(self, bundle: str | Path | PreprocessSpec, *, expect_sha256: str | None = None) -> None:
        self.preprocess: PreprocessSpec = (
            bundle if isinstance(bundle, PreprocessSpec) else read_bundle(Path(bundle), expect_sha256).preprocess
        )

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {**_without_pixels(batch), "crop": crop_batch(self.preprocess, batch)}


class ClassifyBatch:
    """`Dataset.map_batches(ClassifyBatch, fn_constructor_kwargs={"bundle": ...})`: adds logits and top-k
    to a batch of `crop`s (from `CropImages`), or of `image`s or `path`s, and drops the pixel columns."""

    def __init__(
        self, bundle: str | Path, top_k: int = 5, engine: str | None = None, *, quick_start: bool = True
    ) -> None:
        """`quick_start`: `LoadOptions.quick_start` (the CUDA inductor engine runs uncompiled, loading at
        once; other engines load as always)."""
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        self.runtime = Runtime.open(bundle, engine=engine, options=LoadOptions(quick_start=quick_start))
        self.top_k = top_k

    def _crops(self, batch: dict[str, Any]) -> np.ndarray:
        """The batch's crops as 8-bit NHWC of the bundle's input size: its `crop` column as given, or its
        images cropped here."""
        if "crop" not in batch:
            if "image" not in batch and "path" not in batch:
                raise InvalidInput(
                    f"the batch needs a 'crop', an 'image' or a 'path' column, it has {', '.join(batch) or 'none'}; "
                    f"read the images with {_READ_IMAGES} and crop them with trtmc.ray.CropImages(bundle)"
                )
            return crop_batch(self.runtime.preprocess, batch)
        column = batch["crop"]
        wanted = (*self.runtime.preprocess.input_size, 3)
        fix = (f"this bundle needs uint8 NHWC crops of (N, {', '.join(map(str, wanted))}), as "
               "trtmc.ray.CropImages(bundle) makes them with this bundle: crop with the same bundle, or pass "
               "the 'image' column instead")
        crops = np.asarray(column)
        if crops.dtype == object:  # a ragged column arrives as an object array of arrays
            arrays = [np.asarray(c) for c in column]
            shapes = sorted({(a.dtype.name, a.shape) for a in arrays}, key=str)
            if len(shapes) > 1:
                raise InvalidInput(f"the 'crop' column holds crops of {len(shapes)} shapes ({shapes[:3]}); {fix}")
            crops = np.stack(arrays)
        if crops.dtype != np.uint8 or crops.shape[1:] != wanted:
            raise InvalidInput(f"the 'crop' column holds {crops.dtype} {crops.shape}; {fix}")
        return crops

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if not len(next(iter(batch.values()), [])):
            raise InvalidInput("an empty batch")
        # Normalized where the engine runs, the whole batch at once (as trtmc.pipeline does): the same
        # float32 operations as the task's, so the same logits. A crop column from Ray's object store is
        # read-only; torch wants a writable array, so only such a column is copied (one small copy).
        crops = np.require(self._crops(batch), np.uint8, ["C_CONTIGUOUS", "WRITEABLE"])
        pixels = torch.from_numpy(crops).to(self.runtime.device)
        logits = self.runtime.logits(self.runtime.preprocess.normalize_bytes(pixels))
        scores = ClassScores(logits, self.runtime.label_names, self.runtime.label_descriptions)
        top = scores.top(self.top_k)
        out = _without_pixels(batch)
        out["logits"] = logits
        out["top_indices"] = np.array([[t.index for t in row] for row in top], dtype=np.int64)
        out["top_scores"] = np.array([[t.score for t in row] for row in top], dtype=np.float32)
        # One list of names per row: an Arrow list<string> column (a 2-D object array would be pickled).
        labels = np.empty(len(top), dtype=object)
        for i, row in enumerate(top):
            labels[i] = [t.label for t in row]
        out["top_labels"] = labels
        return out


__all__ = ["ClassifyBatch", "CropImages", "PIXEL_COLUMNS", "crop_batch"]
