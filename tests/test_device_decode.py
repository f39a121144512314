"""The pipeline's `decoder="torchvision"` option: JPEGs decoded and cropped where the engine runs (here the
CPU), close to timm's exact PIL transform but not equal to it; other files and refused JPEGs by PIL; the same
error records, order and fixed batches as the default path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support import IMAGES
from trtmc.pipeline import PipelineOptions, classify_files, crop_file
from trtmc.runtime import Runtime

pytest.importorskip("torchvision")

PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))
TORCHVISION = PipelineOptions(batch_size=4, workers=2, decoder="torchvision")


@pytest.fixture(scope="module")
def runtime(lite0_reference_bundle):
    return Runtime.open(lite0_reference_bundle)


@pytest.fixture(scope="module")
def both(runtime):
    exact = list(classify_files(runtime, PHOTOS, PipelineOptions(batch_size=4, workers=2)))
    return exact, list(classify_files(runtime, PHOTOS, TORCHVISION))


def test_device_crops_of_the_photos_stay_within_a_few_levels_of_timms(runtime):
    from torchvision.io import ImageReadMode, decode_jpeg

    spec = runtime.preprocess
    for path in [p for p in PHOTOS if p.suffix == ".jpg"]:
        exact = crop_file(spec, str(path)).astype(np.int16)
        decoded = decode_jpeg(torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8), mode=ImageReadMode.RGB)
        ours = spec.crop_tensor(decoded).numpy().astype(np.int16)
        assert ours.shape == exact.shape, path.name
        # Same decoder on a CPU (libjpeg-turbo); the resize is torch's antialiased one, not PIL's.
        # Measured here: at most 0.16 levels on average per photo, 7 at the worst pixel.
        assert np.abs(ours - exact).mean() < 0.5 and np.abs(ours - exact).max() <= 16, path.name


def test_the_torchvision_decoder_keeps_timms_top1_and_the_png_files_logits(both):
    exact, ours = both
    assert [r.image for r in ours] == [r.image for r in exact] == [str(p) for p in PHOTOS]
    assert all(r.ok for r in ours)
    same_top1 = sum(int(np.argmax(a.logits) == np.argmax(b.logits)) for a, b in zip(exact, ours))
    assert same_top1 >= len(PHOTOS) - 1, f"top-1 agreement {same_top1}/{len(PHOTOS)}"
    for a, b in zip(exact, ours):
        if a.image.endswith(".png"):  # not a JPEG: PIL's exact path, the same logits
            assert np.abs(a.logits - b.logits).max() <= 1e-6 * np.abs(a.logits).max()
        else:  # a JPEG: other pixels, other logits
            assert not np.array_equal(a.logits, b.logits)


def test_a_jpeg_the_decoder_refuses_is_an_error_record_and_the_run_goes_on(runtime, tmp_path):
    broken = tmp_path / "truncated.jpg"
    broken.write_bytes(PHOTOS[0].read_bytes()[:40])  # a JPEG header and nothing after it
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    paths = [PHOTOS[0], broken, PHOTOS[1], text, PHOTOS[2]]
    results = list(classify_files(runtime, paths, TORCHVISION))
    assert [r.image for r in results] == [str(p) for p in paths]
    assert [r.ok for r in results] == [True, False, True, False, True]
    assert "truncated.jpg" in results[1].error and "notes.jpg" in results[3].error


def test_an_unknown_decoder_is_refused_with_the_choices(runtime):
    with pytest.raises(ValueError, match="--decoder 'nvdec': choose pil or torchvision"):
        list(classify_files(runtime, PHOTOS[:1], PipelineOptions(decoder="nvdec")))
