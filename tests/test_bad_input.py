"""Every rejection the task, the bundle reader and the builder promise, each with its clear error."""

import json
import shutil
import zipfile

import numpy as np
import pytest

from conftest import LITE0_IN_REPO, run_cli
from trtmc.bundle import FORMAT_VERSION, BundleError, read_bundle, write_bundle
from trtmc.runtime import Runtime
from trtmc.tasks import InvalidInput, image_to_class_scores


@pytest.fixture(scope="module")
def runtime(lite0_bundle):
    return Runtime.open(lite0_bundle)


def pixels(h=40, w=30, c=3, value=0.5):
    return np.full((h, w, c), value, dtype=np.float32)


def one_pixel(value, h=40, w=30):
    """Valid pixels but for one channel of one pixel, in the middle."""
    image = pixels(h, w)
    image[h // 2, w // 3, 1] = value
    return image


@pytest.mark.parametrize(
    "images, message",
    [
        (np.zeros((4, 4), np.float32), r"HWC \(rank 3\) or NHWC"),
        (pixels(c=4), "needs 3 channels"),
        (pixels(c=1), "needs 3 channels"),
        (pixels(value=np.nan), "NaN or Inf"),
        (pixels(value=np.inf), "NaN or Inf"),
        (one_pixel(np.nan), "NaN or Inf"),
        (one_pixel(-np.inf), "NaN or Inf"),
        (pixels(value=1.5), r"must lie in \[0, 1\]"),
        (pixels(value=-0.1), r"must lie in \[0, 1\]"),
        (pixels(h=0), "empty"),
        (pixels().astype(np.float64), "must be float32"),
        ([], "no images given"),
        ([pixels(), np.zeros((2, 2, 2, 3), np.float32)], "rank 3"),
    ],
)
def test_invalid_array_is_rejected_before_inference(runtime, images, message):
    with pytest.raises(InvalidInput, match=message):
        image_to_class_scores(runtime, images)


def test_unreadable_file_is_named_in_the_error(runtime, tmp_path):
    bad = tmp_path / "not_an_image.jpg"
    bad.write_bytes(b"this is text, not a JPEG")
    with pytest.raises(InvalidInput, match="not_an_image.jpg: not a readable image"):
        image_to_class_scores(runtime, [str(bad)])


def test_missing_file_is_named_in_the_error(runtime, tmp_path):
    with pytest.raises(InvalidInput, match="missing.png: no such image file"):
        image_to_class_scores(runtime, str(tmp_path / "missing.png"))


def test_unknown_option_is_rejected(runtime):
    with pytest.raises(TypeError, match="takes no options; got top_k"):
        image_to_class_scores(runtime, pixels(), top_k=3)


def test_grayscale_and_rgba_files_are_converted_to_rgb(runtime, tmp_path):
    from PIL import Image

    rgb = Image.open("examples/images/chelsea.png").convert("RGB")
    rgb.convert("L").save(tmp_path / "gray.png")
    rgb.convert("RGBA").save(tmp_path / "rgba.png")
    scores = image_to_class_scores(runtime, [str(tmp_path / "gray.png"), str(tmp_path / "rgba.png")])
    assert scores.logits.shape == (2, 1000) and np.isfinite(scores.logits).all()


def test_arrays_of_any_size_single_or_batched_are_accepted(runtime):
    rng = np.random.default_rng(0)
    one = rng.random((300, 451, 3), dtype=np.float32)
    batch = rng.random((2, 64, 48, 3), dtype=np.float32)
    assert image_to_class_scores(runtime, one).logits.shape == (1, 1000)
    assert image_to_class_scores(runtime, batch).logits.shape == (2, 1000)


def test_array_input_agrees_with_the_file_on_top1(runtime):
    from PIL import Image

    path = "examples/images/imagenet_01_559.jpg"
    array = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0
    from_file = image_to_class_scores(runtime, path).logits[0]
    from_array = image_to_class_scores(runtime, array).logits[0]
    assert np.argmax(from_file) == np.argmax(from_array) == 559


# ---- corrupted bundles ------------------------------------------------------------------------


def test_flipped_byte_fails_the_checksum_and_says_to_rebuild(lite0_bundle, tmp_path):
    damaged = tmp_path / "flipped.bundle"
    data = bytearray(lite0_bundle.read_bytes())
    with zipfile.ZipFile(lite0_bundle) as archive:
        info = archive.getinfo("graph.json")
    offset = info.header_offset + 30 + len(info.filename) + len(info.extra) + 10
    data[offset] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="rebuild it with `trtmc build`") as err:
        read_bundle(damaged)
    assert "graph.json" in str(err.value) or "corrupted" in str(err.value)


def test_truncated_bundle_is_refused(lite0_bundle, tmp_path):
    damaged = tmp_path / "truncated.bundle"
    damaged.write_bytes(lite0_bundle.read_bytes()[: lite0_bundle.stat().st_size // 2])
    with pytest.raises(BundleError, match="truncated"):
        read_bundle(damaged)


def test_member_replaced_with_other_content_fails_its_sha256(tmp_path):
    path = write_bundle(tmp_path / "a.bundle", {"engines": []}, {"graph.json": b"{}"})
    with zipfile.ZipFile(path) as archive:
        manifest = archive.read("manifest.json")
    with zipfile.ZipFile(path, "w") as archive:  # same names, a different member body
        archive.writestr("manifest.json", manifest)
        archive.writestr("graph.json", b"[]")
    with pytest.raises(BundleError, match="graph.json fails its sha256 check"):
        read_bundle(path)


def test_unknown_format_version_is_refused_with_the_supported_one(tmp_path):
    path = write_bundle(tmp_path / "a.bundle", {"engines": []}, {})
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    manifest["format_version"] = FORMAT_VERSION + 1
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("manifest.json", json.dumps(manifest))
    with pytest.raises(BundleError, match=f"version {FORMAT_VERSION + 1} is not supported.*reads version {FORMAT_VERSION}"):
        read_bundle(path)


def test_foreign_device_engine_is_refused_with_the_fix(lite0_bundle, tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU, so a CUDA engine is not foreign here")
    bundle = read_bundle(lite0_bundle)
    manifest = dict(bundle.manifest)
    members = {k: v for k, v in bundle.members.items() if not k.startswith("engines/")}
    members["engines/inductor-cuda-fp32/inductor-cache.bin"] = b"cache"
    manifest["engines"] = [{
        "key": "inductor-cuda-fp32", "backend": "inductor", "device": "cuda", "precision": "fp32",
        "files": ["inductor-cache.bin"], "batching": {"sizes": [1]}, "record": {"versions": {"torch": torch.__version__}},
    }]
    manifest.pop("members")
    path = write_bundle(tmp_path / "cuda.bundle", manifest, members)
    with pytest.raises(RuntimeError, match="this machine has none.*--device cpu"):
        Runtime.open(path)
    result = run_cli("classify", path, "--image", "examples/images/chelsea.png", check=False)
    assert result.returncode == 1 and "no engine in this bundle can run on this machine" in result.stderr
    assert result.stderr.count("\n") == 1  # one line; -v adds details


def test_pixels_of_the_wrong_size_are_refused_by_the_engine_instead_of_answering_nan(runtime):
    import torch

    with pytest.raises(ValueError, match=r"expected pixels \(N, 3, 224, 224\) float32 on cpu .*, got \(1, 3, 100, 100\)"):
        runtime.logits(torch.rand(1, 3, 100, 100))
    with pytest.raises(ValueError, match=r"got \(1, 3, 224, 224\) float64"):
        runtime.engine(torch.rand(1, 3, 224, 224, dtype=torch.float64))


def test_cli_reports_a_corrupt_bundle_in_one_line(tmp_path):
    path = tmp_path / "junk.bundle"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    result = run_cli("inspect", path, check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("trtmc: error:") and "Traceback" not in result.stderr


# ---- failed builds leave nothing behind ---------------------------------------------------------


def test_failed_build_leaves_no_output_file(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(LITE0_IN_REPO, broken)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(broken / "model.safetensors"))
    tensors["blocks.1.0.conv_dw.weight"] = tensors["blocks.1.0.conv_dw.weight"][:5]  # wrong channel count
    save_file(tensors, str(broken / "model.safetensors"))
    out = tmp_path / "out.bundle"
    result = run_cli("build", broken, "-o", out, "-q", check=False)
    assert result.returncode == 1 and "blocks.1.0.conv_dw" in result.stderr
    assert not out.exists()
    assert list(tmp_path.glob("*.partial")) == [] and list(tmp_path.glob(".*.partial")) == []


def test_failed_build_keeps_an_existing_bundle_untouched(tmp_path):
    out = tmp_path / "out.bundle"
    out.write_bytes(b"previous bundle")
    config = tmp_path / "unknown"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"architecture": "not_a_real_net"}))
    (config / "model.safetensors").write_bytes(b"")
    result = run_cli("build", config, "-o", out, "-q", check=False)
    assert result.returncode == 1 and "'not_a_real_net' is not supported" in result.stderr
    assert out.read_bytes() == b"previous bundle"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-batch", "0"], "--max-batch must be at least 1"),
        (["--opt-level", "7"], "--opt-level must be 0..5"),
        (["--backend", "inductor", "--backend", "inductor"], "lists a backend twice"),
    ],
)
def test_unsupported_build_options_are_refused_up_front(tmp_path, args, message):
    result = run_cli("build", LITE0_IN_REPO, "-o", tmp_path / "x.bundle", *args, check=False)
    assert result.returncode == 1 and message in result.stderr


def test_cuda_build_without_a_gpu_says_to_use_the_cpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run_cli("build", LITE0_IN_REPO, "-o", tmp_path / "x.bundle", "--device", "cuda", check=False)
    assert result.returncode == 1 and "build with --device cpu" in result.stderr
