"""What the SDK reads from the Python side: the vocabulary id a build records, and the `.rgb.f32`
images `trtmc decode` writes for the SDK consumers. Fast: no engine is compiled."""

import json

import numpy as np
import timm.data
from PIL import Image

from conftest import LITE0_IN_REPO, run_cli
from support import IMAGES, reconfigured_checkpoint
from trtmc.bundle import read_bundle
from trtmc.checkpoint import Checkpoint, vocabulary_id

IMAGENET = list(timm.data.ImageNetInfo().label_names())


def test_imagenet_synsets_in_timms_order_are_the_imagenet_1k_vocabulary():
    assert len(IMAGENET) == 1000
    assert vocabulary_id(IMAGENET) == "imagenet-1k"
    assert vocabulary_id(tuple(IMAGENET)) == "imagenet-1k"


def test_reordered_partial_or_missing_names_have_no_vocabulary():
    swapped = IMAGENET[:]
    swapped[0], swapped[1] = swapped[1], swapped[0]
    assert vocabulary_id(swapped) == ""
    assert vocabulary_id(IMAGENET[:999]) == ""
    assert vocabulary_id([]) == ""


def test_the_shipped_lite0_checkpoint_names_imagenet_1k():
    assert vocabulary_id(Checkpoint(LITE0_IN_REPO).config.label_names) == "imagenet-1k"


def test_a_build_records_the_vocabulary_id_beside_the_labels(tmp_path, timm_checkpoint):
    # The reference engine builds in no time: enough to get a bundle's labels.json.
    lite0 = tmp_path / "lite0.bundle"
    run_cli("build", LITE0_IN_REPO, "-o", lite0, "--backend", "reference", "-q")
    assert read_bundle(lite0).labels["vocabulary_id"] == "imagenet-1k"
    own_labels = reconfigured_checkpoint(timm_checkpoint("ghostnet_050"), tmp_path / "labelled")
    config = json.loads((own_labels / "config.json").read_text())
    config["label_names"] = [f"class_{i}" for i in range(config["num_classes"])]
    (own_labels / "config.json").write_text(json.dumps(config))
    own = tmp_path / "own.bundle"
    run_cli("build", own_labels, "-o", own, "--backend", "reference", "-q")
    labels = read_bundle(own).labels
    assert labels["names"][:2] == ["class_0", "class_1"] and labels["vocabulary_id"] == ""


def test_decode_writes_rgb_float32_hwc_and_prints_height_and_width(tmp_path):
    target = tmp_path / "chelsea.rgb.f32"
    height, width = map(int, run_cli("decode", IMAGES / "chelsea.png", "-o", target).stdout.split())
    with Image.open(IMAGES / "chelsea.png") as image:
        expected = np.asarray(image.convert("RGB"), dtype=np.float32) / np.float32(255)
    assert (height, width) == expected.shape[:2] == (300, 451)
    assert np.array_equal(np.fromfile(target, dtype=np.float32).reshape(height, width, 3), expected)


def test_decode_writes_into_the_current_folder_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_cli("decode", IMAGES / "imagenet_00_243.jpg")
    assert (tmp_path / "imagenet_00_243.rgb.f32").stat().st_size > 0


def test_decode_of_an_unreadable_file_is_a_one_line_error_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    result = run_cli("decode", bad, "-o", tmp_path / "bad.rgb.f32", check=False)
    assert result.returncode == 1 and "not a readable image" in result.stderr
    assert not (tmp_path / "bad.rgb.f32").exists()
