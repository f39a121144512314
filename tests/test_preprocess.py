"""The preprocessing contract reproduces timm's eval transform exactly, without importing torchvision."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from support import IMAGES
from trtmc.preprocess import PreprocessSpec

PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))
SPECS = [
    PreprocessSpec((224, 224), "bicubic", 0.875, "center", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    PreprocessSpec((224, 224), "bilinear", 0.95, "center", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    PreprocessSpec((299, 299), "bicubic", 1.0, "center", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    PreprocessSpec((256, 256), "nearest", 0.9, "center", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    PreprocessSpec((224, 224), "bicubic", 0.875, "squash", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    PreprocessSpec((192, 256), "bilinear", 0.9, "squash", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
]


def timm_transform(spec: PreprocessSpec):
    from timm.data import create_transform

    return create_transform(
        input_size=(3, *spec.input_size), interpolation=spec.interpolation, crop_pct=spec.crop_pct,
        crop_mode=spec.crop_mode, mean=spec.mean, std=spec.std,
    )


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.interpolation}-{s.crop_pct}-{s.crop_mode}-{s.input_size[0]}")
def test_files_go_through_exactly_timms_eval_transform(spec):
    transform = timm_transform(spec)
    for photo in PHOTOS[:6]:
        image = Image.open(photo).convert("RGB")
        assert torch.equal(spec.from_pil(image), transform(image)), photo.name


def test_a_photo_smaller_than_the_crop_is_padded_as_timm_pads_it():
    spec = SPECS[2]  # 299 px, crop_pct 1.0: a 200 x 150 photo is upscaled, then cropped
    image = Image.open(PHOTOS[0]).convert("RGB").resize((200, 150))
    assert torch.equal(spec.from_pil(image), timm_transform(spec)(image))
    small = PreprocessSpec((224, 224), "bicubic", 1.0, "squash", (0.5,) * 3, (0.5,) * 3)
    tiny = Image.open(PHOTOS[1]).convert("RGB").resize((20, 30))
    assert torch.equal(small.from_pil(tiny), timm_transform(small)(tiny))


@pytest.mark.parametrize("spec", SPECS[:4], ids=lambda s: s.interpolation)
def test_arrays_resize_as_torchvision_resizes_a_float_tensor(spec):
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    rng = np.random.default_rng(0)
    hwc = rng.random((300, 451, 3), dtype=np.float32)
    chw = torch.from_numpy(hwc).permute(2, 0, 1)
    size = [int(spec.input_size[0] / spec.crop_pct)]
    expected = TF.resize(chw, size, interpolation=InterpolationMode(spec.interpolation), antialias=True).clamp(0, 1)
    expected = TF.center_crop(expected, list(spec.input_size))
    expected = TF.normalize(expected, spec.mean, spec.std)
    assert torch.allclose(spec.from_array(hwc), expected, atol=1e-6)


def test_the_runtime_path_does_not_import_torchvision():
    code = "import sys, trtmc.runtime, trtmc.tasks, trtmc.pipeline; print('torchvision' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_an_array_is_resized_on_the_device_it_is_asked_for():
    # The meta device computes shapes only: the result being there shows no step ran on the host.
    spec = PreprocessSpec((224, 224), "bicubic", 0.875, "center", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    hwc = np.random.default_rng(0).random((300, 451, 3), dtype=np.float32)
    pixels = spec.from_array(hwc, device="meta")
    assert pixels.device.type == "meta"
    assert tuple(pixels.shape) == (3, 224, 224)
