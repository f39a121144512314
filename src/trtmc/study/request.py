"""What a study runs: the model, the precisions, the images, the device and the batch sizes.

The variants are always the float32 reference first, then fp16 when a quantized precision is asked
for (the decision compares against it), then the precisions asked for. fp8 and int8 compute in fp16
around their quantized ops (`trtmc.build.QUANTIZED_COMPUTE`).

Calibration and held-out images never overlap: `split_images` refuses two folders that share an
image (by content, so a copy under another name counts). With neither folder given it splits the
photos shipped with trtmc by file name: the first half calibrates, the second half is held out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..backends import BACKENDS
from ..bench.oracle import PHOTOS, SHIPPED_PHOTOS
from ..bench.spec import TimingProtocol
from ..precision import PRECISIONS, QUANTIZED_FORMATS

REFERENCE = "fp32"
STUDY_PRECISIONS = tuple(PRECISIONS)  # fp32, fp16, bf16, fp8, int8: the order variants are listed in
DEFAULT_PRECISIONS = ("fp16", "bf16", "fp8", "int8")
DEFAULT_BATCHES = (1, 32, 128)
DEVICES = ("cuda", "cpu")


class StudyError(ValueError):
    """A study that cannot run as asked; the message names the option and the fix."""


@dataclass(frozen=True)
class StudyRequest:
    model: str  # Hugging Face id, checkpoint folder, or timm architecture name (with random_weights)
    out: Path  # study.md, study.json, study.png
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS
    calibration: Path | None = None  # folder of calibration images (with holdout)
    holdout: Path | None = None  # folder of held-out images (with calibration)
    random_weights: bool = False
    seed: int = 0  # of the random weights
    device: str = "cuda"
    backend: str = "inductor"
    batch_sizes: tuple[int, ...] = DEFAULT_BATCHES
    user_batches: tuple[int, ...] = ()  # where a quantized precision must be faster; () = every batch size
    protocol: TimingProtocol = field(default_factory=TimingProtocol)
    workdir: Path | None = None  # random weights and bundles; default OUT/work
    jobs: int = 1  # bundles built at once, each in a process of its own (1: in this process)

    @property
    def variants(self) -> tuple[str, ...]:
        """fp32, fp16 when a quantized precision is studied, and every precision asked for, in table order."""
        from ..build import computed_in  # here: the CLI imports this module, and trtmc.build loads torch

        wanted = {REFERENCE, *self.precisions}
        wanted |= {computed_in(p) for p in wanted}
        return tuple(p for p in STUDY_PRECISIONS if p in wanted)

    @property
    def quantized(self) -> tuple[str, ...]:
        return tuple(p for p in self.variants if p in QUANTIZED_FORMATS)

    @property
    def decision_batches(self) -> tuple[int, ...]:
        return self.user_batches or self.batch_sizes

    @property
    def work(self) -> Path:
        return Path(self.workdir) if self.workdir is not None else Path(self.out) / "work"

    def validate(self) -> None:
        unknown = [p for p in self.precisions if p not in STUDY_PRECISIONS]
        if unknown or not self.precisions:
            raise StudyError(f"--precision {unknown[0] if unknown else '(none)'}: choose from {', '.join(STUDY_PRECISIONS)}")
        if self.device not in DEVICES:
            raise StudyError(f"--device {self.device!r}: choose {' or '.join(DEVICES)}")
        if self.backend not in BACKENDS:
            raise StudyError(f"--backend {self.backend!r}: choose from {', '.join(BACKENDS)}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes) or len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise StudyError(f"--batch takes distinct sizes of at least 1, got {list(self.batch_sizes)}")
        if self.jobs < 1:
            raise StudyError(f"--jobs {self.jobs}: build at least 1 bundle at a time")
        stray = [b for b in self.user_batches if b not in self.batch_sizes]
        if stray:
            raise StudyError(f"--user-batch {stray[0]} is not measured: add --batch {stray[0]}")
        self.protocol.validate("the timing protocol")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise StudyError("--device cuda: PyTorch sees no CUDA GPU here; pass --device cpu to run the study's "
                                 "steps on the CPU (its times are then CPU times)")
        local = Path(self.model).expanduser().is_dir()
        if not self.random_weights and not local and "/" not in self.model:
            raise StudyError(
                f"{self.model!r} is a timm architecture name, not a checkpoint: pass --random-weights, or give a "
                f"Hugging Face id such as timm/{self.model} or a checkpoint folder"
            )
        for option, folder in (("--calibration", self.calibration), ("--holdout", self.holdout)):
            if folder is not None and not Path(folder).is_dir():
                raise StudyError(f"{option} {folder}: no such folder of images")
        if (self.calibration is None) != (self.holdout is None):
            raise StudyError(
                "give both --calibration DIR and --holdout DIR, or neither (then the photos in "
                f"{SHIPPED_PHOTOS} are split by file name)"
            )

    def command(self) -> str:
        """The `trtmc study` command line that asks for this study."""
        parts = ["trtmc study", self.model] + [f"--precision {p}" for p in self.precisions]
        if self.calibration is not None:
            parts += [f"--calibration {self.calibration}", f"--holdout {self.holdout}"]
        if self.random_weights:
            parts += ["--random-weights"] + ([f"--seed {self.seed}"] if self.seed else [])
        parts += [f"--device {self.device}", f"--backend {self.backend}"]
        parts += [f"--batch {b}" for b in self.batch_sizes] + [f"--user-batch {b}" for b in self.user_batches]
        return " ".join(parts + [f"--out {self.out}"])


@dataclass(frozen=True)
class ImageSplit:
    calibration: tuple[Path, ...]
    holdout: tuple[Path, ...]
    how: str  # one sentence for the report


def _images(folder: Path) -> tuple[Path, ...]:
    from ..pipeline import expand_images

    return tuple(expand_images([folder]))


def _by_content(files: tuple[Path, ...]) -> dict[str, Path]:
    from ..checkpoint import file_sha256

    return {file_sha256(f): f for f in files}


def split_images(calibration: Path | None, holdout: Path | None) -> ImageSplit:
    """The study's calibration and held-out images (see the module docstring)."""
    if calibration is None and holdout is None:
        files = _images(PHOTOS)
        if len(files) < 2:
            raise StudyError(f"{SHIPPED_PHOTOS} holds {len(files)} photos; a default split needs two: pass "
                             "--calibration DIR and --holdout DIR")
        half = len(files) // 2
        how = (f"no --calibration or --holdout was given, so the {len(files)} photos of {SHIPPED_PHOTOS} were split "
               f"by file name: the first {half} ({files[0].name} to {files[half - 1].name}) calibrate, the other "
               f"{len(files) - half} ({files[half].name} to {files[-1].name}) are held out")
        return ImageSplit(files[:half], files[half:], how)
    if calibration is None or holdout is None:
        raise StudyError("give both --calibration DIR and --holdout DIR, or neither")
    calibrating, held = _images(Path(calibration)), _images(Path(holdout))
    ours, theirs = _by_content(calibrating), _by_content(held)
    shared = sorted(set(ours) & set(theirs), key=lambda digest: str(theirs[digest]))
    if shared:
        pairs = ", ".join(f"{ours[d].name} = {theirs[d].name}" for d in shared[:3])
        raise StudyError(
            f"--calibration {calibration} and --holdout {holdout} share {len(shared)} image(s) ({pairs}): held-out "
            "images must be new to the calibration; remove them from one folder"
        )
    how = (f"{len(calibrating)} calibration images from {calibration} and {len(held)} held-out images from "
           f"{holdout} (no image in both, compared by content)")
    return ImageSplit(calibrating, held, how)
