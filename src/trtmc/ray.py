"""Classifying a Ray Dataset with a bundle: `ClassifyBatch` is the callable class `map_batches` wants.

Each Ray actor opens the bundle once (in `__init__`) and classifies the batches it is given. A batch
carries the images as an `image` column of HWC uint8 RGB arrays, as `ray.data.read_images(...,
mode="RGB")` yields them, or as a `path` column of file names; the result is the batch with `logits`
(float32, every class in checkpoint order) and the top-k `top_indices`, `top_scores` and `top_labels`
added. Pixels go through exactly the task's preprocessing, so the logits are those
`image_to_class_scores` gives for the same files.

    import ray
    from trtmc.ray import ClassifyBatch

    ds = ray.data.read_images("photos/", mode="RGB")
    ds = ds.map_batches(ClassifyBatch, fn_constructor_kwargs={"bundle": "lite0.bundle"},
                        compute=ray.data.ActorPoolStrategy(size=2), batch_size=64, num_gpus=1)
    ds.drop_columns(["image"]).write_parquet("scores/")

Actors load their engine for a quick start by default (`quick_start=True`, as `trtmc classify` does):
a CUDA inductor engine answers from its graph uncompiled rather than compiling in every actor first,
since the actors' decoding and preprocessing, not the engine, bound the run. Pass
`"quick_start": False` in `fn_constructor_kwargs` for the compiled engine.

Ray itself is not imported here: this module only needs numpy, PIL and trtmc (`pip install 'trtmc[ray]'`
installs Ray for the driver).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .runtime import LoadOptions, Runtime
from .tasks import ClassScores, InvalidInput, load_image


class ClassifyBatch:
    """`Dataset.map_batches(ClassifyBatch, fn_constructor_kwargs={"bundle": ...})`: adds logits and top-k."""

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
        """The batch's images resized and center-cropped as 8-bit NHWC, as the task crops files."""
        from PIL import Image

        spec = self.runtime.preprocess
        if "image" in batch:
            crops = []
            for position, array in enumerate(batch["image"]):
                array = np.asarray(array)
                if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
                    raise InvalidInput(
                        f"image #{position}: expected an HWC uint8 RGB array (ray.data.read_images(..., mode='RGB')), "
                        f"got {array.dtype} {array.shape}"
                    )
                crops.append(spec.crop_pil(Image.fromarray(array, "RGB")))
            return np.stack(crops)
        if "path" in batch:
            return np.stack([spec.crop_pil(load_image(Path(str(p)))) for p in batch["path"]])
        raise InvalidInput(f"the batch needs an 'image' or a 'path' column, it has {', '.join(batch) or 'none'}")

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if not len(next(iter(batch.values()), [])):
            raise InvalidInput("an empty batch")
        # Normalized where the engine runs, the whole batch at once (as trtmc.pipeline does): the same
        # float32 operations as the task's, so the same logits.
        crops = torch.from_numpy(self._crops(batch)).to(self.runtime.device)
        logits = self.runtime.logits(self.runtime.preprocess.normalize_bytes(crops))
        scores = ClassScores(logits, self.runtime.label_names, self.runtime.label_descriptions)
        top = scores.top(self.top_k)
        out = dict(batch)
        out["logits"] = logits
        out["top_indices"] = np.array([[t.index for t in row] for row in top], dtype=np.int64)
        out["top_scores"] = np.array([[t.score for t in row] for row in top], dtype=np.float32)
        out["top_labels"] = np.array([[t.label for t in row] for row in top], dtype=object)
        return out
