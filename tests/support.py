"""Test helpers: parity runs against timm, and checkpoints rewritten for refusal tests.

The random-weight checkpoints the tests compare with timm come from `trtmc.random_weights` (the
`timm_checkpoint` fixture), as they do for the bench and the tools.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trtmc.random_weights import calibrate_on_photos
from trtmc.random_weights import load_timm_model as load_timm  # the parity reference: timm holding the weights

# Everything the tests read lives in the repository (examples/images/SOURCE.md says where it came from).
REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "examples" / "images"
LITE0 = REPO / "examples" / "checkpoints" / "tf_efficientnet_lite0.in1k"
REFERENCE = IMAGES / "reference_tf_efficientnet_lite0.json"


def trtmc_module(folder: Path, precision: str = "fp32") -> torch.nn.Module:
    """trtmc's graph for a checkpoint as `trtmc build` makes it (batch norms folded, precision
    assigned), lowered to an uncompiled torch module; half convolutions run as GPU kernels compute
    them (fp32 products of the half values, rounded once), which is also 6x faster on a CPU."""
    from trtmc.backends.torch_lowering import GraphModule
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph
    from trtmc.passes.fold_batch_norm import fold_batch_norm
    from trtmc.passes.precision import PrecisionPolicy, assign_precision

    _, graph = build_graph(Checkpoint(folder), precision)
    typed = assign_precision(fold_batch_norm(graph), PrecisionPolicy(precision))
    return GraphModule(typed, half_convolutions_in_fp32=True).eval()


def random_pixels(folder: Path, batch: int = 2, seed: int = 1) -> torch.Tensor:
    config = json.loads((folder / "config.json").read_text())
    c, h, w = config["pretrained_cfg"].get("input_size", [3, 224, 224])
    return torch.randn(batch, c, h, w, generator=torch.Generator().manual_seed(seed))


@lru_cache(maxsize=8)
def photo_batch(input_size: tuple[int, int, int], interpolation: str, crop_pct: float, mean: tuple, std: tuple) -> torch.Tensor:
    """The 22 photos of examples/images through timm's own eval transform."""
    from PIL import Image
    from timm.data import create_transform

    transform = create_transform(
        input_size=input_size, interpolation=interpolation, crop_pct=crop_pct, mean=mean, std=std
    )
    paths = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))
    return torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])


def photos_for(folder: Path) -> torch.Tensor:
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    return photo_batch(
        tuple(cfg.get("input_size", (3, 224, 224))),
        cfg.get("interpolation", "bicubic"),
        float(cfg.get("crop_pct", 0.875)),
        tuple(cfg.get("mean", (0.485, 0.456, 0.406))),
        tuple(cfg.get("std", (0.229, 0.224, 0.225))),
    )


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """max |Δlogit| / max |logit|."""
    return float((ours.float() - reference.float()).abs().max() / reference.float().abs().max())


def kl_divergence(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """Mean KL(reference || ours) over the batch, from logits."""
    p = torch.log_softmax(reference.double(), -1)
    q = torch.log_softmax(ours.double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


# A top-1 flip in a low precision is a tie, not an error, when the reference's own margin is below
# four unit roundoffs of the precision (fp16 keeps 11 significant bits, bf16 8) of the largest logit.
TIE_MARGIN = {"fp16": 2.0**-9, "bf16": 2.0**-6}


def flip_margins(ours: torch.Tensor, reference: torch.Tensor) -> list[float]:
    """For each input whose top-1 differs: how far the reference ranks our pick below its own,
    relative to its largest logit. A flip with a margin below the precision's rounding is a tie."""
    reference = reference.float()
    picked = ours.float().argmax(-1, keepdim=True)
    flipped = (picked != reference.argmax(-1, keepdim=True)).flatten()
    margins = (reference.amax(-1, keepdim=True) - reference.gather(-1, picked)) / reference.abs().amax(-1, keepdim=True)
    return [float(m) for m in margins.flatten()[flipped]]


def fp32_relative_error(folder: Path, graph=None, *, batch: int = 1, reference: torch.nn.Module | None = None) -> float:
    """max |Δlogit| / max |logit| of trtmc's fp32 graph against timm on `batch` random images.

    `graph` replaces the family's graph (to show that another ArchConfig moves the logits);
    `reference` saves loading timm's model again.
    """
    from trtmc.backends.torch_lowering import GraphModule

    ours = trtmc_module(folder) if graph is None else GraphModule(graph).eval()
    reference = load_timm(folder) if reference is None else reference
    x = random_pixels(folder, batch)
    with torch.no_grad():
        return relative_error(ours(x), reference(x))


def check_parity(folder: Path, *, low_precision: tuple[str, ...] = ("fp16", "bf16")) -> dict:
    """fp32 relative error on random pixels; top-1 agreement and KL on the photos per precision.

    Returns the numbers so a test can assert and report them. The photos go through timm only
    when a low precision is asked for.
    """
    reference = load_timm(folder)
    report = {"fp32_rel_err": fp32_relative_error(folder, batch=2, reference=reference)}
    if not low_precision:
        return report
    photos = photos_for(folder)
    with torch.no_grad():
        expected = reference(photos)
        for precision in low_precision:
            got = trtmc_module(folder, precision)(photos).float()
            report[precision] = {
                "top1_agree": float((got.argmax(-1) == expected.argmax(-1)).float().mean()),
                "kl": kl_divergence(got, expected),
                "finite": bool(torch.isfinite(got).all()),
                "flip_margins": flip_margins(got, expected),
            }
    return report


def assert_keeps_top1(report: dict, max_kl: dict[str, float], *, near_ties: int = 0) -> None:
    """Each low precision of a `check_parity` report keeps timm's top-1 on every photo, with finite
    logits and mean KL below `max_kl[precision]`.

    `near_ties` photos may flip where timm's own margin is a tie at that precision (`TIE_MARGIN`):
    real weights can put a photo between two dog breeds, and any rounding, timm's own
    low-precision model included, may swap those.
    """
    for precision, limit in max_kl.items():
        got = report[precision]
        assert got["finite"] and got["kl"] < limit, f"{precision}: {report}"
        flips = got["flip_margins"]
        assert len(flips) <= near_ties and all(m < TIE_MARGIN[precision] for m in flips), f"{precision}: {report}"


def save_photo_calibrated_checkpoint(folder: Path, dest: Path) -> Path:
    """A copy of checkpoint `folder` that behaves on the repository's photos as a trained model would
    (`trtmc.random_weights.calibrate_on_photos`): with it a test can ask for what a trained model
    gives, timm's top-1 on every photo, in fp16 and in bf16."""
    return calibrate_on_photos(folder, dest, photos_for(folder))


def rewritten_checkpoint(source: Path, dest: Path, edit) -> Path:
    """A copy of checkpoint `source` in `dest` whose state dict went through `edit(state)` (in place),
    for tests that feed a family a malformed or foreign checkpoint."""
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True)
    (dest / "config.json").write_text((source / "config.json").read_text())
    state = load_file(str(source / "model.safetensors"))
    edit(state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dest / "model.safetensors"))
    return dest


def reconfigured_checkpoint(source: Path, dest: Path, *, architecture: str | None = None, input_size: int | None = None) -> Path:
    """Checkpoint `source`'s weights (linked, not copied) in `dest` under another architecture name
    or pretrained input size."""
    dest.mkdir(parents=True)
    (dest / "model.safetensors").symlink_to(source / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    if architecture is not None:
        config["architecture"] = architecture
        if "architecture" in config["pretrained_cfg"]:
            config["pretrained_cfg"]["architecture"] = architecture
    if input_size is not None:
        config["pretrained_cfg"]["input_size"] = [3, input_size, input_size]
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    return dest


def forbid_weight_reads(monkeypatch) -> None:
    """Make any `Checkpoint.tensor` call fail: a refusal must come from names and shapes alone."""
    from trtmc.checkpoint import Checkpoint

    def read(self, name):
        raise AssertionError(f"weights were read ({name}) before the layout was checked")

    monkeypatch.setattr(Checkpoint, "tensor", read)


def assert_refused_before_weights_load(folder: Path, monkeypatch, error: type[Exception], match: str) -> None:
    """`build_graph` refuses checkpoint `folder` with `error` matching `match`, reading no weight."""
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph

    forbid_weight_reads(monkeypatch)
    with pytest.raises(error, match=match):
        build_graph(Checkpoint(folder))


def watch_load_options(monkeypatch, backend_name: str) -> list:
    """The `LoadOptions` each load of backend `backend_name` is given from now on (its real load still runs)."""
    from trtmc.backends import LoadOptions, get_backend

    backend = get_backend(backend_name)
    real_load = backend.load
    asked: list = []

    def load(files, entry, graph, options=LoadOptions()):
        asked.append(options)
        return real_load(files, entry, graph, options)

    monkeypatch.setattr(backend, "load", load)
    return asked


class DispatchedOps(TorchDispatchMode):
    """Records the aten ops torch dispatches while active, each as (op, the last-dim strides of its tensor
    arguments): what an eager run copies (`aten::clone`), and what strides a kernel was handed."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func.name(), tuple(a.stride(-1) for a in args if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))

    def named(self, fragment: str) -> list[tuple[int, ...]]:
        """The strides of each call to an op whose name holds `fragment`."""
        return [strides for name, strides in self.calls if fragment in name]
