"""Pillow's 8-bit resize and timm's center crop, bit for bit, as two matrix products on any torch device.

Pillow resizes an 8-bit image in two separable passes, horizontal then vertical (libImaging/Resample.c).
Each output pixel is a weighted sum of source pixels: the filter's weights, normalized to sum to one,
scaled by 2**22 and rounded away from zero to integers; the sum starts at 2**21 and is shifted right by
22 bits and clipped to 0..255. A pass is therefore one product with an integer matrix [out, in] followed
by that rounding (Pillow 13 runs the vertical pass first when it shrinks the height more than twice as
much as the width; older versions always start horizontally: which one is installed is found out by
resizing a small image once). Every product and partial sum is an integer below 2**31, so float64 products compute
them exactly in any summation order, and the bytes equal Pillow's. A pass over a side that keeps its
size is the identity matrix (each row one weight of 2**22), also exact, and the center crop, zero
padding included, is a choice of rows: the crop's rows of the vertical matrix, zero rows for padding.

This lets the folder pipeline decode on the host and resize on the engine's device (`trtmc.pipeline`)
with exactly the pixels of timm's PIL transform (`PreprocessSpec.crop_pil`). Nearest-neighbour
resizing takes another path in Pillow and is not reproduced here.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .preprocess import PreprocessSpec

PRECISION_BITS = 22  # Pillow's fixed point for 8-bit images: 32 - 8 - 2
RESAMPLED = ("bilinear", "bicubic")  # interpolations reproduced here


def _bicubic(x: np.ndarray) -> np.ndarray:
    a = -0.5  # Pillow's (and PyTorch's) bicubic coefficient
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _bilinear(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


_FILTERS = {"bicubic": (_bicubic, 2.0), "bilinear": (_bilinear, 1.0)}


@functools.lru_cache(maxsize=512)
def pass_weights(in_size: int, out_size: int, interpolation: str) -> np.ndarray:
    """One pass's fixed-point weights as a dense float64 matrix [out_size, in_size] of integers, computed
    with the same double operations, in the same order, as Pillow's `precompute_coeffs` and
    `normalize_coeffs_8bpc`."""
    kernel, support = _FILTERS[interpolation]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support *= filterscale
    taps = int(np.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    # C casts truncate toward zero, which np.trunc does; then the window is clipped to the image.
    first = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    last = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size)
    index = first[:, None] + np.arange(taps)[None, :]
    used = index < last[:, None]
    w = np.where(used, kernel((index - center[:, None] + 0.5) * (1.0 / filterscale)), 0.0)
    total = np.zeros(out_size)
    for t in range(taps):  # summed tap by tap, in Pillow's order (numpy's sum would pair them)
        total += w[:, t]
    w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
    fixed = np.where(w < 0, np.trunc(-0.5 + w * (1 << PRECISION_BITS)), np.trunc(0.5 + w * (1 << PRECISION_BITS)))
    matrix = np.zeros((out_size, in_size))
    rows = np.broadcast_to(np.arange(out_size)[:, None], index.shape)
    matrix[rows[used], index[used]] = fixed[used]
    return matrix


def _crop_rows(matrix: np.ndarray, crop: int) -> np.ndarray:
    """The rows of a pass that timm's center crop keeps, zero rows where it pads (torchvision's
    `center_crop`: pad a short side with zeros, split evenly, then cut the middle, rounding its offset)."""
    size = matrix.shape[0]
    pad = max(crop - size, 0)
    start = int(round((size + pad - crop) / 2.0)) - pad // 2
    out = np.zeros((crop, matrix.shape[1]))
    for i in range(crop):
        if 0 <= start + i < size:
            out[i] = matrix[start + i]
    return out


def _refuse_unless_resampled(interpolation: str) -> None:
    if interpolation not in RESAMPLED:
        raise ValueError(f"{interpolation!r} resizing is not reproduced on the device; use one of {RESAMPLED}")


@functools.lru_cache(maxsize=512)
def crop_weights(spec: PreprocessSpec, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(vertical [crop_h, height], horizontal [crop_w, width]): an image of this size resized and
    center-cropped as `spec.crop_pil` does it, as two fixed-point passes."""
    _refuse_unless_resampled(spec.interpolation)
    resized_h, resized_w = spec.resized_size(height, width)
    crop_h, crop_w = spec.input_size
    vertical = _crop_rows(pass_weights(height, resized_h, spec.interpolation), crop_h)
    horizontal = _crop_rows(pass_weights(width, resized_w, spec.interpolation), crop_w)
    return vertical, horizontal


@functools.cache
def pillow_may_start_vertically() -> bool:
    """Whether the installed Pillow runs the vertical pass first when the height shrinks more than twice
    as much as the width (Pillow 13's `horizontal_first`): one 40x12 noise image resized to 10x30
    tells, since the two orders round differently on it."""
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (40, 12, 3), dtype=np.uint8)
    pillow = torch.from_numpy(np.asarray(Image.fromarray(pixels).resize((10, 30), Image.BICUBIC)).copy())
    x = torch.from_numpy(pixels).permute(2, 0, 1).to(torch.float64)
    vertical = torch.from_numpy(pass_weights(40, 30, "bicubic"))
    horizontal = torch.from_numpy(pass_weights(12, 10, "bicubic"))
    x = _two_passes(x, vertical, horizontal, vertical_first=False)
    return not torch.equal(x.permute(1, 2, 0).to(torch.uint8), pillow)


def _fixed_point_pass(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Pillow's rounding of one pass along the last axis: (2**21 + sum) >> 22, clipped to 0..255."""
    total = torch.matmul(x, matrix.T) + float(1 << (PRECISION_BITS - 1))
    return torch.floor(total * (1.0 / (1 << PRECISION_BITS))).clamp_(0.0, 255.0)


def _two_passes(x: torch.Tensor, vertical: torch.Tensor, horizontal: torch.Tensor, *, vertical_first: bool):
    """[..., h, w] float64 -> [..., out_h, out_w]: both passes, in the order Pillow runs them."""
    if vertical_first:
        x = _fixed_point_pass(x.transpose(-1, -2), vertical).transpose(-1, -2)
        return _fixed_point_pass(x, horizontal)
    x = _fixed_point_pass(x, horizontal)
    return _fixed_point_pass(x.transpose(-1, -2), vertical).transpose(-1, -2)


class DeviceCropper:
    """Resizes and center-crops batches of same-size 8-bit images on their device, byte for byte as
    `spec.crop_pil` does; keeps each size's two weight matrices there (a collection repeats sizes)."""

    def __init__(self, spec: PreprocessSpec, cached_sizes: int = 64) -> None:
        _refuse_unless_resampled(spec.interpolation)
        self.spec = spec
        self.cached_sizes = cached_sizes
        self._weights: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _device_weights(self, height: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (height, width, str(device))
        found = self._weights.pop(key, None)  # re-inserted last: the dict keeps recent sizes at its end
        if found is None:
            vertical, horizontal = crop_weights(self.spec, height, width)
            found = (torch.from_numpy(vertical).to(device), torch.from_numpy(horizontal).to(device))
            if len(self._weights) >= self.cached_sizes:
                self._weights.pop(next(iter(self._weights)))
        self._weights[key] = found
        return found

    def __call__(self, nhwc: torch.Tensor) -> torch.Tensor:
        """[n, h, w, 3] uint8 -> [n, crop_h, crop_w, 3] uint8, on the pixels' device."""
        height, width = nhwc.shape[1], nhwc.shape[2]
        vertical, horizontal = self._device_weights(height, width, nhwc.device)
        resized_h, resized_w = self.spec.resized_size(height, width)
        shrink_h, shrink_w = height - resized_h, width - resized_w
        vertical_first = pillow_may_start_vertically() and shrink_h > 0 and shrink_h > 2 * shrink_w
        x = nhwc.permute(0, 3, 1, 2).to(torch.float64)  # [n, 3, h, w]
        x = _two_passes(x, vertical, horizontal, vertical_first=vertical_first)  # [n, 3, crop_h, crop_w]
        return x.permute(0, 2, 3, 1).to(torch.uint8)
