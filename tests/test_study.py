"""`trtmc study` on the CPU: the request and the image split, the quality measures and the decision
rule on numbers made here, then whole studies of a small model (regnetx_002 at 64x64, random weights
calibrated on the shipped photos, as the bench tests use) with the reference engine: fp32, fp16 and
bf16 through the command line, fp8 and int8 through the quantize pass and the torch lowering, each
report read back for its sections and numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from trtmc.bench import oracle
from trtmc.bench.spec import TimingProtocol
from trtmc.bundle import read_bundle
from trtmc.random_weights import calibrate_on_photos, save_random_checkpoint, timm_pixels
from trtmc.study import quality
from trtmc.study.decision import MIN_AGREEMENT, decide
from trtmc.study.report import STUDY_JSON, STUDY_MD, STUDY_PNG, to_markdown, write_report
from trtmc.study.request import StudyError, StudyRequest, split_images
from trtmc.build import prepare_graph
from trtmc.checkpoint import open_checkpoint
from trtmc.study.request import REFERENCE
from trtmc.study.runner import build_variants, run_study

PHOTOS = oracle.photo_files()
SMALL = {"pretrained_cfg_overlay": {"input_size": (3, 64, 64)}}  # milliseconds per call
SECTIONS = ("Summary and decision", "Recipe", "Method", "Results", "What was not tried", "When to revisit", "Command")
QUICK = TimingProtocol(warmups=1, iters=3, round_ms=1.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    drawn = save_random_checkpoint("regnetx_002", tmp_path_factory.mktemp("drawn") / "regnetx_002", **SMALL)
    return calibrate_on_photos(drawn, tmp_path_factory.mktemp("ckpt") / "regnetx_002", timm_pixels(drawn, PHOTOS))


def photo_folder(root: Path, name: str, photos) -> Path:
    folder = root / name
    folder.mkdir()
    for photo in photos:
        (folder / photo.name).symlink_to(photo)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Three calibration photos and three held-out ones, two of them labelled in their names."""
    root = tmp_path_factory.mktemp("images")
    return photo_folder(root, "calibration", PHOTOS[:3]), photo_folder(root, "holdout", PHOTOS[-3:])


# ---- the request and the images ------------------------------------------------------------------


def test_default_split_halves_the_shipped_photos_by_name_without_overlap():
    split = split_images(None, None)
    assert split.calibration + split.holdout == PHOTOS
    assert len(split.calibration) == len(PHOTOS) // 2 and not set(split.calibration) & set(split.holdout)
    assert split.calibration[0].name in split.how and split.holdout[-1].name in split.how


def test_a_held_out_image_that_is_also_a_calibration_image_is_refused_even_renamed(tmp_path):
    calibration = photo_folder(tmp_path, "c", PHOTOS[:2])
    holdout = photo_folder(tmp_path, "h", PHOTOS[2:4])
    (holdout / "renamed.jpg").write_bytes(PHOTOS[1].read_bytes())
    with pytest.raises(StudyError, match=rf"share 1 image\(s\) \({PHOTOS[1].name} = renamed.jpg\)"):
        split_images(calibration, holdout)


def test_study_cli_refuses_calibration_without_holdout(tmp_path, tiny, folders):
    result = run_cli("study", tiny, "--device", "cpu", "--calibration", folders[0], "--out", tmp_path, check=False)
    assert result.returncode == 1 and "give both --calibration DIR and --holdout DIR, or neither" in result.stderr


def test_a_quantized_study_always_times_fp32_and_fp16_beside_it():
    request = StudyRequest("m", Path("out"), precisions=("int8",))
    assert request.variants == ("fp32", "fp16", "int8") and request.quantized == ("int8",)
    assert StudyRequest("m", Path("out"), precisions=("bf16",)).variants == ("fp32", "bf16")


def test_an_architecture_name_needs_random_weights():
    with pytest.raises(StudyError, match="pass --random-weights"):
        StudyRequest("ghostnet_050", Path("out"), device="cpu").validate()
    with pytest.raises(StudyError, match="--user-batch 8 is not measured"):
        StudyRequest("ghostnet_050", Path("out"), device="cpu", random_weights=True, user_batches=(8,)).validate()


# ---- quality and the rule, on numbers made here ------------------------------------------------------


def test_label_comes_from_imagenet_file_names_only():
    assert quality.label_of("imagenet_07_609.jpg") == 609 and quality.label_of("chelsea.png") is None


def test_quality_counts_a_non_finite_image_as_disagreeing_and_leaves_it_out_of_kl():
    reference = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 4.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    reference = torch.cat([reference, torch.full((4, 3), -5.0, dtype=torch.float64)], dim=1)  # top-5 needs 5 classes
    ref = oracle.Reference(("imagenet_00_0.jpg", "imagenet_01_2.jpg", "x.png", "y.png"), reference)
    ours = reference.clone()
    ours[1, :3] = torch.tensor([0.0, 1.0, 2.0])  # top-1 flips from 1 to 2, which is the label
    ours[3, 0] = float("nan")
    measured = quality.measure(ours, ref, tolerance=0.0)
    assert measured.agreement == 0.5 and measured.non_finite == 1
    expected = quality.kl_divergences(ours[:3], reference[:3])
    assert math.isclose(measured.kl_mean, float(expected.mean())) and measured.kl_p99 <= float(expected.max())
    assert measured.labelled == 2 and measured.label_top1 == 1.0
    assert not measured.verdict.right and measured.verdict.non_finite == ("y.png",)


def test_stress_inputs_are_noise_of_each_std_and_normalized_constant_images(tiny):
    from trtmc.checkpoint import Checkpoint
    from trtmc.preprocess import PreprocessSpec

    spec = PreprocessSpec.from_pretrained(Checkpoint(tiny).config.pretrained)
    stress = quality.stress_inputs(spec)
    assert stress.pixels.shape == (len(stress.names), 3, 64, 64)
    for i, std in enumerate(quality.STRESS_STDS):
        noise = stress.pixels[i * quality.NOISE_PER_STD:(i + 1) * quality.NOISE_PER_STD]
        assert abs(float(noise.std()) - std) < 0.05 * std
    white = stress.pixels[stress.names.index("constant white")]
    assert torch.allclose(white[:, 0, 0], (1 - torch.tensor(spec.mean)) / torch.tensor(spec.std))


def test_rule_ships_only_faster_than_fp16_beyond_the_margin_at_every_user_batch_and_with_agreement():
    fp16 = {1: 1.0, 128: 10.0}
    agree = {1: 1.0, 128: 0.995}
    assert decide("fp8", fp16, {1: 0.8, 128: 7.0}, agree, (1, 128), 0.05).ships
    slow_at_1 = decide("fp8", fp16, {1: 0.97, 128: 7.0}, agree, (1, 128), 0.05)
    assert not slow_at_1.ships and len(slow_at_1.reasons) == 1 and "batch 1: 1.03x" in slow_at_1.reasons[0]
    assert decide("fp8", fp16, {1: 0.97, 128: 7.0}, agree, (128,), 0.05).ships  # users run batch 128 only
    low = decide("int8", fp16, {1: 0.8, 128: 7.0}, {1: 1.0, 128: MIN_AGREEMENT - 0.001}, (1, 128), 0.05)
    assert not low.ships and "98.9% top-1 agreement" in low.reasons[0]
    unstable = decide("fp8", {1: None, 128: 10.0}, {1: 0.8, 128: 7.0}, agree, (1, 128), 0.05)
    assert not unstable.ships and "no stable time for fp16" in unstable.reasons[0]


# ---- whole studies ---------------------------------------------------------------------------------


def table(text: str, heading: str) -> dict[tuple[str, str], list[str]]:
    """The markdown table under `heading`: (first cell, second cell) -> the other cells."""
    lines = text.split(heading + "\n\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {(r[0], r[1]): r[2:] for r in rows}



@pytest.fixture(scope="module")
def quantized_study(tiny, folders, tmp_path_factory):
    calibration, holdout = folders
    request = StudyRequest(str(tiny), tmp_path_factory.mktemp("study"), precisions=("fp8", "int8"),
                           calibration=calibration, holdout=holdout, device="cpu", backend="reference",
                           batch_sizes=(1, 2), protocol=QUICK)
    result = run_study(request)
    write_report(result, request.out)
    return result


def test_quantized_study_builds_times_and_judges_fp32_fp16_fp8_and_int8_at_every_batch_size(quantized_study):
    result = quantized_study
    assert [v.name for v in result.variants] == ["fp32", "fp16", "fp8", "int8"]
    assert all(v.error is None for v in result.variants)
    for v in result.variants:
        assert set(v.quality) == {1, 2} and set(v.stress_non_finite) == {1, 2}
        for batch in (1, 2):
            row = result.row(v.name, batch)
            assert row.timing is not None and len(row.timing.samples_ms) == QUICK.iters and row.first_call_s > 0
    assert result.variant("fp32").quality[1].agreement == 1.0 and result.variant("fp32").quality[1].kl_mean < 1e-9


def test_quantized_variants_are_bundles_of_the_quantize_pass_calibrated_on_the_calibration_images(quantized_study):
    result = quantized_study
    names = [p.name for p in result.split.calibration]
    assert not set(names) & {p.name for p in result.split.holdout}
    for facts in result.recipes:
        bundle = read_bundle(result.variant(facts.precision).primary.path)
        record = bundle.manifest["quantization"]
        assert record["calibration"]["images"] == names and len(record["quantized_ops"]) == facts.quantized > 0
        assert facts.quantized + sum(facts.kept.values()) == facts.total


def test_quantized_study_decisions_follow_the_rule_from_the_reported_numbers(quantized_study):
    data = json.loads((quantized_study.request.out / STUDY_JSON).read_text())
    assert [d["precision"] for d in data["decisions"]] == ["fp8", "int8"]
    medians = {(r["subject"], r["batch"]): r["median_ms"] for r in data["rows"]}
    for d in data["decisions"]:
        variant = next(v for v in data["variants"] if v["name"] == d["precision"])
        agreement = min(q["top1_agreement"] for q in variant["quality"].values())
        faster = all(medians[(d["precision"], b)] is not None and medians[("fp16", b)] is not None
                     and medians[("fp16", b)] / medians[(d["precision"], b)] > 1 + QUICK.margin for b in (1, 2))
        assert d["ships"] == (faster and agreement >= MIN_AGREEMENT)
        assert d["ships"] or d["reasons"]


def test_quantized_study_report_states_recipe_and_why_each_precision_is_or_is_not_shipped(quantized_study):
    text = (quantized_study.request.out / STUDY_MD).read_text()
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == list(SECTIONS)
    for facts in quantized_study.recipes:
        assert f"| Quantized | {facts.quantized} of {facts.total} convolution and linear ops |" in text
    for d in quantized_study.decisions:
        assert (f"**{d.precision} ships**" if d.ships else f"**{d.precision} is not shipped**: {d.reasons[0]}") in text
    assert "the inductor engine runs a quantized op" not in text  # the reference engine ran, not Inductor
    assert "the reference engine runs the graph op by op" in text


def test_a_random_weights_study_says_its_agreement_is_a_proxy(quantized_study):
    text = to_markdown(replace(quantized_study, weights="random"))
    assert "**random weights**: top-1 agreement on them is a proxy" in text
    assert "Here the photos are the calibration images, never the held-out ones." in text
    assert "proxy" not in (quantized_study.request.out / STUDY_MD).read_text()


def test_bundles_built_in_parallel_processes_are_the_ones_one_process_builds(quantized_study, tmp_path):
    result = quantized_study
    request = replace(result.request, workdir=tmp_path, jobs=2)
    prepared = prepare_graph(open_checkpoint(request.model), REFERENCE)
    parallel = build_variants(request, prepared, ("fp32", "fp16", "bf16"), result.calibration, lambda m: None)
    for variant in result.variants:
        assert parallel[variant.name].error is None, parallel[variant.name].error
        ours, theirs = parallel[variant.name].primary.path, variant.primary.path
        assert ours.parent == tmp_path / "bundles" and ours.name == theirs.name
        ours, theirs = read_bundle(ours), read_bundle(theirs)
        key = theirs.engines[0].key
        assert ours.engine_files(key) == theirs.engine_files(key)
        assert ours.manifest.get("quantization") == theirs.manifest.get("quantization")


def test_quantized_study_plot_is_a_png(quantized_study):
    assert (quantized_study.request.out / STUDY_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_study_of_fp16_and_bf16_writes_a_report_whose_numbers_are_the_measured_ones(tiny, folders, tmp_path):
    calibration, holdout = folders
    out = tmp_path / "study"
    result = run_cli("study", tiny, "--precision", "fp16", "--precision", "bf16", "--device", "cpu",
                     "--backend", "reference", "--batch", "1", "--batch", "2", "--calibration", calibration,
                     "--holdout", holdout, "--out", out, "-q")
    assert f"wrote {out / STUDY_MD}" in result.stdout and (out / STUDY_PNG).is_file()
    data = json.loads((out / STUDY_JSON).read_text())
    text = (out / STUDY_MD).read_text()
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == list(SECTIONS)
    assert [v["name"] for v in data["variants"]] == ["fp32", "fp16", "bf16"] and data["decisions"] == []
    assert "No quantized precision was studied" in text and "3 held-out images" in text
    assert data["images"]["holdout"] == [p.name for p in PHOTOS[-3:]]
    speed, judged = table(text, "### Speed"), table(text, "### Quality (3 held-out images)")
    for v in data["variants"]:
        for row in (r for r in data["rows"] if r["subject"] == v["name"]):
            cells = speed[(v["name"], str(row["batch"]))]
            assert math.isclose(float(cells[1].rstrip("%")), 100 * row["timing"]["spread"], abs_tol=0.051)
            if row["median_ms"] is not None:
                assert math.isclose(float(cells[0]), row["median_ms"], abs_tol=0.00051)
        q = v["quality"]["1"]
        assert q["images"] == 3 and q["labelled"] == 3
        assert judged[(v["name"], "1")][0] == f"{q['top1_agreement']:.2%}"
    assert data["command"].startswith(f"trtmc study {tiny} --precision fp16 --precision bf16") and data["command"] in text
