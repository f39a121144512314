"""timm fp32's answers on the oracle's photos, computed on the CPU, kept in the work folder by the prepare phase.

The oracle needs two of them per entry: timm on its own eval transform of the photos (the reference) and timm
on the pixels trtmc's task array path makes of them (that path's input noise). Both run timm in fp32 on the CPU,
~3.6 s an entry in run 41's timed calls (118 s of a full bench's ~1,000 s of timing): the prepare phase, whose
processes run side by side, computes them beside its compiles and leaves them here, and the timed run takes them
when they were computed from the same checkpoint folder, photos and preprocessing; otherwise it computes them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..preprocess import PreprocessSpec
from . import oracle

if TYPE_CHECKING:
    from .runner import Photos

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimmAnswers:
    """timm fp32's logits on the photos ([photos, classes], float64), and what they were computed from."""

    source: str  # the checkpoint folder that holds the weights
    photos: tuple[str, ...]  # file names, in the order of the logits' rows
    preprocess: dict  # trtmc's preprocessing, which made the array path's pixels (`PreprocessSpec.to_json`)
    reference: torch.Tensor  # on timm's eval transform of the photos
    on_array_pixels: torch.Tensor  # on the pixels of the task's array path

    def answers_for(self, source: Path, photos: tuple[Path, ...], preprocess: PreprocessSpec) -> bool:
        """Whether these are the answers for this checkpoint folder, these photos and this preprocessing."""
        return (self.source, self.photos, self.preprocess) == (
            str(source), tuple(p.name for p in photos), preprocess.to_json())

    def save(self, path: Path) -> None:
        """Written whole or not at all: a prepare cut short leaves no half file for the timed run to read."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        torch.save({"source": self.source, "photos": list(self.photos), "preprocess": self.preprocess,
                    "reference": self.reference, "on_array_pixels": self.on_array_pixels}, partial)
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> "TimmAnswers | None":
        """The answers saved at `path`, or None where there are none or they cannot be read."""
        if not path.is_file():
            return None
        try:
            data = torch.load(path, weights_only=True)
            return cls(data["source"], tuple(data["photos"]), data["preprocess"], data["reference"],
                       data["on_array_pixels"])
        except Exception:  # a file from another version of this module: computed again, as if absent
            log.warning("could not read timm's answers in %s; computing them again", path, exc_info=True)
            return None


def compute(timm_model, source: Path, photos: Photos, preprocess: PreprocessSpec) -> TimmAnswers:
    """`timm_model` (fp32, on the CPU) on the photos' pixels from timm's eval transform and on those `preprocess`
    makes of the decoded photos (the task's array path)."""
    reference = oracle.reference(timm_model, photos.timm_pixels, photos.files)  # moves the model to the CPU in fp32
    array_pixels = torch.stack([preprocess.from_array(image) for image in photos.decoded])
    with torch.no_grad():
        on_arrays = timm_model(array_pixels).double()
    return TimmAnswers(str(source), reference.photos, preprocess.to_json(), reference.logits, on_arrays)
