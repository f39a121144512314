import json
from pathlib import Path

import pytest

from support import LITE0
from trtmc.checkpoint import Checkpoint, CheckpointError, open_checkpoint, parse_config


def write_config(folder, config, weights=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_real_checkpoint_config_is_read_into_a_typed_config():
    config = Checkpoint(LITE0).config
    assert config.architecture == "tf_efficientnet_lite0"
    assert config.pretrained.input_size == (3, 224, 224)
    assert config.pretrained.interpolation == "bicubic"
    assert config.pretrained.crop_pct == 0.875
    assert config.pretrained.mean == (0.5, 0.5, 0.5)
    assert len(config.label_names) == 1000
    assert config.label(282) == ("n02123159", "tiger cat")


def test_tensors_are_read_lazily_as_float32():
    ckpt = Checkpoint(LITE0)
    assert ckpt.shape("conv_stem.weight") == (32, 3, 3, 3)
    assert ckpt.reads == 0
    assert ckpt.tensor("conv_stem.weight").dtype.name == "float32"
    assert ckpt.reads == 1


@pytest.mark.parametrize(
    "config, message",
    [
        ({"num_classes": 10}, "no 'architecture'"),
        ({"architecture": "resnet18", "pretrained_cfg": {"input_size": [224, 224]}}, "input_size must be"),
        ({"architecture": "resnet18", "pretrained_cfg": {"interpolation": "lanczos"}}, "interpolation 'lanczos'"),
        ({"architecture": "resnet18", "pretrained_cfg": {"crop_pct": 1.5}}, "crop_pct must be in"),
        ({"architecture": "resnet18", "pretrained_cfg": {"crop_mode": "border"}}, "crop_mode 'border' is not supported"),
        ({"architecture": "resnet18", "num_classes": 3, "label_names": ["a", "b"]}, "label_names has 2 entries for 3"),
        ({"architecture": "resnet18", "pretrained_cfg": {"std": [0, 1, 1]}}, "std must be positive"),
    ],
)
def test_malformed_config_is_rejected_before_any_weight_is_read(tmp_path, config, message):
    folder = write_config(tmp_path / "ckpt", config)
    with pytest.raises(CheckpointError, match=message):
        Checkpoint(folder)


def test_config_that_is_not_json_names_the_file(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        Checkpoint(folder)


def test_folder_without_weights_says_what_is_missing(tmp_path):
    folder = write_config(tmp_path / "ckpt", {"architecture": "resnet18"}, weights=False)
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        Checkpoint(folder)


def test_hub_id_offline_says_to_pass_a_local_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(CheckpointError, match="pass its local folder"):
        open_checkpoint("timm/ghostnet_100.in1k")


def test_revision_with_a_local_folder_is_refused():
    with pytest.raises(CheckpointError, match="--revision applies to Hugging Face ids"):
        open_checkpoint(str(LITE0), revision="main")


@pytest.mark.parametrize(
    "config, message",
    [
        ({"architecture": "resnet18", "num_classes": "abc"}, "config.json: num_classes must be a positive integer, got 'abc'"),
        ({"architecture": "resnet18", "pretrained_cfg": {"num_classes": "abc"}},
         "config.json: pretrained_cfg.num_classes must be a non-negative integer, got 'abc'"),
        ({"architecture": "vit_small_patch14_dinov2", "pretrained_cfg": {"num_classes": 0}},
         r"num_classes must be a positive integer, got 0 \(a headless feature model"),
        ({"architecture": "resnet18", "num_classes": True}, "num_classes must be a positive integer, got True"),
        ({"architecture": "resnet18", "pretrained_cfg": {"input_size": [3, True, 224]}}, "input_size must be"),
        ({"architecture": "resnet18", "label_descriptions": {"a": 3}}, "label_descriptions must map label names to text"),
    ],
)
def test_config_fields_of_the_wrong_type_name_the_file_and_the_field(tmp_path, config, message):
    folder = write_config(tmp_path / "ckpt", config)
    with pytest.raises(CheckpointError, match=message):
        Checkpoint(folder)


@pytest.mark.parametrize("content", [[1, 2, 3], {"weight": "not a tensor"}])
def test_pytorch_model_bin_that_is_not_a_state_dict_is_refused_with_the_fix(tmp_path, content):
    import torch

    folder = write_config(tmp_path / "ckpt", {"architecture": "resnet18"}, weights=False)
    torch.save(content, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: holds a .*, not a state dict of named tensors"):
        Checkpoint(folder).names


def test_pytorch_model_bin_that_is_not_a_pickle_is_refused_with_the_fix(tmp_path):
    folder = write_config(tmp_path / "ckpt", {"architecture": "resnet18"}, weights=False)
    (folder / "pytorch_model.bin").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read it as a PyTorch state dict"):
        Checkpoint(folder).names


def test_offline_hub_error_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(CheckpointError) as err:
        open_checkpoint("timm/ghostnet_100.in1k")
    assert "\n" not in str(err.value)


def test_classifier_fine_tuned_from_a_headless_pretrained_tag_keeps_its_own_classes():
    # timm saves the DINOv2 tag's pretrained_cfg (num_classes 0) with the fine-tuned model's classes at the root.
    raw = {"architecture": "vit_small_patch14_dinov2", "num_classes": 10, "pretrained_cfg": {"num_classes": 0}}
    config = parse_config(raw, Path("config.json"))
    assert (config.num_classes, config.pretrained.num_classes) == (10, 0)
