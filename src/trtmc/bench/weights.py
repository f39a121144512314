"""Checkpoints for the bench: resolving an entry's model, random weights, and timm's reference model.

timm is needed only here (random weights, the oracle, the baselines), so it is imported lazily.
A random-weight checkpoint is written in the Hugging Face layout (`config.json` with timm's
`pretrained_cfg`, `model.safetensors`), so trtmc builds it exactly as a downloaded one. Unlike the
parity tests' weights (tests/support.py), which draw batch-norm statistics at random to expose eps
mistakes and reach logits of 1e18, these calibrate batch-norm statistics on noise images so that
activations keep a trained network's scale and fp16 neither overflows nor ties.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .spec import SpecError

log = logging.getLogger(__name__)

CALIBRATION_BATCH = 8


def require_timm():
    """The timm module, or an error saying how to install it."""
    try:
        import timm
    except ImportError as exc:
        raise RuntimeError(
            "trtmc bench needs timm for its baselines, its oracle and random weights: pip install 'timm>=1.0'"
        ) from exc
    return timm


@dataclass(frozen=True)
class ModelSource:
    """Where an entry's weights live, and what `trtmc build` is given."""

    folder: Path  # config.json + model.safetensors
    build_model: str  # the BuildRequest's model: the HF id or the folder
    architecture: str
    weights: str  # "checkpoint" or "random"


def _randomize_(model: torch.nn.Module, seed: int) -> None:
    """Random affine norm parameters and layer scales (the parity tests' choice, kept mild)."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        is_bn = isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
        is_ln = isinstance(module, torch.nn.LayerNorm) or type(module).__name__.startswith("LayerNorm")
        if (is_bn or is_ln) and getattr(module, "weight", None) is not None:
            # timm zero-initialises the last norm of residual blocks; random gammas make every block count.
            module.weight.copy_(torch.rand(module.weight.shape, generator=gen) * 0.5 + 0.75)
            module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * 0.1)
    for name, p in model.named_parameters():
        if name.endswith("gamma") or ".ls" in name or "layer_scale" in name:
            p.copy_(torch.rand(p.shape, generator=gen) * 0.5 + 0.5)


def _calibrate_batch_norm_(model: torch.nn.Module, input_size: tuple[int, int, int], seed: int) -> None:
    """Running statistics measured on noise images, as training would leave them (one cumulative pass)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    momenta = []
    for m in norms:
        m.reset_running_stats()
        momenta.append(m.momentum)
        m.momentum = None  # cumulative average: after one batch the statistics are exactly that batch's
    gen = torch.Generator().manual_seed(seed + 1)
    model.train()
    try:
        model(torch.randn((CALIBRATION_BATCH,) + tuple(input_size), generator=gen))
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        model.eval()


def save_random_checkpoint(name: str, folder: Path, *, seed: int = 0, **timm_kwargs: Any) -> Path:
    """Create timm model `name` (an architecture, optionally `.tag`) with random weights; save it HF-style.

    `timm_kwargs` go to `timm.create_model` (e.g. `pretrained_cfg_overlay=dict(input_size=(3, 64, 64))`).
    The folder is written atomically: it appears complete or not at all.
    """
    timm = require_timm()
    from safetensors.torch import save_file

    try:
        torch.manual_seed(seed)
        model = timm.create_model(name, pretrained=False, **timm_kwargs)
    except RuntimeError as exc:  # timm's "Unknown model"
        raise SpecError(f"{name!r} is not a timm model name ({exc}); give a timm architecture such as resnet50") from exc
    cfg = dict(model.pretrained_cfg)
    with torch.no_grad():
        _randomize_(model, seed)
        _calibrate_batch_norm_(model, tuple(cfg.get("input_size", (3, 224, 224))), seed)
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        state = {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
        save_file(state, str(tmp / "model.safetensors"))
        config = {
            "architecture": cfg.get("architecture", name.split(".")[0]),
            "num_classes": model.num_classes,
            "num_features": getattr(model, "num_features", None),
            "pretrained_cfg": {
                k: v for k, v in cfg.items() if isinstance(v, (int, float, str, list, tuple, bool, type(None)))
            },
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _timm_name(model: str) -> str:
    """The timm model name of an HF id or a bare name: `timm/resnet50.a1_in1k` -> `resnet50.a1_in1k`."""
    return model.split("/", 1)[1] if model.count("/") == 1 else model


def _config_architecture(folder: Path) -> str:
    from ..checkpoint import Checkpoint

    return Checkpoint(folder).config.architecture


def resolve_source(model: str, weights: str, workdir: Path, seed: int = 0) -> ModelSource:
    """The checkpoint folder for an entry, writing random weights into `workdir` when asked.

    `model` is a local folder, a Hugging Face id (fetched unless the weights are random) or a
    timm architecture name, which has no weights and so needs `weights: random`.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        architecture = _config_architecture(path)
        if weights == "checkpoint":
            return ModelSource(path, str(path), architecture, "checkpoint")
        timm_name = architecture
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
    safe = timm_name.replace("/", "_")
    folder = Path(workdir) / "checkpoints" / f"{safe}-random-seed{seed}"
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        log.info("reusing random weights in %s", folder)
    else:
        save_random_checkpoint(timm_name, folder, seed=seed)
    return ModelSource(folder, str(folder), _config_architecture(folder), "random")


def load_timm_model(folder: Path) -> torch.nn.Module:
    """timm's own model for a checkpoint folder, holding its weights, fp32, eval mode, on the CPU."""
    timm = require_timm()
    from safetensors.torch import load_file

    from ..checkpoint import Checkpoint

    checkpoint = Checkpoint(folder)
    config = checkpoint.config
    model = timm.create_model(
        config.architecture,
        pretrained=False,
        num_classes=config.num_classes,
        pretrained_cfg_overlay={"input_size": tuple(config.pretrained.input_size)},
    )
    if checkpoint.weights_path.suffix == ".safetensors":
        state = load_file(str(checkpoint.weights_path))
    else:
        state = torch.load(checkpoint.weights_path, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


@dataclass(frozen=True)
class Reference:
    """timm's fp32 eager answer on the entry's photo: what the oracle compares with."""

    logits: np.ndarray  # [classes]
    top_class: int
    gap: float  # top-1 minus top-2 logit: how close the photo is to a tie

    def to_json(self) -> dict:
        return {"top_class": self.top_class, "top2_gap": round(self.gap, 6)}


def timm_pixels(folder: Path, photo: Path) -> torch.Tensor:
    """The photo through timm's own eval transform for the checkpoint's pretrained_cfg: [1, C, H, W]."""
    require_timm()
    from PIL import Image
    from timm.data import create_transform

    from ..checkpoint import Checkpoint

    cfg = Checkpoint(folder).config.pretrained
    transform = create_transform(
        input_size=tuple(cfg.input_size),
        interpolation=cfg.interpolation,
        crop_pct=cfg.crop_pct,
        crop_mode=cfg.crop_mode,
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
    )
    with Image.open(photo) as image:
        return transform(image.convert("RGB")).unsqueeze(0)


def reference(model: torch.nn.Module, folder: Path, photo: Path) -> Reference:
    """timm fp32 eager on the CPU (no TF32, no autotuned kernels) on the photo."""
    with torch.no_grad():
        logits = model.float().cpu()(timm_pixels(folder, photo))[0].double()
    top = torch.topk(logits, min(2, logits.numel()))
    gap = float(top.values[0] - top.values[1]) if logits.numel() > 1 else float("inf")
    return Reference(logits.float().numpy(), int(top.indices[0]), gap)
