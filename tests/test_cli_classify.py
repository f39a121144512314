"""`trtmc classify` over collections: images as arguments, folders and globs, JSON Lines and CSV outputs, error
records with exit status 1, a summary line, and the mistakes a new user makes, each in one line."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest

from conftest import LITE0_IN_REPO, run_cli
from support import IMAGES, watch_load_options
from trtmc.runtime import Runtime
from trtmc.tasks import image_to_class_scores

PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))


@pytest.fixture(scope="module")
def bundle(lite0_reference_bundle):
    return lite0_reference_bundle


@pytest.fixture()
def folder(tmp_path):
    photos = tmp_path / "photos"
    (photos / "more").mkdir(parents=True)
    for photo in PHOTOS[:3]:
        shutil.copy(photo, photos / photo.name)
    shutil.copy(PHOTOS[3], photos / "more" / PHOTOS[3].name)
    (photos / "more" / "broken.jpg").write_bytes(b"not a jpeg")
    return photos


def test_images_follow_the_bundle_as_plain_arguments_with_labels_in_text(bundle):
    out = run_cli("classify", bundle, "examples/images/chelsea.png", "--top-k", "2", "-q").stdout
    lines = out.splitlines()
    assert lines[0] == "examples/images/chelsea.png" and "282" in lines[1] and "tiger cat" in lines[1]
    assert len(lines) == 3


def test_a_folder_is_classified_recursively_and_a_broken_file_is_an_error_record(bundle, folder, tmp_path):
    out = tmp_path / "scores.jsonl"
    result = run_cli("classify", bundle, folder, "--output", out, "--top-k", "1", check=False)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert result.returncode == 1  # one file failed; every other one was classified
    assert [r["image"].rsplit("/", 1)[-1] for r in records] == sorted(p.name for p in PHOTOS[:3]) + sorted(
        ["broken.jpg", PHOTOS[3].name])
    broken = next(r for r in records if r["image"].endswith("broken.jpg"))
    assert set(broken) == {"image", "error"} and "not a readable image" in broken["error"]
    good = [r for r in records if "error" not in r]
    assert len(good) == 4 and all(len(r["logits"]) == 1000 and len(r["top"]) == 1 for r in good)
    assert "trtmc: 5 images to" in result.stderr and "1 failed" in result.stderr and "images/s" in result.stderr


def test_json_lines_carry_the_logits_the_task_gives_each_file(bundle):
    images = [str(p) for p in PHOTOS[:5]]
    rows = [json.loads(line) for line in run_cli("classify", bundle, *images, "--json", "-q").stdout.splitlines()]
    expected = image_to_class_scores(Runtime.open(bundle), images).logits
    assert [r["image"] for r in rows] == images
    for row, logits in zip(rows, expected):
        assert np.abs(np.array(row["logits"], np.float32) - logits).max() <= 1e-6 * np.abs(logits).max()


def test_csv_output_has_index_score_and_label_per_rank(bundle, tmp_path):
    out = tmp_path / "scores.csv"
    images = ["examples/images/chelsea.png", "examples/images/imagenet_01_559.jpg"]
    run_cli("classify", bundle, "--image", *images, "--top-k", "2", "--output", out, "-q")
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["image", "index_1", "score_1", "label_1", "index_2", "score_2", "label_2", "error"]
    assert [r["image"] for r in rows] == images
    assert rows[1]["index_1"] == "559" and rows[1]["label_1"] == "n03376595" and rows[1]["error"] == ""


def test_a_quoted_glob_is_expanded_rather_than_reported_missing(bundle, folder):
    out = run_cli("classify", bundle, f"{folder}/*.jpg", "--top-k", "1", "-q").stdout
    assert out.count("\n  1.") == sum(1 for p in PHOTOS[:3] if p.suffix == ".jpg")


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing_folder/"], "missing_folder/: no such file or folder"),
        ([], "no images given"),
        (["examples/images/chelsea.png", "--output", "scores.txt"], "give a .jsonl or .csv file name"),
        (["examples/images/chelsea.png", "--batch-size", "9"], "--batch-size 9 is larger than this bundle's engine"),
    ],
)
def test_mistakes_are_one_line_errors(bundle, args, message):
    result = run_cli("classify", bundle, *args, check=False)
    assert result.returncode == 1 and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_checkpoint_folder_or_hub_id_in_place_of_a_bundle_shows_the_build_command():
    folder = run_cli("classify", LITE0_IN_REPO, "examples/images/chelsea.png", check=False)
    assert folder.returncode == 1 and "is a checkpoint folder, not a bundle" in folder.stderr
    assert f"trtmc build {LITE0_IN_REPO} -o model.bundle" in folder.stderr
    hub = run_cli("classify", "timm/ghostnet_100.in1k", "examples/images/chelsea.png", check=False)
    assert hub.returncode == 1 and "looks like a Hugging Face model id" in hub.stderr


def test_verbose_works_after_the_command_too_and_logs_the_cold_start_breakdown(bundle, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="trtmc.classify")
    run_cli("classify", bundle, "examples/images/chelsea.png", "-v", "-q")
    steps = [r.getMessage() for r in caplog.records if r.name == "trtmc.classify"]
    assert any("imports" in s for s in steps) and any("engine reference-cpu-fp32 loaded" in s for s in steps)
    assert any("first result written" in s for s in steps)


def test_compiled_prints_the_same_top_class_as_the_quick_start_default(bundle):
    # The default answers at once from the uncompiled graph where an engine would compile; --compiled loads
    # it compiled. Same precision either way, so the same answer (this bundle's engine compiles in neither).
    image = "examples/images/chelsea.png"
    quick = run_cli("classify", bundle, image, "--top-k", "1", "-q").stdout.splitlines()
    compiled = run_cli("classify", "--compiled", bundle, image, "--top-k", "1", "-q").stdout.splitlines()
    assert compiled == quick and "282" in compiled[1] and "tiger cat" in compiled[1]
    help_text = " ".join(run_cli("classify", "--help").stdout.split())
    assert "--compiled compile the engine from the bundle's caches" in help_text


def test_classify_asks_every_engine_for_a_quick_start_unless_told_compiled(bundle, monkeypatch):
    # The options must reach the backend's load through Runtime and open_engine (the CUDA engine is the one
    # that acts on them, and no GPU is here): the reference backend's own load, watched.
    from trtmc.backends import LoadOptions

    asked = watch_load_options(monkeypatch, "reference")
    run_cli("classify", bundle, "examples/images/chelsea.png", "-q")
    run_cli("classify", bundle, "examples/images/chelsea.png", "--compiled", "-q")
    assert asked == [LoadOptions(quick_start=True), LoadOptions(quick_start=False)]


def test_the_timeline_says_when_the_engine_answers_uncompiled_for_a_quick_start(bundle):
    from trtmc.backends.inductor import UncompiledCudaEngine
    from trtmc.cli.classify import loaded_engine_step

    runtime = Runtime.open(bundle)
    # The CUDA path makes it on "cuda"; the class is the same on the CPU.
    quick = UncompiledCudaEngine(runtime.graph, "cpu", runtime.max_batch)
    assert loaded_engine_step("inductor-cuda-fp16", quick) == "engine inductor-cuda-fp16 loaded (uncompiled, quick start)"
    assert loaded_engine_step(runtime.choice.key, runtime.engine) == "engine reference-cpu-fp32 loaded"
