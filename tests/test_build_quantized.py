"""`trtmc build --precision fp8|int8 --calibration DIR`: refused for every family until a committed
study decision says the precision pays; with a decision injected here (a table entry, passed to
`build_bundle`), a bundle that holds the quantized graph, its recipe and its calibration scales, which
the reader checks against each other.

Bundles carry the reference engine (no compile step), built from the repo's real lite0 checkpoint.
"""

from __future__ import annotations

import pytest
import torch

from conftest import LITE0_IN_REPO, run_cli
from support import IMAGES
from trtmc.backends.torch_lowering import GraphModule
from trtmc.build import RECIPES, BuildError, BuildRequest, build_bundle
from trtmc.bundle import BundleError, read_bundle, write_bundle
from trtmc.checkpoint import Checkpoint
from trtmc.families import STUDY_DECISIONS, StudyDecision, all_families, build_graph, quantized_build_refusal
from trtmc.graph import OpKind
from trtmc.passes.fold_batch_norm import fold_batch_norm
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.passes.quantize import quantize
from trtmc.precision import PRECISIONS, QUANTIZED_FORMATS
from trtmc.preprocess import PreprocessSpec
from trtmc.quantization import calibrate_images
from trtmc.runtime import Runtime
from trtmc.tasks import load_image

CALIBRATION = tuple(sorted(IMAGES.glob("imagenet_0*.jpg")))  # 10 photos
PHOTO = IMAGES / "imagenet_15_99.jpg"  # not among them
REPORT = "benchmarks/studies/tf_efficientnet_lite0/study.md"


def pays(precision: str) -> tuple[StudyDecision, ...]:
    return (StudyDecision("efficientnet", precision, True, REPORT, "1.4x of fp16 at batch 128, 99.6% agreement"),)


def request(tmp_path, precision: str, **changes) -> BuildRequest:
    fields = dict(model=str(LITE0_IN_REPO), output=tmp_path / f"lite0-{precision}.bundle", precision=precision,
                  backends=("reference",), max_batch=2, calibration=CALIBRATION)
    return BuildRequest(**{**fields, **changes})


@pytest.fixture(scope="module", params=QUANTIZED_FORMATS)
def quantized_bundle(request, tmp_path_factory):
    precision = request.param
    folder = tmp_path_factory.mktemp(precision)
    return precision, build_bundle(
        BuildRequest(str(LITE0_IN_REPO), folder / "lite0.bundle", precision=precision, backends=("reference",),
                     max_batch=2, calibration=CALIBRATION),
        decisions=pays(precision),
    )


# ---- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", QUANTIZED_FORMATS)
def test_every_family_without_a_study_that_pays_refuses_quantized_builds(precision):
    decided = {d.family: d for d in STUDY_DECISIONS if d.precision == precision}
    for family in all_families():
        if family.name in decided and decided[family.name].ships:
            continue
        architecture = next(iter(family.architectures))
        refusal = quantized_build_refusal(architecture, family.name, precision)
        assert refusal is not None and family.name in refusal
        if family.name in decided:  # studied: the refusal gives the study's report
            assert decided[family.name].report in refusal
        else:
            assert architecture in refusal and f"trtmc study MODEL --precision fp16 --precision {precision}" in refusal


def test_a_study_that_decided_against_a_precision_points_to_its_report():
    decision = StudyDecision("ghostnet", "fp8", False, "benchmarks/studies/ghostnet_100/study.md",
                             "0.89x of fp16 at batch 1, 93.6% agreement")
    refusal = quantized_build_refusal("ghostnet_100", "ghostnet", "fp8", (decision,))
    assert decision.report in refusal and decision.summary in refusal and "--precision fp16" in refusal
    assert quantized_build_refusal("ghostnet_100", "ghostnet", "int8", (decision,)) is not None  # fp8's study says nothing of int8


def test_cli_build_refuses_fp8_for_lite0_and_writes_nothing(tmp_path):
    out = tmp_path / "lite0.bundle"
    result = run_cli("build", LITE0_IN_REPO, "-o", out, "--precision", "fp8", "--calibration", IMAGES,
                     "--backend", "reference", check=False)
    assert result.returncode == 1
    assert "no `trtmc study` has decided yet whether fp8 pays for the efficientnet family" in result.stderr
    assert not out.exists()


def test_a_quantized_build_needs_calibration_images_and_a_float_build_refuses_them(tmp_path):
    with pytest.raises(BuildError, match="--precision int8 needs --calibration DIR"):
        build_bundle(request(tmp_path, "int8", calibration=()), decisions=pays("int8"))
    with pytest.raises(BuildError, match="--precision fp16 does not use it"):
        request(tmp_path, "fp16").validate()
    with pytest.raises(BuildError, match="no such image file"):
        request(tmp_path, "fp8", calibration=(tmp_path / "missing.jpg",)).validate()


def test_study_decision_takes_only_quantized_formats():
    with pytest.raises(ValueError, match="not 'fp16'"):
        StudyDecision("resnet", "fp16", True, REPORT, "")


# ---- the allowed path ------------------------------------------------------------------------------


def test_quantized_bundle_records_its_recipe_calibration_and_quantized_ops(quantized_bundle):
    precision, path = quantized_bundle
    bundle = read_bundle(path)
    record = bundle.manifest["quantization"]
    assert bundle.manifest["precision"] == precision and record["format"] == precision
    assert record["compute_precision"] == "fp16" and record["recipe"] == RECIPES[precision].to_json()
    assert record["calibration"]["images"] == [p.name for p in CALIBRATION]
    graph = bundle.graph()
    quantized = [n.name for n in graph.nodes if n.kind in (OpKind.CONV2D, OpKind.LINEAR) and n.attrs.weight is None]
    assert record["quantized_ops"] == quantized and len(quantized) == 32  # the recipe's choice on lite0 (test_quantize_lite0)
    formats = {n.attrs.format for n in graph.nodes if n.kind in (OpKind.QUANTIZE, OpKind.DEQUANTIZE)}
    assert formats == {PRECISIONS[precision].dtype}
    assert [e.key for e in bundle.engines] == [f"reference-cpu-{precision}"]
    shown = run_cli("inspect", path).stdout
    assert f"quantized   32 ops in {precision} (the rest in fp16), scales calibrated on {len(CALIBRATION)} images" in shown


def test_quantized_bundle_runs_the_quantize_pass_graph_calibrated_on_its_images(quantized_bundle):
    precision, path = quantized_bundle
    checkpoint = Checkpoint(LITE0_IN_REPO)
    spec = PreprocessSpec.from_pretrained(checkpoint.config.pretrained)
    folded = fold_batch_norm(build_graph(checkpoint)[1])
    expected = quantize(assign_precision(folded, PrecisionPolicy("fp16")), RECIPES[precision],
                        calibrate_images(folded, spec, CALIBRATION))
    runtime = Runtime.open(path)
    pixels = spec.from_pil(load_image(PHOTO))[None]
    ours = torch.from_numpy(runtime.logits(pixels))
    with torch.no_grad():
        theirs = GraphModule(expected, half_convolutions_in_fp32=True)(pixels).float()
    assert torch.equal(ours, theirs)


# ---- the reader's checks ----------------------------------------------------------------------------


def rewritten(path, out, edit) -> BundleError:
    """The error reading `path` rewritten with `edit` applied to its manifest (checksums recomputed)."""
    bundle = read_bundle(path)
    manifest = {k: v for k, v in bundle.manifest.items() if k != "members"}
    edit(manifest)
    write_bundle(out, manifest, dict(bundle.members))
    with pytest.raises(BundleError) as caught:
        read_bundle(out)
    return caught.value


def test_reader_refuses_a_quantized_bundle_without_its_quantization_record(quantized_bundle, tmp_path):
    _, path = quantized_bundle
    error = rewritten(path, tmp_path / "b.bundle", lambda m: m.pop("quantization"))
    assert "field 'quantization' is missing" in str(error)


def test_reader_refuses_a_calibration_that_is_not_the_one_the_graph_was_quantized_with(quantized_bundle, tmp_path):
    _, path = quantized_bundle

    def edit(manifest):
        amax = manifest["quantization"]["calibration"]["input_amax"]
        amax[manifest["quantization"]["quantized_ops"][0]] *= 2

    error = rewritten(path, tmp_path / "b.bundle", edit)
    assert "the recorded calibration is not the one the graph was quantized with" in str(error)


def test_reader_refuses_a_quantized_graph_recorded_as_fp16(quantized_bundle, tmp_path):
    _, path = quantized_bundle

    def edit(manifest):
        manifest["precision"] = "fp16"
        manifest.pop("quantization")
        for entry in manifest["engines"]:
            entry["precision"], entry["key"] = "fp16", "reference-cpu-fp16"

    error = rewritten(path, tmp_path / "b.bundle", edit)
    assert "precision fp16 disagrees with graph.json" in str(error)


def test_reader_refuses_a_recipe_of_another_format(quantized_bundle, tmp_path):
    precision, path = quantized_bundle
    other = next(f for f in QUANTIZED_FORMATS if f != precision)
    error = rewritten(path, tmp_path / "b.bundle", lambda m: m["quantization"]["recipe"].update(format=other))
    assert f"quantization.recipe must be a recipe for {precision}" in str(error)
