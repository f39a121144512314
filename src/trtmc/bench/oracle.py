"""The oracle: does a row answer what timm fp32 eager answers, photo by photo?

timm's model with the entry's weights, in fp32 on the CPU (no TF32, no autotuned kernels), classifies
every photo of a folder (the shipped `examples/images`: 22) through timm's own eval transform. A row is
judged after timing, untimed, on the same photos fed in chunks of its batch size: on each photo its
top-1 class and its top-5 set must be timm's. A class may stand in for one of timm's where timm's own
logits put it within a tie tolerance of timm's k-th logit (a rounding tie at the row's precision, not a
wrong answer). The tolerance is a fixed fraction of the largest logit for the row's precision and
input, plus twice what timm's own model strays from its fp32 logits on that photo when it computes at
the row's precision, and (for the task scope) when it is given the pixels of the task's array path,
both measured in the run: a difference timm itself makes that way is no error of the row.
A single photo would be a weak oracle: random weights can give every photo one class.
The folder scope's files, copies of the photos, are judged by `judge_top1`: each file's top-1 class
against timm's on the photo it copies, with the same ties.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:  # torch is imported where the oracle computes, not to read this module
    import torch

SHIPPED_PHOTOS = "examples/images"  # in the repository, beside src/
PHOTOS = Path(__file__).resolve().parents[3] / SHIPPED_PHOTOS
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
TOP_K = (1, 5)
# A class may take the place of one of timm's top-k where timm's own logit for it is within this fraction
# of timm's largest |logit| below timm's k-th. Measured on the CPU (torch 2.14, 22 photos; trtmc's graph
# with half convolutions as fp32 products rounded once, and timm's own model cast to bf16) on the
# photo-calibrated random weights of efficientnet_b0, mobilenetv3_large_100, regnetx_002 and ghostnet_100,
# and on the real tf_efficientnet_lite0: the largest such gap was 7.0e-4 in fp16 and 4.6e-2 in bf16
# (trtmc's regnetx_002; timm's own bf16 model 2.1e-2). fp32 takes fp16's bound: on a GPU timm's fp32
# convolutions run in TF32, which keeps fp16's 10 mantissa bits.
TIE_TOLERANCE = {"fp32": 2.0**-8, "fp16": 2.0**-8, "bf16": 2.0**-3}
# Added for rows that take decoded float32 arrays (the task scope): trtmc resizes those in float with
# antialiasing where timm resizes 8-bit images in PIL, and the pixels differ by up to 0.115 after
# normalization on the shipped photos. On the checkpoints above (224 px, fp32) that alone opened top-5
# gaps up to 9.9e-3; on regnetx_002 at 64 px (the CPU tests' model: an 8x downscale) up to 4.5e-2. Some
# random weights amplify those pixels far more: on fbnetc_100's (the bench's, seed 0) one photo's pixels,
# 0.0175 apart (one 8-bit level), move timm's own fp32 logits by 38% of the largest and 3 of its top 5
# (measured on the CPU, torch 2.14), hence the measured noise below.
ARRAY_INPUT_TOLERANCE = 2.0**-4
# Two logits whose errors are each as large as timm's own at a precision can swap places when they are
# this many times that error apart. The fixed tolerances above come from five models; some random
# weights are far more sensitive: on regnety_016's (the bench's, seed 0) timm's own fp16 model strays up
# to 2.9% of the largest logit from its fp32 one on the 22 photos, and under the fixed fp16 tolerance
# it would itself be wrong on 2 of them (measured on the CPU, torch 2.14); trtmc's fp16 engine on the H200
# put a class 4.1e-3 of the largest logit behind timm's 5th in its top 5 (run 6).
NOISE_FACTOR = 2.0


def tolerance(precision: str, arrays_in: bool = False) -> float:
    """The tie tolerance of a row computing in `precision`, taking decoded arrays or not."""
    return TIE_TOLERANCE[precision] + (ARRAY_INPUT_TOLERANCE if arrays_in else 0.0)


def photo_files(folder: Path | None = None) -> tuple[Path, ...]:
    """The oracle's images: every image file in `folder` (default: the shipped photos), sorted by name."""
    folder = PHOTOS if folder is None else Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder}: no such folder of photos for the oracle; pass --photos DIR (a folder of JPEG/PNG images)"
        )
    files = tuple(sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES))
    if not files:
        raise FileNotFoundError(f"{folder}: holds no {'/'.join(IMAGE_SUFFIXES)} image for the oracle; pass --photos DIR")
    return files


@dataclass(frozen=True)
class Reference:
    """timm fp32 eager's logits on the oracle's photos, and how far timm's own answers computed the
    ways a row computes them stray from those on each photo (the largest |difference| over the
    classes, summed over the ways; None until `with_noise` measures one)."""

    photos: tuple[str, ...]  # file names, in the order of the logits' rows
    logits: "torch.Tensor"  # [photos, classes], float64
    noise: "torch.Tensor | None" = None  # [photos], float64

    def allowed(self, tolerance: float) -> "torch.Tensor":
        """Each photo's tie allowance in logits, for a row whose fixed tolerance is `tolerance`."""
        fixed = tolerance * self.logits.abs().amax(dim=-1)
        return fixed if self.noise is None else fixed + NOISE_FACTOR * self.noise

    def with_noise(self, logits) -> "Reference":
        """This reference with the stray of `logits` added to its noise: timm's own answers on the same
        photos computed another way a row computes them (at the row's precision, on any device; or from
        the pixels a row's input path makes)."""
        import torch

        theirs = torch.as_tensor(logits).double().cpu()
        if tuple(theirs.shape) != tuple(self.logits.shape):
            raise ValueError(f"noise logits of shape {tuple(theirs.shape)} for a reference of {tuple(self.logits.shape)}")
        stray = (theirs - self.logits).abs().amax(dim=-1)
        return Reference(self.photos, self.logits, stray if self.noise is None else self.noise + stray)

    def to_json(self) -> dict:
        top5 = self.logits.topk(max(TOP_K), dim=-1).indices.tolist()
        data = {"photos": len(self.photos), "top5": {name: row for name, row in zip(self.photos, top5)}}
        if self.noise is not None:  # as a fraction of each photo's largest logit, as the tolerances are
            relative = self.noise / self.logits.abs().amax(dim=-1)
            data["noise"] = {name: round(float(r), 6) for name, r in zip(self.photos, relative)}
        return data


def reference(model, pixels, photos: tuple[Path, ...]) -> Reference:
    """timm `model` (fp32, on the CPU) on `pixels`, the photos through timm's eval transform."""
    import torch

    with torch.no_grad():
        logits = model.float().cpu()(pixels).double()
    return Reference(tuple(p.name for p in photos), logits)


@dataclass(frozen=True)
class Mismatch:
    """A photo on which a row's top-k is not timm's, beyond ties."""

    photo: str
    k: int
    ours: tuple[int, ...]
    timm: tuple[int, ...]

    def describe(self) -> str:
        what = "top-1 class" if self.k == 1 else f"top-{self.k} set"
        return f"{self.photo}: {what} {_classes(self.ours)} where timm's is {_classes(self.timm)}"


def _classes(indices: tuple[int, ...]) -> str:
    return str(indices[0]) if len(indices) == 1 else "{" + ", ".join(map(str, indices)) + "}"


@dataclass(frozen=True)
class Verdict:
    """The oracle's judgement of one row."""

    photos: int
    mismatches: tuple[Mismatch, ...] = ()
    non_finite: tuple[str, ...] = ()  # photos whose logits hold a NaN or an infinity

    @property
    def right(self) -> bool:
        return not self.mismatches and not self.non_finite

    @property
    def wrong_photos(self) -> int:
        return len({m.photo for m in self.mismatches} | set(self.non_finite))

    def describe(self, most: int = 2) -> str:
        if self.right:
            return f"right on {self.photos} photos"
        parts = [m.describe() for m in self.mismatches[:most]]
        if self.non_finite:
            parts.append(f"non-finite logits on {', '.join(self.non_finite[:most])}")
        return f"wrong on {self.wrong_photos} of {self.photos} photos ({'; '.join(parts)})"

    def to_json(self) -> dict:
        return {
            "right": self.right,
            "photos": self.photos,
            "wrong_photos": self.wrong_photos,
            "mismatches": [m.describe() for m in self.mismatches],
            "non_finite": list(self.non_finite),
        }


def judge(logits, ref: Reference, tolerance: float) -> Verdict:
    """`logits` [photos, classes] of a row against timm's, ties within `tolerance` (see `tolerance()`)."""
    import torch

    ours = torch.as_tensor(logits).double().cpu()
    if tuple(ours.shape) != tuple(ref.logits.shape):
        raise ValueError(f"the oracle expects logits of shape {tuple(ref.logits.shape)}, got {tuple(ours.shape)}")
    mismatches, non_finite = [], []
    for name, row, timm, allowed in zip(ref.photos, ours, ref.logits, ref.allowed(tolerance).tolist()):
        if not torch.isfinite(row).all():
            non_finite.append(name)
            continue
        for k in TOP_K:
            theirs = timm.topk(k)
            picked = row.topk(k).indices.tolist()
            outsiders = [c for c in picked if c not in theirs.indices.tolist()]
            if any(float(theirs.values[-1] - timm[c]) > allowed for c in outsiders):
                mismatches.append(Mismatch(name, k, tuple(picked), tuple(theirs.indices.tolist())))
                break  # one line per photo: top-1 first
    return Verdict(len(ref.photos), tuple(mismatches), tuple(non_finite))


def judge_top1(files: Sequence[str], classes: Sequence[int], photos: Sequence[int], ref: Reference, tolerance: float) -> Verdict:
    """Each file's top-1 class (`classes`) against timm's on the photo it is a copy of (`photos`: that
    photo's row in `ref`), a class within `tolerance` of timm's top logit counting as a tie (see `judge`)."""
    winners = ref.logits.argmax(dim=-1).tolist()
    allowed = ref.allowed(tolerance).tolist()
    mismatches = []
    for name, ours, row in zip(files, classes, photos):
        timm = winners[row]
        if ours == timm:
            continue
        tie = 0 <= ours < ref.logits.shape[1] and float(ref.logits[row, timm] - ref.logits[row, ours]) <= allowed[row]
        if not tie:
            mismatches.append(Mismatch(name, 1, (int(ours),), (timm,)))
    return Verdict(len(files), tuple(mismatches))


def in_chunks(run: Callable, inputs, batch: int, pad: bool):
    """`run` over `inputs` (a tensor or a list) in chunks of `batch`, the answers concatenated.

    With `pad`, a short last chunk is padded with zero rows to `batch` (an engine compiled for that
    size takes nothing else), and the padding's answers are dropped.
    """
    import numpy as np
    import torch

    answers = []
    for start in range(0, len(inputs), batch):
        chunk = inputs[start : start + batch]
        n = len(chunk)
        if pad and n < batch:
            chunk = torch.cat([chunk, chunk.new_zeros((batch - n,) + tuple(chunk.shape[1:]))])
        out = run(chunk)
        out = torch.from_numpy(out) if isinstance(out, np.ndarray) else out
        answers.append(out.detach().float().cpu()[:n])
    return torch.cat(answers)


def describe(folder: str, photos: int | None = None) -> str:
    """The oracle in words, from the constants it runs with (the help text and results.md print this)."""
    tolerances = ", ".join(f"{p} {t:.3g}" for p, t in TIE_TOLERANCE.items())
    count = "" if photos is None else f"{photos} "
    return (
        f"Oracle, after timing and untimed: every row (trtmc's engine and task scopes and every baseline, at "
        f"its batch size) classifies the {count}photos of {folder} in chunks of its batch size; on each photo "
        f"its top-1 class and its top-5 set must be those of timm fp32 eager on the CPU (same weights, timm's "
        f"eval transform), except where timm's own logits make the difference a tie: within a fraction of the "
        f"largest logit ({tolerances}; {ARRAY_INPUT_TOLERANCE:.3g} more for the task scope, which resizes "
        f"decoded float arrays where timm resizes 8-bit images), plus {NOISE_FACTOR:g}x what timm's own "
        f"model strays from its fp32 logits on that photo at the row's precision (eager, on the bench's device) and, "
        f"for the task scope, on the pixels of the task's array path. "
        f"A wrong trtmc row fails the entry whatever its speed; a wrong baseline is shown as "
        f"wrong, with no ratio."
    )
