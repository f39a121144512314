"""Where an entry's weights come from: a local folder, the Hugging Face Hub, or random weights.

Random weights (`weights: random`, `--random-weights`) are written once into the work folder, in the
Hugging Face layout, so trtmc builds them exactly as a downloaded checkpoint, and calibrated on the
oracle's photos (`trtmc.random_weights.calibrate_on_photos`): each photo gets one clear winner, as with
a trained model, so that the oracle's top-1 and top-5 comparisons judge the computation rather than
the rounding of near-ties among 1000 random classes.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..files import exclusive_lock
from .spec import SpecError

log = logging.getLogger(__name__)

# results.md prints this when an entry ran on random weights.
RANDOM_WEIGHTS_TEXT = (
    "Random weights: timm's architecture with random norm parameters and layer scales, its batch-norm "
    "statistics measured on the oracle's photos and its first classifier rows imprinted with them, so that "
    "each photo has one clear winner as with a trained model (trtmc.random_weights); saved in the Hugging Face "
    "layout and built like a downloaded checkpoint. Speed does not depend on the weights."
)


@dataclass(frozen=True)
class ModelSource:
    """Where an entry's weights live, and what `trtmc build` is given."""

    folder: Path  # config.json + model.safetensors
    build_model: str  # the BuildRequest's model: the HF id or the folder
    architecture: str
    weights: str  # "checkpoint" or "random"


def _timm_name(model: str) -> str:
    """The timm model name of an HF id or a bare name: `timm/resnet50.a1_in1k` -> `resnet50.a1_in1k`."""
    return model.split("/", 1)[1] if model.count("/") == 1 else model


def _architecture(folder: Path) -> str:
    from ..checkpoint import Checkpoint

    return Checkpoint(folder).config.architecture


def photos_digest(photos: tuple[Path, ...]) -> str:
    """Names the photo set random weights were calibrated on, so another set gets its own folder."""
    text = "\n".join(f"{p.name}:{p.stat().st_size}" for p in photos)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def resolve_source(model: str, weights: str, workdir: Path, seed: int, photos: tuple[Path, ...]) -> ModelSource:
    """The checkpoint folder for an entry, writing random weights calibrated on `photos` into `workdir`
    when asked.

    `model` is a local folder, a Hugging Face id (fetched unless the weights are random) or a timm
    architecture name, which has no weights and so needs `weights: random`.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        if weights == "checkpoint":
            return ModelSource(path, str(path), _architecture(path), "checkpoint")
        timm_name = _architecture(path)
    elif weights == "random":
        timm_name = _timm_name(model)
    elif "/" in model:
        from ..checkpoint import open_checkpoint

        checkpoint = open_checkpoint(model)  # fetched (or cached) from the Hugging Face Hub
        return ModelSource(checkpoint.folder, model, checkpoint.config.architecture, "checkpoint")
    else:
        raise SpecError(
            f"model {model!r} is a timm architecture name, not a checkpoint: add `weights: random` to the entry "
            f"(or pass --random-weights), or give a Hugging Face id such as timm/{model}"
        )
    folder = Path(workdir) / "checkpoints" / f"{timm_name.replace('/', '_')}-random-seed{seed}-photos-{photos_digest(photos)}"
    # One process draws them; another preparing the same entry at once (its build and its baselines run side
    # by side) waits, then reuses them.
    with exclusive_lock(folder.with_name(folder.name + ".lock")):
        if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
            log.info("reusing random weights in %s", folder)
        else:
            _write_random_weights(timm_name, folder, seed, photos)
    return ModelSource(folder, str(folder), _architecture(folder), "random")


def _write_random_weights(timm_name: str, folder: Path, seed: int, photos: tuple[Path, ...]) -> None:
    from ..random_weights import RandomWeights, calibrate_on_photos, save_random_checkpoint, timm_pixels

    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        try:
            drawn = save_random_checkpoint(timm_name, Path(tmp) / "drawn", RandomWeights(seed))
        except ValueError as exc:  # not a timm model name
            raise SpecError(str(exc)) from exc
        calibrate_on_photos(drawn, folder, timm_pixels(drawn, photos))
