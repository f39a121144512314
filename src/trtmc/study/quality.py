"""How close a variant's answers are to timm fp32's on the held-out images, and whether any is not finite.

Against timm fp32 (the bench oracle's reference: timm's model with the same weights, fp32 on the CPU,
timm's eval transform): top-1 agreement (an image whose logits hold a NaN or an infinity does not
agree), KL(timm || variant) of the softmax, mean and 99th percentile over the images, and the oracle's
own verdict at the variant's compute precision (top-1 and top-5, ties allowed). Against labels: top-1
on the images whose file name carries an ImageNet class (`imagenet_NN_LABEL.jpg`, as the photos
shipped with trtmc do).

The non-finite scan adds stress inputs to the held-out images: normalized noise with standard
deviations 1, 3 and 10, and constant black, grey and white images through the bundle's normalization.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..bench import oracle

if TYPE_CHECKING:
    import torch

    from ..preprocess import PreprocessSpec

LABELLED_NAME = re.compile(r"^imagenet_\d+_(\d+)\.\w+$")
KL_PERCENTILE = 99
STRESS_STDS = (1.0, 3.0, 10.0)
NOISE_PER_STD = 4
CONSTANT_PIXELS = {"black": 0.0, "grey": 0.5, "white": 1.0}


def label_of(path: Path | str) -> int | None:
    """The ImageNet class a file name carries (`imagenet_07_609.jpg` -> 609), or None."""
    match = LABELLED_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Quality:
    """One variant's answers on the held-out images, at one batch size."""

    images: int
    agreement: float  # fraction whose top-1 is timm fp32's
    kl_mean: float | None  # over the images with finite logits; None when there are none
    kl_p99: float | None
    labelled: int  # images whose file name carries a label
    label_top1: float | None  # fraction of those whose top-1 is the label
    non_finite: int  # images whose logits hold a NaN or an infinity
    verdict: oracle.Verdict

    def to_json(self) -> dict:
        return {
            "images": self.images,
            "top1_agreement": round(self.agreement, 6),
            "kl_mean": None if self.kl_mean is None else float(f"{self.kl_mean:.6g}"),
            f"kl_p{KL_PERCENTILE}": None if self.kl_p99 is None else float(f"{self.kl_p99:.6g}"),
            "labelled": self.labelled,
            "label_top1": None if self.label_top1 is None else round(self.label_top1, 6),
            "non_finite": self.non_finite,
            "oracle": self.verdict.to_json(),
        }


def finite_rows(logits: "torch.Tensor") -> "torch.Tensor":
    """A boolean per row: every logit finite."""
    import torch

    return torch.isfinite(logits).all(dim=-1)


def kl_divergences(logits: "torch.Tensor", reference: "torch.Tensor") -> "torch.Tensor":
    """KL(reference || logits) of the softmax, per row, in float64."""
    import torch

    p = torch.log_softmax(reference.double(), dim=-1)
    q = torch.log_softmax(logits.double(), dim=-1)
    return (p.exp() * (p - q)).sum(dim=-1)


def measure(logits: "torch.Tensor", ref: oracle.Reference, tolerance: float) -> Quality:
    """`logits` [images, classes] of a variant against timm's `ref` on the same images, in order."""
    import numpy as np
    import torch

    ours = torch.as_tensor(logits).double().cpu()
    finite = finite_rows(ours)
    agree = (ours.argmax(dim=-1) == ref.logits.argmax(dim=-1)) & finite
    kl = kl_divergences(ours[finite], ref.logits[finite]).numpy()
    labels = [label_of(name) for name in ref.photos]
    labelled = [i for i, label in enumerate(labels) if label is not None]
    right = [bool(finite[i]) and int(ours[i].argmax()) == labels[i] for i in labelled]
    return Quality(
        images=len(ref.photos),
        agreement=float(agree.double().mean()),
        kl_mean=float(kl.mean()) if kl.size else None,
        kl_p99=float(np.percentile(kl, KL_PERCENTILE)) if kl.size else None,
        labelled=len(labelled),
        label_top1=sum(right) / len(right) if right else None,
        non_finite=int((~finite).sum()),
        verdict=oracle.judge(ours, ref, tolerance),
    )


@dataclass(frozen=True)
class StressInputs:
    names: tuple[str, ...]
    pixels: "torch.Tensor"  # [inputs, 3, H, W], normalized float32, as the engine takes them


def stress_inputs(spec: "PreprocessSpec", seed: int = 0) -> StressInputs:
    """Noise and constant images in the engine's input space (see the module docstring)."""
    import torch

    shape = (3, *spec.input_size)
    generator = torch.Generator().manual_seed(seed)
    names, images = [], []
    for std in STRESS_STDS:
        for i in range(NOISE_PER_STD):
            names.append(f"noise std {std:g} #{i}")
            images.append(torch.randn(shape, generator=generator) * std)
    mean = torch.tensor(spec.mean).reshape(3, 1, 1)
    deviation = torch.tensor(spec.std).reshape(3, 1, 1)
    for name, value in CONSTANT_PIXELS.items():
        names.append(f"constant {name}")
        images.append(((torch.full(shape, value) - mean) / deviation).float())
    return StressInputs(tuple(names), torch.stack(images))


def non_finite_names(logits: "torch.Tensor", names: Sequence[str]) -> tuple[str, ...]:
    """The names of the rows of `logits` that hold a NaN or an infinity."""
    return tuple(name for name, ok in zip(names, finite_rows(logits).tolist()) if not ok)


def describe() -> str:
    """The quality and non-finite measures in words, from the constants above (the report prints this)."""
    noise = ", ".join(f"{s:g}" for s in STRESS_STDS)
    return (
        "Quality, on the held-out images and at every batch size: top-1 agreement with timm fp32 (the bench "
        "oracle's reference: timm's model with the same weights, fp32 on the CPU, timm's eval transform; an image "
        f"with a non-finite logit does not agree), KL(timm || variant) of the softmax (mean and p{KL_PERCENTILE} "
        "over the images), top-1 against the ImageNet class in the file name where it carries one "
        "(imagenet_NN_LABEL.jpg), and the bench oracle's verdict at the variant's compute precision (top-1 and "
        "top-5, near-ties allowed). Non-finite scan, at every batch size: the held-out images plus "
        f"{NOISE_PER_STD * len(STRESS_STDS) + len(CONSTANT_PIXELS)} stress inputs ({NOISE_PER_STD} normalized noise "
        f"images for each standard deviation {noise}; constant {', '.join(CONSTANT_PIXELS)} images through the "
        "bundle's normalization)."
    )
