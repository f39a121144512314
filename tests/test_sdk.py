"""The native SDK (sdk/) end to end: CMake builds libtrtmc, its consumers and its C++ contract tests;
ctest runs the contracts and both consumers classify the shipped photos with a CPU bundle of the real
lite0 checkpoint, printing what the Python task returns for the same arrays and the bundle's digest.
Invalid input, bundles the Python reader refuses and bundles other than the pinned one (expect_sha256)
are refused by the SDK too, each with its error code.

Needs cmake, a C/C++ compiler, libzip-dev, libssl-dev and nlohmann-json (`.ci/run` installs them).
The build goes to build/sdk-tests-torch<VERSION> (kept between runs: compiling against libtorch takes minutes here;
one per torch, since CMake keeps the libtorch it first found and a bundle runs only on the torch that built it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import LITE0_IN_REPO, run_cli
from support import IMAGES, REFERENCE, REPO
from trtmc.bundle import FORMAT_VERSION, BundleError, expected_digest, read_bundle, write_bundle
from trtmc.runtime import Runtime
from trtmc.tasks import decode_image, image_to_class_scores

pytestmark = pytest.mark.slow

BUILD = REPO / "build" / f"sdk-tests-torch{torch.__version__}"
PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))
CONSUMERS = ("c", "cpp")
# trtmc_code values (sdk/include/trtmc.h): the consumers exit with the code of a failed call.
CODES = {
    "TRTMC_ERROR_INVALID_SIZE": 2,
    "TRTMC_ERROR_SIZE_MISMATCH": 3,
    "TRTMC_ERROR_NON_FINITE": 4,
    "TRTMC_ERROR_OUT_OF_RANGE": 5,
    "TRTMC_ERROR_BUNDLE": 7,
    "TRTMC_ERROR_NO_ENGINE": 8,
    "TRTMC_ERROR_DIGEST_MISMATCH": 12,
    "TRTMC_ERROR_INVALID_ARGUMENT": 13,
}


def _run(*command, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout)


def _rewrite(source: Path, target: Path, edit) -> Path:
    """`source` changed by `edit(manifest, members)` and checksummed again: a valid bundle."""
    bundle = read_bundle(source)
    manifest = {k: v for k, v in bundle.manifest.items() if k not in ("format_version", "tool_version", "members")}
    members = dict(bundle.members)
    edit(manifest, members)
    return write_bundle(target, manifest, members)


def _without_labels(manifest: dict, members: dict) -> None:
    members["labels.json"] = json.dumps({"names": [], "descriptions": {}}).encode()


def _only_plans(manifest: dict, members: dict) -> None:
    manifest["engines"] = [e for e in manifest["engines"] if e["backend"] == "tensorrt"]
    for name in [n for n in members if n.startswith("engines/inductor")]:
        del members[name]


def _garbage_package(manifest: dict, members: dict) -> None:
    members["engines/inductor-cpu-fp32/model.pt2"] = b"not an AOTInductor package"


def _flip_a_weight(name: str, data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1]) if name == "weights.safetensors" else data


def _tamper(source: Path, target: Path, change) -> Path:
    """A copy of the zip whose members pass through `change(name, data) -> data or None (drop)`, the
    manifest untouched: what a damaged download or a hand edit leaves."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        for name in old.namelist():
            data = change(name, old.read(name))
            if data is not None:
                new.writestr(name, data)
    return target


def _with_extra_member(source: Path, target: Path) -> Path:
    shutil.copyfile(source, target)
    with zipfile.ZipFile(target, "a", zipfile.ZIP_STORED) as archive:
        archive.writestr("engines/inductor-cpu-fp32/extra.so", b"not listed")
    return target


def _truncated(source: Path, target: Path) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    return target


@pytest.fixture(scope="module")
def bundles(lite0_bundle, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sdk-bundles")
    return {
        "labelled": lite0_bundle,
        "unlabeled": _rewrite(lite0_bundle, folder / "unlabeled.bundle", _without_labels),
    }


@pytest.fixture(scope="module")
def sdk(bundles) -> Path:
    """The SDK built with the README's commands (plus the contract tests' bundles)."""
    if shutil.which("cmake") is None:
        pytest.fail("cmake is not installed: the SDK tests need it (see .ci/run)")
    configure = _run(
        "cmake", "-S", REPO / "sdk", "-B", BUILD, f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        f"-DTRTMC_TEST_BUNDLE={bundles['labelled']}", f"-DTRTMC_TEST_BUNDLE_UNLABELED={bundles['unlabeled']}",
    )
    assert configure.returncode == 0, f"cmake configure failed:\n{configure.stdout}\n{configure.stderr}"
    build = _run("cmake", "--build", BUILD, "-j", "2")
    assert build.returncode == 0, f"cmake build failed:\n{build.stdout[-6000:]}\n{build.stderr[-6000:]}"
    return BUILD


@pytest.fixture(scope="module")
def decoded(tmp_path_factory) -> dict[str, tuple[Path, int, int]]:
    """Every shipped photo written by `trtmc decode`: name -> (.rgb.f32 file, height, width)."""
    folder = tmp_path_factory.mktemp("rgb")
    files = {}
    for photo in PHOTOS:
        target = folder / f"{photo.stem}.rgb.f32"
        height, width = map(int, run_cli("decode", photo, "-o", target).stdout.split())
        files[photo.name] = (target, height, width)
    return files


def consume(kind: str, bundle: Path, image: Path, height, width, *options) -> subprocess.CompletedProcess:
    return _run(BUILD / f"sdk_consumer_{kind}", bundle, image, height, width, *options, timeout=300)


def test_contract_tests_pass_under_ctest(sdk):
    result = _run("ctest", "--test-dir", sdk, "--output-on-failure")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "100% tests passed, 0 tests failed out of 10" in result.stdout


def test_both_consumers_print_the_python_tasks_logits_and_timms_top1_for_every_photo(sdk, bundles, decoded):
    runtime = Runtime.open(bundles["labelled"])
    digest = read_bundle(bundles["labelled"]).digest
    reference = json.loads(REFERENCE.read_text())["images"]
    jobs = [(kind, photo) for photo in PHOTOS for kind in CONSUMERS]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: consume(job[0], bundles["labelled"], *decoded[job[1].name]), jobs))
    printed: dict[tuple[str, str], dict] = {}
    for (kind, photo), result in zip(jobs, results):
        assert result.returncode == 0, f"sdk_consumer_{kind} {photo.name}: {result.stderr}"
        printed[kind, photo.name] = json.loads(result.stdout)
    for photo in PHOTOS:
        python = image_to_class_scores(runtime, decode_image(photo))
        c, cpp = (printed[kind, photo.name] for kind in CONSUMERS)
        assert np.abs(np.array(c["logits"]) - np.array(cpp["logits"])).max() <= 1e-5, photo.name
        assert np.abs(np.array(c["logits"], dtype=np.float32) - python.logits[0]).max() <= 1e-5, photo.name
        assert int(np.argmax(c["logits"])) == reference[photo.name]["top5"][0], photo.name
        for result in (c, cpp):
            assert result["label_names"] == list(python.label_names)
            assert result["vocabulary_id"] == python.vocabulary_id == "imagenet-1k"
            assert result["engine"] == runtime.choice.key == "inductor-cpu-fp32"
            assert result["digest"] == digest


@pytest.mark.parametrize("kind", CONSUMERS)
def test_consumers_reject_each_invalid_input_with_its_error_code(sdk, bundles, decoded, tmp_path, kind):
    image, height, width = decoded["chelsea.png"]
    pixels = np.fromfile(image, dtype=np.float32)
    nan, above = tmp_path / "nan.rgb.f32", tmp_path / "above.rgb.f32"
    pixels.copy().tofile(nan)
    with open(nan, "r+b") as f:  # one NaN in the middle of the image
        f.seek(4 * (pixels.size // 2))
        f.write(np.float32(np.nan).tobytes())
    np.where(np.arange(pixels.size) == 7, np.float32(1.5), pixels).astype(np.float32).tofile(above)
    cases = [
        (image, height, width + 1, "TRTMC_ERROR_SIZE_MISMATCH", "x 3 channels needs"),
        (image, 0, width, "TRTMC_ERROR_INVALID_SIZE", "must be positive"),
        (image, height, -width, "TRTMC_ERROR_INVALID_SIZE", "must be positive"),
        (nan, height, width, "TRTMC_ERROR_NON_FINITE", "contains nan"),
        (above, height, width, "TRTMC_ERROR_OUT_OF_RANGE", "found 1.5 at row 0, column 2, channel 1"),
    ]
    for path, h, w, code, phrase in cases:
        result = consume(kind, bundles["labelled"], path, h, w)
        assert result.returncode == CODES[code], (code, result.stderr)
        assert code in result.stderr and phrase in result.stderr, result.stderr
        assert result.stdout == ""


def test_consumers_refuse_every_bundle_the_python_reader_refuses(sdk, bundles, decoded, tmp_path):
    source = bundles["labelled"]

    def set_version(name, data):
        if name != "manifest.json":
            return data
        manifest = json.loads(data)
        manifest["format_version"] = FORMAT_VERSION + 1
        return json.dumps(manifest).encode()

    broken = {
        "tampered member": (_tamper(source, tmp_path / "t.bundle", _flip_a_weight), "fails its sha256 check"),
        "unknown version": (
            _tamper(source, tmp_path / "v.bundle", set_version),
            f"format version {FORMAT_VERSION + 1} is not supported",
        ),
        "missing member": (
            _tamper(source, tmp_path / "m.bundle", lambda n, d: None if n == "runtime.json" else d),
            "member runtime.json is missing",
        ),
        "extra member": (_with_extra_member(source, tmp_path / "x.bundle"), "are not in the manifest (tampered)"),
        "no manifest": (
            _tamper(source, tmp_path / "n.bundle", lambda n, d: None if n == "manifest.json" else d),
            "not a trtmc bundle (no manifest.json)",
        ),
        "truncated": (_truncated(source, tmp_path / "cut.bundle"), "truncated, corrupted or not a trtmc bundle"),
        "missing file": (tmp_path / "absent.bundle", "no such bundle file"),
    }
    image, height, width = decoded["chelsea.png"]
    for case, (path, phrase) in broken.items():
        with pytest.raises(BundleError, match=re.escape(phrase)) as python:
            read_bundle(path)
        result = consume("c", path, image, height, width)
        assert result.returncode == CODES["TRTMC_ERROR_BUNDLE"], (case, result.stderr)
        assert phrase in result.stderr, (case, result.stderr)
        # ... with the same advice
        assert ("rebuild it with `trtmc build`" in str(python.value)) == ("rebuild it with `trtmc build`" in result.stderr)
        if case == "unknown version":  # the SDK reads the format this trtmc writes, and says which
            assert f"(it reads version {FORMAT_VERSION})" in result.stderr


def test_an_engine_that_fails_to_load_is_passed_over_with_the_reason(sdk, bundles, decoded, tmp_path):
    broken = _rewrite(bundles["labelled"], tmp_path / "broken.bundle", _garbage_package)
    result = consume("c", broken, *decoded["chelsea.png"])
    assert result.returncode == CODES["TRTMC_ERROR_NO_ENGINE"], result.stderr
    assert "no engine in this bundle can run on this machine (engine inductor-cpu-fp32 cannot run here: it failed to load (" in result.stderr
    assert "rebuild the bundle here, e.g. `trtmc build MODEL -o OUT --device cpu`" in result.stderr


def test_sdk_refuses_a_bundle_for_another_task(sdk, bundles, decoded, tmp_path):
    other = _rewrite(bundles["labelled"], tmp_path / "other.bundle", lambda manifest, _: manifest.update(task="image_to_text"))
    result = consume("cpp", other, *decoded["chelsea.png"])
    assert result.returncode == CODES["TRTMC_ERROR_BUNDLE"]
    assert "serves task 'image_to_text', not image_to_class_scores" in result.stderr


def test_sdk_passes_over_a_plan_it_cannot_run_with_one_line_and_uses_the_next_engine(sdk, bundles, decoded, tmp_path):
    both = tmp_path / "both.bundle"
    run_cli("build", LITE0_IN_REPO, "-o", both, "--backend", "tensorrt", "--add-engines-from", bundles["labelled"], "-q")
    image, height, width = decoded["chelsea.png"]
    for kind in CONSUMERS:
        result = consume(kind, both, image, height, width)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["engine"] == "inductor-cpu-fp32"
        (line,) = result.stderr.splitlines()
        assert "engine tensorrt-cuda-fp32 cannot run here: this libtrtmc was built without TensorRT" in line
        assert line.endswith("using inductor-cpu-fp32 instead")
    plan_only = _rewrite(both, tmp_path / "plan.bundle", _only_plans)
    result = consume("c", plan_only, image, height, width)
    assert result.returncode == CODES["TRTMC_ERROR_NO_ENGINE"]
    assert "no engine in this bundle can run on this machine" in result.stderr
    assert "tensorrt-cuda-fp32 cannot run here" in result.stderr


# ---- trust: the expect_sha256 option --------------------------------------------------------------


def test_consumers_print_the_bundles_digest_and_run_the_bundle_pinned_by_it(sdk, bundles, decoded):
    digest = read_bundle(bundles["labelled"]).digest
    image, height, width = decoded["chelsea.png"]
    for kind in CONSUMERS:
        plain = consume(kind, bundles["labelled"], image, height, width)
        pinned = consume(kind, bundles["labelled"], image, height, width, "--expect-sha256", digest.upper())
        assert plain.returncode == pinned.returncode == 0, plain.stderr + pinned.stderr
        plain, pinned = json.loads(plain.stdout), json.loads(pinned.stdout)
        assert plain["digest"] == pinned["digest"] == digest
        assert pinned["logits"] == plain["logits"]
    other = consume("c", bundles["unlabeled"], image, height, width)
    assert json.loads(other.stdout)["digest"] == read_bundle(bundles["unlabeled"]).digest != digest


def test_a_wrong_digest_exits_with_digest_mismatch_and_the_python_readers_message(sdk, bundles, decoded):
    wrong = read_bundle(bundles["unlabeled"]).digest  # a real bundle's digest, not this one's
    with pytest.raises(BundleError) as python:
        read_bundle(bundles["labelled"], wrong)
    for kind in CONSUMERS:
        result = consume(kind, bundles["labelled"], *decoded["chelsea.png"], "--expect-sha256", wrong)
        assert result.returncode == CODES["TRTMC_ERROR_DIGEST_MISMATCH"], result.stderr
        assert result.stderr == f"sdk_consumer_{kind}: TRTMC_ERROR_DIGEST_MISMATCH: {python.value}\n"
        assert result.stdout == ""


def test_a_wrong_digest_is_refused_before_any_member_is_checked_or_any_engine_loads(sdk, bundles, decoded, tmp_path):
    wrong = "0" * 64
    tampered = _tamper(bundles["labelled"], tmp_path / "tampered.bundle", _flip_a_weight)  # manifest as stored
    broken = _rewrite(bundles["labelled"], tmp_path / "broken.bundle", _garbage_package)
    for path, unpinned in ((tampered, "TRTMC_ERROR_BUNDLE"), (broken, "TRTMC_ERROR_NO_ENGINE")):
        assert consume("c", path, *decoded["chelsea.png"]).returncode == CODES[unpinned]
        result = consume("c", path, *decoded["chelsea.png"], "--expect-sha256", wrong)
        assert result.returncode == CODES["TRTMC_ERROR_DIGEST_MISMATCH"], result.stderr
        assert "nothing in it was loaded" in result.stderr and "cannot run here" not in result.stderr


def test_consumers_accept_exactly_the_digest_spellings_python_accepts(sdk, bundles, decoded):
    digest = read_bundle(bundles["labelled"]).digest
    typed = [
        digest.upper(), f" \t{digest}\n", f"\u3000{digest}\u00a0", f"\x1f{digest}\x1c",  # what a paste leaves
        digest[:-1], digest + "0", f"{digest[:32]} {digest[32:]}", "", f"sha256:{digest}", digest[:-1] + "g",
    ]
    for text in typed:
        try:
            python_accepts, message = expected_digest(text) == digest, ""
        except ValueError as error:
            python_accepts, message = False, str(error)
        result = consume("c", bundles["labelled"], *decoded["chelsea.png"], "--expect-sha256", text)
        if python_accepts:
            assert result.returncode == 0, (text, result.stderr)
        else:
            assert result.returncode == CODES["TRTMC_ERROR_INVALID_ARGUMENT"], (text, result.stderr)
            assert message.replace("--expect-sha256", "option expect_sha256") in result.stderr, (text, result.stderr)
