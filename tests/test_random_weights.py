"""`trtmc.random_weights`: random-weight timm checkpoints in the Hugging Face layout, as the tests,
the bench and the tools write them."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from support import IMAGES
from trtmc.checkpoint import Checkpoint
from trtmc.random_weights import (
    BatchNormStatistics,
    RandomWeights,
    calibrate_on_photos,
    load_timm_model,
    require_timm,
    save_random_checkpoint,
    timm_pixels,
)

SMALL = {"pretrained_cfg_overlay": {"input_size": (3, 64, 64)}}


def save(tmp_path, name="x", weights=RandomWeights(), arch="regnetx_002"):
    return save_random_checkpoint(arch, tmp_path / name, weights, **SMALL)


def test_same_options_give_the_same_tensors_and_another_seed_others(tmp_path):
    a, b = load_file(str(save(tmp_path, "a") / "model.safetensors")), load_file(str(save(tmp_path, "b") / "model.safetensors"))
    c = load_file(str(save(tmp_path, "c", RandomWeights(seed=1)) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["stem.conv.weight"], c["stem.conv.weight"])


def test_random_statistics_keep_small_variances_where_calibrated_ones_normalize_the_noise(tmp_path):
    drawn = load_file(str(save(tmp_path, "r", RandomWeights(statistics=BatchNormStatistics.RANDOM)) / "model.safetensors"))
    variances = torch.cat([v for k, v in drawn.items() if k.endswith("running_var")])
    assert 0.02 <= float(variances.min()) and float(variances.max()) <= 0.52
    model = load_timm_model(save(tmp_path, "c"))
    norm = model.stem.bn
    # The stem's norm sees the calibration noise itself (seed 0 + 3); with measured statistics it
    # normalizes it: per channel, the output's mean is the norm's bias and its deviation the weight.
    noise = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0 + 3))
    with torch.no_grad():
        x = model.stem.conv(noise)
        out = torch.nn.functional.batch_norm(x, norm.running_mean, norm.running_var, norm.weight, norm.bias, eps=norm.eps)
    assert torch.allclose(out.mean((0, 2, 3)), norm.bias, atol=1e-4)
    assert torch.allclose(out.std((0, 2, 3)), norm.weight, rtol=1e-2)


def test_checkpoint_is_timms_pretrained_cfg_in_the_hugging_face_layout_and_loads_back(tmp_path):
    folder = save(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "regnetx_002" and config["num_classes"] == 1000
    assert config["pretrained_cfg"]["input_size"] == [3, 64, 64]
    assert Checkpoint(folder).config.architecture == "regnetx_002"  # trtmc reads it as a downloaded one
    saved = load_file(str(folder / "model.safetensors"))
    loaded = load_timm_model(folder).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in saved.items())


def test_a_failed_save_leaves_no_folder_behind(tmp_path, monkeypatch):
    import safetensors.torch

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_photo_calibration_gives_each_photo_its_own_class(tmp_path):
    photos = sorted(IMAGES.glob("*.jpg"))[:4]
    drawn = save(tmp_path)
    folder = calibrate_on_photos(drawn, tmp_path / "photos", timm_pixels(drawn, photos))
    with torch.no_grad():
        logits = load_timm_model(folder)(timm_pixels(folder, photos))
    assert logits.argmax(-1).tolist() == [0, 1, 2, 3]
    assert (folder / "config.json").read_text() == (drawn / "config.json").read_text()


def test_unknown_model_name_is_refused_with_an_example(tmp_path):
    with pytest.raises(ValueError, match=r"'resnet_5000' is not a timm model name .*such as resnet50"):
        save_random_checkpoint("resnet_5000", tmp_path / "x")


def test_missing_timm_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(RuntimeError, match=r"pip install 'trtmc\[bench\]'"):
        require_timm()
