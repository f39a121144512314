"""The on-device resize reproduces Pillow's bytes: the pipeline's device path crops every image exactly as
timm's PIL transform does, whatever its size, aspect, interpolation or crop settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from support import IMAGES
from trtmc.preprocess import PreprocessSpec
from trtmc.resample import DeviceCropper, crop_weights, pass_weights
from trtmc.tasks import load_image

PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))
GRAY = (0.5, 0.5, 0.5)


def _spec(interpolation="bicubic", size=224, crop_pct=0.875, crop_mode="center"):
    return PreprocessSpec((size, size), interpolation, crop_pct, crop_mode, GRAY, GRAY)


def _noise(height, width, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _device_crop(spec, image):
    return DeviceCropper(spec)(torch.from_numpy(np.array(image))[None])[0].numpy()


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_every_repository_photo_crops_to_pillows_bytes(interpolation):
    spec = _spec(interpolation)
    for path in PHOTOS:
        image = load_image(path)
        assert np.array_equal(_device_crop(spec, image), spec.crop_pil(image)), path.name


@pytest.mark.parametrize(
    "size, crop_pct, crop_mode",
    [(224, 0.875, "center"), (224, 1.0, "center"), (64, 0.875, "center"), (240, 0.95, "squash"), (300, 1.2, "center")],
)
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_noise_of_awkward_sizes_crops_to_pillows_bytes(interpolation, size, crop_pct, crop_mode):
    # Noise is where rounding differences show; tall, wide, tiny and upscaled images take every branch:
    # a side kept, padding, and (Pillow 13) the vertical pass first when the height shrinks the most.
    spec = _spec(interpolation, size, crop_pct, crop_mode)
    for seed, (height, width) in enumerate([(333, 91), (91, 333), (7, 300), (1, 1), (224, 224), (256, 256), (517, 389)]):
        image = _noise(height, width, seed)
        assert np.array_equal(_device_crop(spec, image), spec.crop_pil(image)), (height, width)


def test_a_batch_of_same_size_images_crops_each_as_alone():
    spec = _spec()
    images = [_noise(300, 200, seed) for seed in range(3)]
    batch = DeviceCropper(spec)(torch.stack([torch.from_numpy(np.array(i)) for i in images]))
    for image, cropped in zip(images, batch):
        assert np.array_equal(cropped.numpy(), spec.crop_pil(image))


def test_a_pass_that_keeps_the_size_is_the_identity_in_fixed_point():
    weights = pass_weights(37, 37, "bicubic")
    assert np.array_equal(weights, np.eye(37) * 2**22)


def test_the_crop_keeps_the_middle_rows_and_pads_with_zero_rows():
    spec = _spec(size=8, crop_pct=1.0)
    vertical, horizontal = crop_weights(spec, 12, 8)  # 8 wide: the short side stays 8, the 12 rows are cropped to 8
    assert np.array_equal(horizontal, np.eye(8) * 2**22)
    assert np.array_equal(vertical, (np.eye(12) * 2**22)[2:10])
    padded, _ = crop_weights(_spec(size=8, crop_pct=2.0), 12, 8)  # resized to 4 x 6: 8 rows cropped from 6
    assert not padded[0].any() and not padded[-1].any() and padded[1:7].any(axis=1).all()


def test_nearest_neighbour_resizing_is_refused_on_the_device():
    with pytest.raises(ValueError, match="'nearest' resizing is not reproduced on the device"):
        DeviceCropper(_spec("nearest"))
