"""The folder scope of `trtmc bench` on the CPU: a folder of files in, every file's result out, trtmc's
pipeline against a hand-written DataLoader, each side in a fresh process; every file counted once,
images/s and peak RSS recorded, every file's top-1 judged against timm's.

trtmc runs its reference engine (the uncompiled graph: nothing compiles) and the baseline runs timm eager
with 0 to 2 DataLoader workers: a check of the harness, not a measurement (`tools/folder_bench.py` is the
measurement, on the GPU).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trtmc.bench import oracle, report, runner
from trtmc.bench.folder import (
    ChildFailed,
    Measurement,
    TrtmcPass,
    build_folder,
    default_loader_workers,
    judge_side,
    measure,
    miscounted,
)
from trtmc.bench.folder_child import pass_batch_sizes, run_trtmc
from trtmc.bench.results import DATALOADER, TRTMC, BenchResult, FolderRun
from trtmc.bench.spec import BenchOptions, Entry, FolderSpec, SpecError, TimingProtocol, parse_config
from trtmc.build import BuildRequest, build_bundle
from trtmc.cli import build_parser
from trtmc.pipeline import expand_images
from trtmc.random_weights import calibrate_on_photos, load_timm_model, save_random_checkpoint, timm_pixels

PHOTOS = oracle.photo_files()
QUICK = TimingProtocol(warmups=1, iters=3, margin=0.9, round_ms=1)  # the rows are not what these tests are about


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Nothing here is a measurement; one torch thread, in this process and in the sides' (which inherit the
    environment), keeps a shared 2-core machine responsive: two threads of a busy machine spin in OpenMP's
    barriers (measured: the reference engine at batch 8 took 4.2 s with two threads, 0.26 s with one)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """regnetx_002 at 64x64, random weights calibrated on the shipped photos (photo i -> class i)."""
    drawn = save_random_checkpoint("regnetx_002", tmp_path_factory.mktemp("drawn") / "regnetx_002",
                                   pretrained_cfg_overlay={"input_size": (3, 64, 64)})
    return calibrate_on_photos(drawn, tmp_path_factory.mktemp("ckpt") / "regnetx_002", timm_pixels(drawn, PHOTOS))


@pytest.fixture(scope="module")
def reference(tiny):
    """timm fp32's logits for `tiny` on the shipped photos: the oracle's reference."""
    return oracle.reference(load_timm_model(tiny), timm_pixels(tiny, PHOTOS), PHOTOS)


def reference_bundle(folder: Path, output: Path) -> Path:
    return build_bundle(BuildRequest(model=str(folder), output=output, precision="fp32", device="cpu",
                                     backends=("reference",), max_batch=8), progress=lambda message: None)


def with_rolled_classes(folder: Path, dest: Path) -> Path:
    """A copy of checkpoint `folder` whose classifier answers class c + 1 where the original answers c."""
    from safetensors.torch import load_file, save_file

    classifier = load_timm_model(folder).default_cfg["classifier"]
    state = load_file(str(folder / "model.safetensors"))
    for key in (f"{classifier}.weight", f"{classifier}.bias"):
        state[key] = torch.roll(state[key], 1, dims=0).contiguous()
    dest.mkdir(parents=True)
    shutil.copy(folder / "config.json", dest / "config.json")
    save_file(state, str(dest / "model.safetensors"))
    return dest


# ---- the folder ----


def test_folder_is_the_photos_copied_round_robin_built_once_and_listed_in_file_order(tmp_path):
    folder = build_folder(PHOTOS, 50, tmp_path)
    assert len(folder.files) == 50 and len({p.name for p in folder.files}) == 50
    for i, path in enumerate(folder.files):
        assert folder.photos[i] == i % len(PHOTOS)
        assert path.read_bytes() == PHOTOS[i % len(PHOTOS)].read_bytes(), path.name
    assert expand_images([folder.path]) == list(folder.files)  # what `trtmc classify DIR` and both sides list
    stamp = folder.files[0].stat().st_mtime_ns
    assert build_folder(PHOTOS, 50, tmp_path) == folder and folder.files[0].stat().st_mtime_ns == stamp
    other = build_folder(PHOTOS, 23, tmp_path)
    assert other.path != folder.path and len(expand_images([other.path])) == 23


def test_dataloader_workers_default_to_the_cores_at_most_16_and_every_batch_shape_is_warmed_up():
    assert default_loader_workers(64) == 16 and default_loader_workers(2) == 2
    assert default_loader_workers() == min(len(os.sched_getaffinity(0)), 16)
    assert pass_batch_sizes(2002, 64) == [18, 64] and pass_batch_sizes(128, 64) == [64] and pass_batch_sizes(5, 64) == [5]


# ---- the scope end to end ----


def test_both_sides_classify_every_file_once_in_processes_of_their_own_and_are_compared(tiny, tmp_path):
    entry = Entry("tiny", str(tiny), precision="fp32", batch_sizes=(8,), protocol=QUICK,
                  folder=FolderSpec(images=(30,), loader_workers=2, baseline="eager"))
    options = BenchOptions(workdir=tmp_path / "work", device="cpu", baselines=(), backend="reference")
    bench = runner.run_bench([entry], options)
    result = bench.entries[0]
    assert result.status == "passed", result.message
    (run,) = result.folder_runs
    assert run.images == 30 and Path(run.folder).parent == tmp_path / "work" / "folders"
    for side in (run.trtmc, run.baseline):
        assert side.status == "ok", side.error
        assert side.files == 30 and side.verdict.right and side.verdict.photos == 30  # every file once, judged
        assert math.isfinite(side.images_per_s) and side.images_per_s > 0
        assert side.batch == 8 and side.device == "cpu" and side.load_seconds > 0
        assert side.peak_rss >= side.peak_rss_before_pass > 0
    assert run.trtmc.workers == os.cpu_count() and run.baseline.workers == 2
    # The DataLoader's workers are processes, waited for when the pass ends: their peak is recorded.
    assert run.baseline.workers_peak_rss > 0
    assert run.ratio == pytest.approx(run.trtmc.images_per_s / run.baseline.images_per_s)

    written = report.write_results(bench, tmp_path / "out")
    saved = json.loads(written["json"].read_text())
    entry_json = saved["entries"][0]
    assert entry_json["folder"] == {"images": [30], "loader_workers": 2, "baseline": "eager"}
    (run_json,) = entry_json["folder_runs"]
    assert run_json["ratio"] == pytest.approx(run.ratio, rel=1e-3)
    assert run_json["baseline"]["workers"] == 2 and run_json["trtmc"]["oracle"]["right"]
    assert run_json["trtmc"]["peak_rss_mib"] > 0 and run_json["baseline"]["workers_peak_rss_mib"] > 0
    assert saved["summary"]["folder"] == {"tiny": {"30": run_json["ratio"]}}
    markdown = written["markdown"].read_text()
    table = markdown.split("## Folder scope")[1].split("##")[0]
    assert f"| tiny | fp32 | 30 | right 30/30 | {run.trtmc.images_per_s:.1f} images/s |" in table
    assert "timm DataLoader + eager fp32 CL | cpu | 2 | 8 |" in table


def test_the_folder_oracle_catches_an_engine_that_answers_other_classes(tiny, reference, tmp_path):
    wrong = reference_bundle(with_rolled_classes(tiny, tmp_path / "rolled"), tmp_path / "rolled.bundle")
    folder = build_folder(PHOTOS, 24, tmp_path)
    answer = run_trtmc(TrtmcPass(folder.path, wrong, "reference", 8))
    side = judge_side(TRTMC, "trtmc fp32", answer, folder, reference, oracle.tolerance("fp32"))
    assert side.status == "wrong" and side.images_per_s is None
    assert side.verdict.wrong_photos == 24  # every file, each a copy of a photo whose class is now off by one
    assert side.verdict.mismatches[0].describe() == f"{folder.files[0].name}: top-1 class 1 where timm's is 0"
    right = judge_side(DATALOADER, "timm", replace(answer, top1=tuple(folder.photos)), folder, reference, 2.0**-8)
    run = FolderRun(24, str(folder.path), side, right)
    assert run.ratio is None
    status, message = runner.entry_status([], (run,))
    assert status == "failed" and "trtmc folder of 24 images: wrong on 24 of 24" in message


def test_a_file_missing_or_counted_twice_is_an_error_not_a_speed(tiny, reference, tmp_path):
    folder = build_folder(PHOTOS, 4, tmp_path)
    names = [p.name for p in folder.files]
    answer = Measurement(files=(names[0], names[1], names[1], "stray.jpg"), top1=(0, 1, 1, 2), errors=(), seconds=0.5,
                         load_seconds=1.0, workers=1, batch=2, device="cpu", peak_rss=1, peak_rss_before_pass=1,
                         workers_peak_rss=0, tree_peak_rss=1)
    side = judge_side(TRTMC, "trtmc", answer, folder, reference, 2.0**-8)
    assert side.status == "error" and side.images_per_s is None
    assert side.error == (f"4 results for 4 files: 2 missing (first: {names[2]}), 1 counted more than once "
                          f"(first: {names[1]}), 1 not in the folder (first: stray.jpg)")
    assert miscounted(list(reversed(names)), names) is None  # order is the pipeline's business, not the count's
    failed = replace(answer, files=tuple(names), top1=(0, 1, -1, 3), errors=(f"{names[2]}: not a readable image",))
    assert judge_side(TRTMC, "trtmc", failed, folder, reference, 2.0**-8).error == (
        f"1 of 4 files failed (first: {names[2]}: not a readable image)")


def test_a_side_whose_process_fails_is_reported_with_the_last_line_of_its_stderr(tmp_path):
    folder = build_folder(PHOTOS, 2, tmp_path)
    with pytest.raises(ChildFailed, match=r"exited with status 1: trtmc.bundle.BundleError: .*nothing\.bundle: no such bundle file$"):
        measure(TrtmcPass(folder.path, tmp_path / "nothing.bundle", "reference", 2), tmp_path / "scratch")


# ---- the spec and the command line ----


def test_yaml_folder_key_reads_counts_workers_and_baseline_and_defaults_fill_it():
    config = parse_config({
        "defaults": {"folder": {"images": 2002}},
        "entries": [{"model": "a", "weights": "random"},
                    {"model": "b", "weights": "random", "folder": {"images": [2002, 20000], "loader_workers": 0,
                                                                    "baseline": "eager"}}],
    })
    first, second = config.entries
    assert first.folder == FolderSpec(images=(2002,))
    assert second.folder == FolderSpec(images=(2002, 20000), loader_workers=0, baseline="eager")
    assert parse_config({"entries": [{"model": "c", "weights": "random"}]}).entries[0].folder is None


@pytest.mark.parametrize(
    "folder, message",
    [
        ({"image": [10]}, r"folder: unknown key 'image' \(did you mean 'images'\?\)"),
        ({"loader_workers": 2}, r"folder: 'images' is required"),
        ({"images": [0]}, r"folder: 'images' must be a list of image counts from 1 to 1000000"),
        ({"images": "many"}, r"folder: 'images' must be a list of image counts such as \[2002, 20000\]"),
        ({"images": [10, 10]}, r"folder: 'images' lists a count twice"),
        ({"images": [10], "loader_workers": -1}, r"folder: 'loader_workers' must be an integer >= 0"),
        ({"images": [10], "baseline": "jit"}, r"folder: 'baseline' must be one of compile, eager, got 'jit'"),
        ([10], r"folder: must be a mapping"),
    ],
)
def test_yaml_folder_mistakes_name_the_entry_and_key(folder, message):
    with pytest.raises(SpecError, match=r"entries\[0\] \(m\): " + message):
        parse_config({"entries": [{"model": "m", "weights": "random", "folder": folder}]})


def bench_args(*args):
    return build_parser().parse_args(["bench", *map(str, args)])


def test_command_line_sets_up_the_folder_scope(tiny):
    (entry,) = runner_entries("--model", tiny, "--folder-images", 2002, "--folder-images", 20000,
                              "--loader-workers", 3, "--folder-baseline", "eager")
    assert entry.folder == FolderSpec(images=(2002, 20000), loader_workers=3, baseline="eager")
    (plain,) = runner_entries("--model", tiny)
    assert plain.folder is None
    with pytest.raises(SpecError, match="--loader-workers and --folder-baseline set up the folder scope: add --folder-images"):
        runner_entries("--model", tiny, "--loader-workers", 3)


def runner_entries(*args):
    from trtmc.bench.cli import entries_from_args

    return entries_from_args(bench_args(*args))


def test_results_without_a_folder_scope_have_no_folder_section(tmp_path):
    bench = BenchResult(runner.environment("cpu"), BenchOptions(workdir=tmp_path, device="cpu", baselines=()), (), "now", 1.0)
    assert "Folder scope" not in report.to_markdown(bench) and report.to_json(bench)["summary"]["folder"] == {}


def test_bench_help_says_what_the_folder_scope_runs_on_each_side():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        bench_args("--help")
    out = out.getvalue()
    for phrase in ("--folder-images", "folder scope", "classify_files", "torch.utils.data.DataLoader",
                   "the cores up to 16", "peak RSS", "--loader-workers", "--folder-baseline"):
        assert phrase in out, phrase
