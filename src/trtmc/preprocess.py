"""The preprocessing contract: timm's eval transform, written once for the bundle and the runtime.

Shorter side to floor(size / crop_pct) with the checkpoint's interpolation, center crop to the
input size, then (x - mean) / std. `squash` resizes both sides to floor(size / crop_pct) instead
of keeping the aspect ratio. Image files go through PIL exactly as timm's transform does; float
arrays go through torch's antialiased resize, which matches PIL to within interpolation rounding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from .checkpoint import PretrainedConfig

_INTERPOLATION = {
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
    "nearest": InterpolationMode.NEAREST,
}


@dataclass(frozen=True)
class PreprocessSpec:
    input_size: tuple[int, int]  # height, width
    interpolation: str
    crop_pct: float
    crop_mode: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_pretrained(cls, cfg: PretrainedConfig) -> "PreprocessSpec":
        return cls(cfg.image_size, cfg.interpolation, cfg.crop_pct, cfg.crop_mode, cfg.mean, cfg.std)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "PreprocessSpec":
        return cls(
            input_size=tuple(data["input_size"]),
            interpolation=data["interpolation"],
            crop_pct=float(data["crop_pct"]),
            crop_mode=data["crop_mode"],
            mean=tuple(data["mean"]),
            std=tuple(data["std"]),
        )

    # ---- the transform ----

    def _resize_size(self) -> list[int]:
        scale = [math.floor(s / self.crop_pct) for s in self.input_size]
        if self.crop_mode == "squash":
            return scale
        if scale[0] == scale[1]:
            return [scale[0]]  # shorter side, aspect ratio kept
        raise ValueError(
            f"non-square input {self.input_size} with crop_mode 'center' is not supported; use crop_mode 'squash'"
        )

    def _normalize(self, hwc: np.ndarray) -> torch.Tensor:
        """Float32 HWC in [0, 1] -> (x - mean) / std as CHW, in numpy: small tensors are slow in torch."""
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        return torch.from_numpy(np.ascontiguousarray(((hwc - mean) / std).transpose(2, 0, 1)))

    def from_pil(self, image) -> torch.Tensor:
        """A PIL image (any mode) -> normalized float32 CHW, exactly as timm's eval transform."""
        image = image.convert("RGB")
        image = TF.resize(image, self._resize_size(), interpolation=_INTERPOLATION[self.interpolation])
        image = TF.center_crop(image, list(self.input_size))
        return self._normalize(np.asarray(image, dtype=np.float32) / np.float32(255.0))

    def from_array(self, hwc: np.ndarray) -> torch.Tensor:
        """A float32 HWC RGB array in [0, 1] -> normalized float32 CHW."""
        chw = torch.from_numpy(np.ascontiguousarray(hwc)).permute(2, 0, 1)
        chw = TF.resize(
            chw, self._resize_size(), interpolation=_INTERPOLATION[self.interpolation], antialias=True
        ).clamp_(0.0, 1.0)
        chw = TF.center_crop(chw, list(self.input_size))
        return self._normalize(chw.permute(1, 2, 0).numpy())
