"""The task's array path: arrays staged to the engine's device in chunks, checked and resized by size,
give each image exactly the pixels it gets alone."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import trtmc.tasks as tasks
from trtmc.preprocess import PreprocessSpec
from trtmc.tasks import InvalidInput, preprocess_images, staged

SPECS = [
    PreprocessSpec((224, 224), "bicubic", 0.875, "center", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    PreprocessSpec((224, 224), "bilinear", 1.0, "squash", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    PreprocessSpec((160, 160), "nearest", 0.95, "center", (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
]


def _arrays(rng):
    """Sizes repeated and not, upscaled, padded (smaller than the crop) and already the resize's size, and
    arrays that are views: a transposed one and the rows of an NHWC batch."""
    sizes = [(300, 451), (64, 48), (300, 451), (120, 90), (256, 256), (64, 48), (500, 375), (300, 451)]
    arrays = [rng.random((h, w, 3), dtype=np.float32) for h, w in sizes]
    arrays.append(rng.random((3, 200, 150), dtype=np.float32).transpose(1, 2, 0))
    arrays += list(rng.random((2, 80, 100, 3), dtype=np.float32))
    return arrays


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.interpolation}-{s.crop_mode}")
def test_arrays_resized_together_get_the_pixels_each_gets_alone(spec):
    arrays = _arrays(np.random.default_rng(0))
    runtime = SimpleNamespace(preprocess=spec, device="cpu")
    together = preprocess_images(runtime, arrays)
    alone = torch.stack([spec.from_array(a) for a in arrays])
    assert torch.equal(together, alone)


def test_arrays_split_over_several_staging_chunks_give_the_same_pixels(monkeypatch):
    spec, arrays = SPECS[0], _arrays(np.random.default_rng(1))
    runtime = SimpleNamespace(preprocess=spec, device="cpu")
    whole = preprocess_images(runtime, arrays)
    monkeypatch.setattr(tasks, "STAGING_BYTES", 2 * 300 * 451 * 3 * 4)  # about two photos a chunk
    assert torch.equal(preprocess_images(runtime, arrays), whole)


def test_staged_arrays_hold_the_inputs_values_whatever_their_strides():
    arrays = _arrays(np.random.default_rng(2))
    for array, view in zip(arrays, staged(arrays, torch.device("cpu"))):
        assert view.shape == array.shape and view.dtype == torch.float32
        assert np.array_equal(view.numpy(), array)


def test_read_only_and_flipped_arrays_are_staged_without_a_warning():
    # np.asarray of a Pillow image is read-only; a flipped view has negative strides, which torch refuses.
    rng = np.random.default_rng(3)
    read_only = rng.random((20, 30, 3), dtype=np.float32)
    read_only.setflags(write=False)
    flipped = rng.random((20, 30, 3), dtype=np.float32)[::-1, ::-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        views = staged([read_only, flipped], torch.device("cpu"))
    assert np.array_equal(views[0].numpy(), read_only) and np.array_equal(views[1].numpy(), flipped)


def test_the_first_bad_array_is_named_whatever_its_size(monkeypatch):
    good = np.full((40, 30, 3), 0.5, np.float32)
    too_bright = np.full((50, 60, 3), 1.5, np.float32)
    with_nan = np.full((40, 30, 3), np.nan, np.float32)  # the size of the first array, resized with it
    runtime = SimpleNamespace(preprocess=SPECS[0], device="cpu")
    monkeypatch.setattr(tasks, "STAGING_BYTES", 1)  # a chunk per array
    with pytest.raises(InvalidInput, match=r"array #1: values must lie in \[0, 1\]"):
        preprocess_images(runtime, [good, too_bright, with_nan])
    with pytest.raises(InvalidInput, match="array #1: contains NaN or Inf"):
        preprocess_images(runtime, [good, with_nan, too_bright])
