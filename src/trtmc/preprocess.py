"""The preprocessing contract: timm's eval transform, written once for the bundle and the runtime.

Shorter side to floor(size / crop_pct) with the checkpoint's interpolation, center crop to the
input size, then (x - mean) / std. `squash` resizes both sides to floor(size / crop_pct) instead
of keeping the aspect ratio. Image files go through PIL exactly as timm's transform does (torchvision's
resize and center crop on a PIL image, reproduced here operation for operation); float arrays go
through torch's antialiased resize, as torchvision resizes a float tensor, which matches PIL to
within interpolation rounding; the task resizes them on the engine's device. torchvision itself is
not imported: it costs seconds of start-up and the runtime needs none of it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoint import PretrainedConfig

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


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

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize step, as torchvision computes it for timm's transform."""
        scale = [math.floor(s / self.crop_pct) for s in self.input_size]
        if self.crop_mode == "squash":
            return scale[0], scale[1]
        if scale[0] != scale[1]:
            raise ValueError(
                f"non-square input {self.input_size} with crop_mode 'center' is not supported; use crop_mode 'squash'"
            )
        # The shorter side becomes `scale`; the longer one keeps the aspect ratio, truncated.
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(scale[0] * long / short)
        return (new_long, scale[0]) if width <= height else (scale[0], new_long)

    def _crop(self, hwc: np.ndarray | torch.Tensor, height: int, width: int):
        """torchvision's center crop of the last three axes (H, W, C), whatever leads them: zero-pad a side
        smaller than the crop, then cut the middle."""
        crop_h, crop_w = self.input_size
        pad_h, pad_w = max(crop_h - height, 0), max(crop_w - width, 0)
        if pad_h or pad_w:
            top, left = pad_h // 2, pad_w // 2
            if isinstance(hwc, np.ndarray):
                hwc = np.pad(hwc, ((0, 0),) * (hwc.ndim - 3) + ((top, pad_h - top), (left, pad_w - left), (0, 0)))
            else:
                hwc = F.pad(hwc, (0, 0, left, pad_w - left, top, pad_h - top))
            height, width = height + pad_h, width + pad_w
        top = int(round((height - crop_h) / 2.0))
        left = int(round((width - crop_w) / 2.0))
        return hwc[..., top : top + crop_h, left : left + crop_w, :]

    def normalize(self, nhwc: torch.Tensor) -> torch.Tensor:
        """Pixels in [0, 1] as NHWC -> (x - mean) / std as NCHW (a channels-last view: no copy), in
        float32 on the pixels' device; every step is one correctly rounded float32 operation, so a CPU
        and a GPU give the same bits."""
        mean = torch.tensor(self.mean, dtype=torch.float32, device=nhwc.device)
        std = torch.tensor(self.std, dtype=torch.float32, device=nhwc.device)
        return ((nhwc.float() - mean) / std).permute(0, 3, 1, 2)

    def normalize_bytes(self, nhwc: torch.Tensor) -> torch.Tensor:
        """8-bit NHWC pixels -> normalized float32 NCHW: values / 255 first, as timm's ToTensor does."""
        return self.normalize(nhwc.float() / 255.0)

    def crop_pil(self, image) -> np.ndarray:
        """A PIL image (any mode) -> the resized, center-cropped 8-bit RGB pixels (HWC), exactly as
        timm's eval transform crops them; `normalize_bytes` finishes the transform."""
        from PIL import Image

        filters = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
        image = image.convert("RGB")
        height, width = self.resized_size(image.height, image.width)
        if (height, width) != (image.height, image.width):  # torchvision leaves an image of the right size alone
            image = image.resize((width, height), filters[self.interpolation])
        return np.array(self._crop(np.asarray(image), height, width))  # a writable, contiguous copy

    def from_pil(self, image) -> torch.Tensor:
        """A PIL image (any mode) -> normalized float32 CHW, exactly as timm's eval transform."""
        return self.normalize_bytes(torch.from_numpy(self.crop_pil(image))[None])[0].contiguous()

    def from_array(self, hwc: np.ndarray | torch.Tensor, device: str | torch.device | None = None) -> torch.Tensor:
        """A float32 HWC RGB array in [0, 1] (numpy, or a tensor already where it should be processed)
        -> normalized float32 CHW on `device` (default: the tensor's, or the CPU), resized there.

        On a GPU the resize runs as kernels there instead of as host work split over torch's intra-op
        threads; the antialiased GPU resize agrees with the CPU's to float rounding."""
        if isinstance(hwc, np.ndarray):
            hwc = torch.from_numpy(np.ascontiguousarray(hwc))
        return self.from_arrays(hwc.to(device if device is not None else hwc.device)[None])[0].contiguous()

    def from_arrays(self, nhwc: torch.Tensor) -> torch.Tensor:
        """Float32 NHWC RGB arrays of one size in [0, 1] -> normalized float32 NCHW where they are, resized
        together: each image's pixels are computed as `from_array` computes them alone, in fewer kernels."""
        height, width = self.resized_size(nhwc.shape[1], nhwc.shape[2])
        nchw = nhwc.permute(0, 3, 1, 2)
        if (height, width) != tuple(nhwc.shape[1:3]):
            smooth = self.interpolation != "nearest"
            nchw = F.interpolate(
                nchw, size=(height, width), mode=self.interpolation,
                align_corners=False if smooth else None, antialias=smooth,
            )
        nchw = nchw.clamp(0.0, 1.0)
        return self.normalize(self._crop(nchw.permute(0, 2, 3, 1), height, width))
