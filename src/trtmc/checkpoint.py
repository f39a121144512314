"""Reading a timm checkpoint in the Hugging Face layout: `config.json` plus `model.safetensors`.

The config becomes a typed, frozen `ModelConfig` and is validated before any weight is read;
tensors are read lazily, one at a time, as float32 numpy arrays. A Hugging Face model id is
fetched with huggingface_hub; offline, the error says to pass a local folder instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

log = logging.getLogger(__name__)

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")

# Vocabularies recognised by the sha256 of their label names joined with newlines: a checkpoint
# whose names are exactly these, in this order, shares the vocabulary's class indices.
KNOWN_VOCABULARIES = {
    # ImageNet-1k's 1000 WordNet synsets in the standard order (timm.data.ImageNetInfo)
    "385e0240499426c022b773be1ae4da780f057b89c9694c7f47199f62746b6edd": "imagenet-1k",
}


def vocabulary_id(label_names: Sequence[str]) -> str:
    """`imagenet-1k` for ImageNet's synsets in order; "" for any other names (indices stay model-local)."""
    return KNOWN_VOCABULARIES.get(hashlib.sha256("\n".join(label_names).encode()).hexdigest(), "")
CROP_MODES = ("center", "squash")


class CheckpointError(ValueError):
    """The checkpoint is missing, malformed or cannot be fetched."""


@dataclass(frozen=True)
class PretrainedConfig:
    """The eval-transform fields of timm's `pretrained_cfg`."""

    input_size: tuple[int, int, int] = (3, 224, 224)
    interpolation: str = "bicubic"
    crop_pct: float = 0.875
    crop_mode: str = "center"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    num_classes: int = 1000

    @property
    def image_size(self) -> tuple[int, int]:
        return (self.input_size[1], self.input_size[2])


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    num_classes: int
    pretrained: PretrainedConfig
    label_names: tuple[str, ...] = ()
    label_descriptions: Mapping[str, str] = field(default_factory=dict)

    @property
    def vocabulary_id(self) -> str:
        return vocabulary_id(self.label_names)

    def label(self, index: int) -> tuple[str, str]:
        """(name, description) of a class, empty strings when the checkpoint gave none."""
        if index >= len(self.label_names):
            return "", ""
        name = self.label_names[index]
        return name, self.label_descriptions.get(name, "")


@dataclass(frozen=True)
class Source:
    """Where a checkpoint came from: recorded in every bundle."""

    id: str
    revision: str
    sha256: str


def _require(condition: bool, path: Path, message: str) -> None:
    if not condition:
        raise CheckpointError(f"{path}: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_config(raw: Any, path: Path) -> ModelConfig:
    """Validate a timm `config.json` and turn it into a `ModelConfig`."""
    _require(isinstance(raw, dict), path, "must hold one JSON object")
    arch = raw.get("architecture")
    if arch is None and isinstance(raw.get("architectures"), list) and raw["architectures"]:
        arch = raw["architectures"][0]
    _require(isinstance(arch, str) and arch, path, "has no 'architecture' (e.g. \"ghostnet_100\")")
    arch = arch.split(".")[0]  # "ghostnet_100.in1k" names a pretrained tag, not an architecture
    cfg = raw.get("pretrained_cfg") or {}
    _require(isinstance(cfg, dict), path, "'pretrained_cfg' must be an object")

    input_size = cfg.get("input_size", [3, 224, 224])
    _require(
        isinstance(input_size, list) and len(input_size) == 3 and all(_is_int(v) and v > 0 for v in input_size)
        and input_size[0] == 3,
        path, f"pretrained_cfg.input_size must be [3, height, width], got {input_size!r}",
    )
    interpolation = cfg.get("interpolation", "bicubic")
    _require(interpolation in INTERPOLATIONS, path,
             f"pretrained_cfg.interpolation {interpolation!r} is not one of {', '.join(INTERPOLATIONS)}")
    crop_pct = cfg.get("crop_pct", 0.875)
    _require(_is_number(crop_pct) and 0.0 < crop_pct <= 1.0 + 1e-9, path,
             f"pretrained_cfg.crop_pct must be in (0, 1], got {crop_pct!r}")
    crop_mode = cfg.get("crop_mode", "center")
    _require(crop_mode in CROP_MODES, path,
             f"pretrained_cfg.crop_mode {crop_mode!r} is not supported (supported: {', '.join(CROP_MODES)})")
    mean, std = cfg.get("mean", [0.485, 0.456, 0.406]), cfg.get("std", [0.229, 0.224, 0.225])
    for key, value in (("mean", mean), ("std", std)):
        _require(isinstance(value, list) and len(value) == 3 and all(_is_number(v) for v in value),
                 path, f"pretrained_cfg.{key} must be three numbers, got {value!r}")
    _require(all(v > 0 for v in std), path, f"pretrained_cfg.std must be positive, got {std!r}")

    # 0 is a headless pretrained tag (DINOv2, SigLIP, EVA-02 pre-training); a classifier fine-tuned from
    # one keeps that pretrained_cfg and states its own classes at the root.
    pretrained_classes = cfg.get("num_classes", 1000)
    _require(_is_int(pretrained_classes) and pretrained_classes >= 0, path,
             f"pretrained_cfg.num_classes must be a non-negative integer, got {pretrained_classes!r}")
    num_classes = raw.get("num_classes", pretrained_classes)
    _require(_is_int(num_classes) and num_classes > 0, path,
             f"num_classes must be a positive integer, got {num_classes!r}"
             + (" (a headless feature model: trtmc builds classifiers)" if num_classes == 0 else ""))
    names = raw.get("label_names") or []
    _require(isinstance(names, list) and all(isinstance(n, str) for n in names), path,
             "label_names must be a list of strings")
    _require(not names or len(names) == num_classes, path,
             f"label_names has {len(names)} entries for {num_classes} classes")
    descriptions = raw.get("label_descriptions") or {}
    _require(isinstance(descriptions, dict) and all(isinstance(v, str) for v in descriptions.values()), path,
             "label_descriptions must map label names to text")

    pretrained = PretrainedConfig(
        input_size=tuple(input_size),
        interpolation=interpolation,
        crop_pct=float(crop_pct),
        crop_mode=crop_mode,
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in std),
        num_classes=pretrained_classes,
    )
    return ModelConfig(
        architecture=arch,
        num_classes=num_classes,
        pretrained=pretrained,
        label_names=tuple(names),
        label_descriptions={str(k): str(v) for k, v in descriptions.items()},
    )


class Checkpoint:
    """A timm checkpoint folder: typed config and lazily read tensors."""

    def __init__(self, folder: Path, source: Source | None = None) -> None:
        self.folder = Path(folder)
        config_path = self.folder / "config.json"
        if not self.folder.is_dir():
            raise CheckpointError(f"{self.folder}: not a folder; pass a timm checkpoint folder or a Hugging Face id")
        if not config_path.is_file():
            raise CheckpointError(f"{self.folder}: no config.json; a timm checkpoint folder holds config.json and model.safetensors")
        try:
            raw = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{config_path}: not valid JSON ({exc})") from exc
        self.config = parse_config(raw, config_path)
        self.weights_path = self._find_weights()
        self._source = source
        self._names: list[str] | None = None
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._handle = None
        self.reads = 0
        self.on_read = None  # optional callable(count): progress while weights load

    def _find_weights(self) -> Path:
        for name in ("model.safetensors", "pytorch_model.bin"):
            path = self.folder / name
            if path.is_file():
                return path
        raise CheckpointError(f"{self.folder}: no model.safetensors (or pytorch_model.bin) next to config.json")

    @property
    def source(self) -> Source:
        if self._source is None:
            self._source = Source(id=str(self.folder.resolve()), revision="local", sha256=file_sha256(self.weights_path))
        return self._source

    # ---- tensors ----

    def _open(self):
        if self._handle is None:
            if self.weights_path.suffix == ".safetensors":
                from safetensors import safe_open

                try:
                    self._handle = safe_open(str(self.weights_path), framework="pt")
                except Exception as exc:  # safetensors raises its own error types
                    raise CheckpointError(f"{self.weights_path}: cannot read safetensors ({exc})") from exc
            else:
                import torch

                try:
                    state = torch.load(self.weights_path, map_location="cpu", weights_only=True)
                except Exception as exc:  # pickle, zip and weights_only errors all mean "not a state dict"
                    raise CheckpointError(
                        f"{self.weights_path}: cannot read it as a PyTorch state dict ({type(exc).__name__}: {exc}); "
                        "save the model with torch.save(model.state_dict()) or as model.safetensors"
                    ) from exc
                self._handle = _DictHandle(state, self.weights_path)
        return self._handle

    @property
    def names(self) -> list[str]:
        if self._names is None:
            self._names = list(self._open().keys())
            self._name_set = frozenset(self._names)
        return self._names

    def __contains__(self, name: str) -> bool:
        self.names  # noqa: B018 - loads the name set
        return name in self._name_set

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._shapes:
            self._require_name(name)
            self._shapes[name] = tuple(int(d) for d in self._open().get_slice(name).get_shape())
        return self._shapes[name]

    def tensor(self, name: str) -> np.ndarray:
        self._require_name(name)
        value = self._open().get_tensor(name)
        self.reads += 1
        if self.on_read is not None:
            self.on_read(self.reads)
        return value.float().numpy()

    def _require_name(self, name: str) -> None:
        if name not in self:
            raise CheckpointError(
                f"{self.weights_path}: tensor {name!r} is missing for {self.config.architecture}"
            )


class _DictHandle:
    """Gives a loaded `pytorch_model.bin` state dict the safetensors handle interface."""

    def __init__(self, state: Any, path: Path) -> None:
        if not isinstance(state, Mapping) or not all(
            isinstance(k, str) and hasattr(v, "shape") for k, v in state.items()
        ):
            raise CheckpointError(
                f"{path}: holds a {type(state).__name__}, not a state dict of named tensors; save the model with "
                "torch.save(model.state_dict()) or as model.safetensors"
            )
        self.state = state

    def keys(self):
        return self.state.keys()

    def get_tensor(self, name):
        return self.state[name]

    def get_slice(self, name):
        tensor = self.state[name]
        return type("Slice", (), {"get_shape": lambda self: list(tensor.shape)})()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def open_checkpoint(model: str, revision: str | None = None) -> Checkpoint:
    """A local folder, or a Hugging Face id such as `timm/ghostnet_100.in1k` (fetched and cached)."""
    path = Path(model).expanduser()
    if path.exists():
        if revision is not None:
            raise CheckpointError(f"--revision applies to Hugging Face ids, not to the local folder {model}")
        return Checkpoint(path)
    if model.count("/") != 1 or model.startswith((".", "/")):
        raise CheckpointError(f"{model}: no such folder, and not a Hugging Face id of the form owner/name")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise CheckpointError("huggingface_hub is not installed; pass a local checkpoint folder") from exc
    log.info("fetching %s from the Hugging Face Hub", model)
    try:
        folder = snapshot_download(
            model, revision=revision, allow_patterns=["config.json", "model.safetensors"]
        )
    except Exception as exc:
        # The hub's own message spans several lines; it is logged (shown with -v), the error stays one line.
        log.debug("fetching %s failed: %s", model, exc)
        raise CheckpointError(
            f"could not fetch {model} from the Hugging Face Hub ({type(exc).__name__}); offline or behind a "
            "firewall? download the model elsewhere and pass its local folder (config.json + model.safetensors)"
        ) from exc
    resolved = Path(folder).name  # snapshot folders are named after the commit
    checkpoint = Checkpoint(Path(folder))
    checkpoint._source = Source(id=model, revision=resolved, sha256=file_sha256(checkpoint.weights_path))
    return checkpoint

