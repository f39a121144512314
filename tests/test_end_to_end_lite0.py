"""The product's main path on a real checkpoint: build a bundle with the CLI, classify real photos."""

import json

import numpy as np
import pytest

from conftest import LITE0_IN_REPO, REPO, run_cli
from support import IMAGES, REFERENCE
from trtmc.bundle import read_bundle
from trtmc.graph import DType, OpKind
from trtmc.runtime import Runtime
from trtmc.tasks import image_to_class_scores

PHOTOS = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))


@pytest.fixture(scope="module")
def reference():
    return json.loads(REFERENCE.read_text())["images"]


@pytest.fixture(scope="module")
def scores(lite0_bundle):
    return image_to_class_scores(Runtime.open(lite0_bundle), [str(p) for p in PHOTOS])


def test_lite0_bundle_gives_timms_top1_for_every_shared_photo(scores, reference):
    assert len(PHOTOS) == 22
    for photo, logits in zip(PHOTOS, scores.logits):
        assert int(np.argmax(logits)) == reference[photo.name]["top5"][0], photo.name


def test_lite0_bundle_gives_timms_top5_set_and_logits_within_the_references_rounding(scores, reference, record_property):
    worst = 0.0
    for photo, logits in zip(PHOTOS, scores.logits):
        ref = reference[photo.name]
        top5 = np.argsort(-logits)[:5]
        assert set(top5.tolist()) == set(ref["top5"]), photo.name
        delta = np.abs(logits[ref["top5"]] - np.array(ref["top5_logits"])).max()
        worst = max(worst, float(delta))
    record_property("max_top5_logit_delta", worst)
    # The reference file rounds timm's logits to 4 decimals (up to 5e-5 off); the compiled CPU engine
    # adds float32 reassociation on top (measured: 5.3e-5 through the graph, see test_family_efficientnet).
    assert worst <= 1e-4, f"largest logit difference {worst:.2e}"


def test_scores_carry_every_logit_in_checkpoint_order_with_labels(scores):
    assert scores.logits.dtype == np.float32 and scores.logits.shape == (22, 1000)
    assert scores.label_names[282] == "n02123159"
    assert scores.label_descriptions["n02123159"] == "tiger cat"


def test_classify_prints_the_right_class_with_its_label(lite0_bundle):
    out = run_cli("classify", lite0_bundle, "--image", "examples/images/chelsea.png").stdout
    first = out.splitlines()[1]
    assert "282" in first and "tiger cat" in first


def test_classify_json_lines_hold_image_logits_and_top(lite0_bundle):
    images = ["examples/images/chelsea.png", "examples/images/imagenet_01_559.jpg"]
    out = run_cli("classify", lite0_bundle, "--image", *images, "--top-k", "3", "--json").stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["image"] for r in rows] == images
    assert all(len(r["logits"]) == 1000 for r in rows)
    assert rows[1]["top"][0]["index"] == 559 and rows[1]["top"][0]["label"] == "n03376595"
    assert set(rows[0]["top"][0]) == {"index", "score", "label", "description"}
    assert len(rows[0]["top"]) == 3


def test_inspect_shows_manifest_preprocessing_graph_and_engines(lite0_bundle):
    out = run_cli("inspect", lite0_bundle).stdout
    assert "tf_efficientnet_lite0 (family efficientnet)" in out
    assert "resize bicubic crop_pct 0.875" in out
    assert "conv2d" in out and "f32 49" in out
    assert "inductor-cpu-fp32" in out


def test_bundle_records_source_checkpoint_and_member_checksums(lite0_bundle):
    bundle = read_bundle(lite0_bundle)
    m = bundle.manifest
    assert m["source"]["revision"] == "local" and len(m["source"]["sha256"]) == 64
    assert {"runtime.json", "labels.json", "graph.json", "weights.safetensors"} <= set(m["members"])
    assert m["engines"][0]["key"] == "inductor-cpu-fp32"


def test_default_cpu_build_records_and_serves_the_max_batch_it_was_built_for(lite0_bundle):
    manifest = json.loads(run_cli("inspect", lite0_bundle, "--json").stdout)
    assert manifest["engines"][0]["batching"] == {"max_batch": 1}  # --max-batch 1, the default
    assert "record" in manifest["engines"][0] and "batch_sizes" not in manifest["engines"][0]["record"]
    assert "any batch 1..1" in run_cli("inspect", lite0_bundle).stdout


def test_families_lists_efficientnet_and_ghostnet_architectures():
    out = run_cli("families").stdout
    assert "tf_efficientnet_lite0" in out and "ghostnet_100" in out


def test_readmes_families_table_is_what_trtmc_families_prints():
    from trtmc.families import all_families

    table = run_cli("families", "--markdown").stdout
    assert len(table.splitlines()) == 2 + len(all_families())
    readme = (REPO / "README.md").read_text()
    assert table in readme, "regenerate it: trtmc families --markdown"
    assert readme.count("| family | architectures | precisions |") == 1, "one families table, the generated one"


def test_bf16_graph_has_no_fp32_or_fp16_convolution():
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph
    from trtmc.passes.precision import PrecisionPolicy, assign_precision

    _, graph = build_graph(Checkpoint(LITE0_IN_REPO), "bf16")
    typed = assign_precision(graph, PrecisionPolicy("bf16"))
    convs = [n for n in typed.nodes if n.kind is OpKind.CONV2D]
    assert len(convs) == 49 and {n.type.dtype for n in convs} == {DType.BF16}


def test_bundle_with_a_plan_and_an_inductor_engine_falls_back_with_one_line(lite0_bundle, tmp_path, caplog):
    both = tmp_path / "both.bundle"
    run_cli("build", LITE0_IN_REPO, "-o", both, "--backend", "tensorrt", "--add-engines-from", lite0_bundle, "-q")
    keys = [e.key for e in read_bundle(both).engines]
    assert keys == ["tensorrt-cuda-fp32", "inductor-cpu-fp32"]
    result = run_cli("classify", both, "--image", "examples/images/chelsea.png", "--top-k", "1")
    assert "tiger cat" in result.stdout
    # The CLI prints the runtime's warning as one "trtmc: ..." line; pytest captures the log record.
    (line,) = [r.getMessage() for r in caplog.records if "cannot run here" in r.getMessage()]
    assert "tensorrt-cuda-fp32" in line and "using inductor-cpu-fp32 instead" in line
    forced = run_cli("classify", both, "--image", "examples/images/chelsea.png", "--engine", "tensorrt", check=False)
    assert forced.returncode == 1 and "TensorRT plans run only on a CUDA GPU" in forced.stderr


def test_engines_from_another_precision_are_refused(lite0_bundle, tmp_path):
    result = run_cli("build", LITE0_IN_REPO, "-o", tmp_path / "x.bundle", "--backend", "tensorrt",
                     "--precision", "fp16", "--add-engines-from", lite0_bundle, "-q", check=False)
    assert result.returncode == 1 and "its graph differs from this build's" in result.stderr
    assert not (tmp_path / "x.bundle").exists()
