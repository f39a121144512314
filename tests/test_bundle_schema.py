"""A bundle is checked when it opens: each member against its schema, the members against each other,
the manifest digest against the one a user pinned; then choosing an engine includes loading it.

Bundles here carry the reference engine (no compile step), built from the repo's lite0 checkpoint,
and are altered member by member with their checksums recomputed, so only the check under test can
refuse them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from conftest import LITE0_IN_REPO, run_cli
from trtmc.backends import Batching, EngineEntry
from trtmc.bundle import BundleError, manifest_digest, read_bundle, write_bundle
from trtmc.runtime import EngineUnavailable, Runtime
from trtmc.schema import SchemaError

PHOTO = "examples/images/chelsea.png"
REBUILD = "; rebuild it with `trtmc build`"


@pytest.fixture(scope="module")
def reference_bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bundles") / "lite0-reference.bundle"
    run_cli("build", LITE0_IN_REPO, "-o", path, "--backend", "reference", "--max-batch", "4", "-q")
    return path


def contents(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        members = {n: archive.read(n) for n in archive.namelist() if n != "manifest.json"}
    return manifest, members


def rewritten(path: Path, out: Path, manifest_edit: Callable[[dict], None] = lambda m: None,
              json_edits: dict[str, Callable[[Any], Any]] | None = None,
              extra: dict[str, bytes] | None = None) -> Path:
    """`path` with its manifest and JSON members edited and every checksum recomputed."""
    manifest, members = contents(path)
    for name, edit in (json_edits or {}).items():
        members[name] = json.dumps(edit(json.loads(members[name]))).encode()
    members.update(extra or {})
    manifest.pop("members")
    manifest_edit(manifest)
    return write_bundle(out, manifest, members)


def without(key: str) -> Callable[[dict], dict]:
    def edit(data: dict) -> dict:
        data.pop(key)
        return data

    return edit


def replaced(key: str, value: Any) -> Callable[[dict], dict]:
    def edit(data: dict) -> dict:
        data[key] = value
        return data

    return edit


def one_line_refusal(path: Path, match: str) -> str:
    with pytest.raises(BundleError, match=match) as error:
        read_bundle(path)
    message = str(error.value)
    assert "\n" not in message and message.endswith(REBUILD[2:])
    return message


# ---- each member against its schema --------------------------------------------------------------


def test_manifest_whose_members_is_a_list_is_refused_naming_the_field(reference_bundle, tmp_path):
    manifest, members = contents(reference_bundle)
    manifest["members"] = sorted(manifest["members"])
    broken = tmp_path / "members-list.bundle"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("manifest.json", json.dumps(manifest))
        for name, data in members.items():
            archive.writestr(name, data)
    one_line_refusal(broken, r"manifest.json: members must be an object \(member name -> \{sha256, size\}\), got a list")


@pytest.mark.parametrize(
    "member, edit, message",
    [
        ("manifest.json", without("source"), r"manifest.json: field 'source' is missing"),
        ("manifest.json", replaced("num_classes", "abc"), r"manifest.json: num_classes must be an integer >= 1, got the string 'abc'"),
        ("engine entry", without("backend"), r"manifest.json: field 'backend' is missing in engines\[0\]"),
        ("engine entry", without("batching"), r"manifest.json: field 'batching' is missing in engines\[0\]"),
        ("engine entry", replaced("batching", {"max_batch": 4, "sizes": [1, 4]}),
         r"manifest.json: engines\[0\].batching must hold either 'max_batch' .* or 'sizes'"),
        ("graph.json", without("nodes"), r"graph.json: field 'nodes' is missing"),
        ("runtime.json", without("crop_pct"), r"runtime.json: field 'crop_pct' is missing"),
        ("runtime.json", replaced("interpolation", "lanczos"), r"runtime.json: interpolation must be one of 'bilinear', 'bicubic', 'nearest', got the string 'lanczos'"),
        ("labels.json", lambda labels: labels["names"], r"labels.json: the document must be an object \{names, descriptions\}, got a list"),
    ],
    ids=["no-source", "num-classes-text", "entry-no-backend", "entry-no-batching", "batching-both", "graph-no-nodes",
         "runtime-no-crop-pct", "runtime-unknown-interpolation", "labels-list"],
)
def test_member_that_breaks_its_schema_is_refused_in_one_line_naming_file_field_and_fix(
    reference_bundle, tmp_path, member, edit, message
):
    if member == "manifest.json":
        broken = rewritten(reference_bundle, tmp_path / "b.bundle", manifest_edit=edit)
    elif member == "engine entry":
        broken = rewritten(reference_bundle, tmp_path / "b.bundle", manifest_edit=lambda m: edit(m["engines"][0]))
    else:
        broken = rewritten(reference_bundle, tmp_path / "b.bundle", json_edits={member: edit})
    one_line_refusal(broken, message)


def test_cli_reports_a_schema_refusal_in_one_line_without_a_traceback(reference_bundle, tmp_path):
    broken = rewritten(reference_bundle, tmp_path / "b.bundle", json_edits={"runtime.json": without("crop_pct")})
    result = run_cli("classify", broken, "--image", PHOTO, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "runtime.json: field 'crop_pct' is missing" in result.stderr


# ---- members that disagree ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "manifest_edit, json_edits, message",
    [
        (None, {"runtime.json": replaced("input_size", [5, 5])},
         r"runtime.json: input_size \[5, 5\] disagrees with the graph's input 224x224"),
        (None, {"labels.json": lambda labels: {**labels, "names": labels["names"][:999]}},
         r"labels.json: names holds 999 labels but the graph gives 1000 classes"),
        (replaced("num_classes", 10), None, r"manifest.json: num_classes 10 disagrees with the graph's 1000 output classes"),
        (replaced("precision", "bf16"), None, r"manifest.json: precision bf16 disagrees with graph.json, whose ops compute in f32"),
        (replaced("io_dtype", "fp16"), None, r"manifest.json: io_dtype fp16 disagrees with the graph's input f32 and output f32"),
        (lambda m: m["engines"][0].update(files=["model.pt2"]), None,
         r"manifest.json: engines\[0\].files lists 'model.pt2' but the bundle has no member engines/reference-cpu-fp32/model.pt2"),
        (lambda m: m["engines"][0].update(key="reference-cuda-fp32"), None,
         r"manifest.json: engines\[0\].key is 'reference-cuda-fp32' but backend, device and precision make 'reference-cpu-fp32'"),
        (lambda m: m["engines"].append(m["engines"][0]), None, r"manifest.json: engines\[1\].key 'reference-cpu-fp32' appears twice"),
    ],
    ids=["input-size", "label-count", "num-classes", "precision", "io-dtype", "engine-file-missing", "engine-key", "engine-twice"],
)
def test_bundle_whose_members_disagree_is_refused_when_it_opens(reference_bundle, tmp_path, manifest_edit, json_edits, message):
    broken = rewritten(reference_bundle, tmp_path / "b.bundle", manifest_edit=manifest_edit or (lambda m: None),
                       json_edits=json_edits)
    one_line_refusal(broken, message)


def test_engine_member_that_no_entry_lists_is_refused(reference_bundle, tmp_path):
    broken = rewritten(reference_bundle, tmp_path / "b.bundle", extra={"engines/inductor-cpu-fp32/model.pt2": b"x"})
    one_line_refusal(broken, r"manifest.json: member engines/inductor-cpu-fp32/model.pt2 belongs to no engine in engines")


def test_runtime_json_with_a_wrong_input_size_no_longer_classifies_as_nan(reference_bundle, tmp_path):
    broken = rewritten(reference_bundle, tmp_path / "b.bundle", json_edits={"runtime.json": replaced("input_size", [5, 5])})
    result = run_cli("classify", broken, "--image", PHOTO, check=False)
    assert result.returncode == 1 and "nan" not in result.stdout and "input_size [5, 5] disagrees" in result.stderr


# ---- the typed engine entry ------------------------------------------------------------------------


def test_engine_entry_round_trips_through_json_with_its_batching():
    entry = EngineEntry("inductor-cuda-fp16", "inductor", "cuda", "fp16", ("inductor-cache.bin",),
                        Batching.fixed([64, 1]), {"versions": {"torch": "2.14.1"}})
    data = entry.to_json()
    assert data["batching"] == {"sizes": [1, 64]}
    assert EngineEntry.from_json(json.loads(json.dumps(data))) == entry


@pytest.mark.parametrize(
    "batching, message",
    [
        ({}, "either 'max_batch'"),
        ({"max_batch": 0}, "max_batch must be an integer >= 1, got the number 0"),
        ({"sizes": [64, 1]}, "sizes must be distinct batch sizes in ascending order"),
        ({"sizes": []}, "sizes must be a list of some integers >= 1"),
    ],
)
def test_engine_entry_with_bad_batching_is_refused_naming_the_field(batching, message):
    data = EngineEntry("reference-cpu-fp32", "reference", "cpu", "fp32", (), Batching.up_to(1)).to_json()
    data["batching"] = batching
    with pytest.raises(SchemaError, match=message):
        EngineEntry.from_json(data, "engines[0]")


def test_batching_serves_what_it_declares_and_pads_up_to_a_fixed_size():
    dynamic, fixed = Batching.up_to(4), Batching.fixed((1, 8))
    assert [dynamic.accepts(n) for n in range(6)] == [False, True, True, True, True, False]
    assert [fixed.accepts(n) for n in (1, 2, 8, 9)] == [True, False, True, False]
    assert [dynamic.run_size(n) for n in (1, 3)] == [1, 3] and [fixed.run_size(n) for n in (1, 2, 8)] == [1, 8, 8]
    assert (str(dynamic), str(fixed)) == ("any batch 1..4", "batch 1, 8")


def test_reference_build_records_the_max_batch_it_was_asked_for(reference_bundle):
    out = json.loads(run_cli("inspect", reference_bundle, "--json").stdout)
    assert out["engines"][0]["batching"] == {"max_batch": 4}
    assert Runtime.open(reference_bundle).batching == Batching.up_to(4)


# ---- trust: the manifest digest ----------------------------------------------------------------------


def stored_manifest_sha256(path: Path) -> str:
    with zipfile.ZipFile(path) as archive:
        return hashlib.sha256(archive.read("manifest.json")).hexdigest()


def test_inspect_prints_the_manifest_digest_that_pins_every_member(reference_bundle):
    digest = stored_manifest_sha256(reference_bundle)
    assert read_bundle(reference_bundle).digest == digest
    with zipfile.ZipFile(reference_bundle) as archive:
        assert manifest_digest(archive.read("manifest.json")) == digest
    assert f"digest      {digest}" in run_cli("inspect", reference_bundle).stdout


def test_classify_with_the_expected_digest_runs_and_with_another_is_refused(reference_bundle):
    digest = stored_manifest_sha256(reference_bundle)
    ok = run_cli("classify", reference_bundle, "--image", PHOTO, "--top-k", "1", "--expect-sha256", digest.upper())
    assert "tiger cat" in ok.stdout
    other = "0" * 64
    refused = run_cli("classify", reference_bundle, "--image", PHOTO, "--expect-sha256", other, check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"manifest digest {digest} is not the expected {other}" in refused.stderr and refused.stderr.count("\n") == 1


def test_a_pinned_digest_is_checked_before_anything_else_in_the_bundle(reference_bundle, tmp_path):
    tampered = tmp_path / "tampered.bundle"
    manifest, members = contents(reference_bundle)
    members["runtime.json"] = members["runtime.json"].replace(b"0.875", b"0.9")  # checksum now fails
    with zipfile.ZipFile(reference_bundle) as archive:
        raw = archive.read("manifest.json")
    with zipfile.ZipFile(tampered, "w") as archive:
        archive.writestr("manifest.json", raw)
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(BundleError, match="runtime.json fails its sha256 check"):
        Runtime.open(tampered)
    with pytest.raises(BundleError, match="is not the expected"):
        Runtime.open(tampered, expect_sha256="ab" * 32)


def test_a_digest_that_is_not_64_hex_digits_is_refused_with_what_to_pass(reference_bundle):
    with pytest.raises(ValueError, match="--expect-sha256 takes the 64 hex digits `trtmc inspect` prints"):
        Runtime.open(reference_bundle, expect_sha256="abc")


# ---- choosing an engine includes loading it -------------------------------------------------------


@pytest.fixture(scope="module")
def garbage_first(reference_bundle, tmp_path_factory) -> Path:
    """An inductor CPU engine whose package is garbage (preferred), then the reference engine."""
    inductor = EngineEntry("inductor-cpu-fp32", "inductor", "cpu", "fp32", ("model.pt2",), Batching.up_to(1),
                           {"versions": {"torch": torch.__version__}})
    return rewritten(
        reference_bundle, tmp_path_factory.mktemp("garbage") / "garbage-first.bundle",
        manifest_edit=lambda m: m["engines"].insert(0, inductor.to_json()),
        extra={"engines/inductor-cpu-fp32/model.pt2": b"not an AOTInductor package"},
    )


def test_engine_that_fails_to_load_is_passed_over_with_one_line(garbage_first, caplog):
    with caplog.at_level(logging.WARNING, logger="trtmc.runtime"):
        runtime = Runtime.open(garbage_first)
    assert runtime.choice.key == "reference-cpu-fp32"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "trtmc.runtime"]
    assert line.startswith("engine inductor-cpu-fp32 cannot run here: it failed to load (ValueError: model.pt2 is not an")
    assert line.endswith("; using reference-cpu-fp32 instead") and "\n" not in line


def test_asking_for_the_engine_that_fails_to_load_is_an_error(garbage_first):
    with pytest.raises(EngineUnavailable, match="engine inductor-cpu-fp32 cannot run here: it failed to load"):
        Runtime.open(garbage_first, engine="inductor")
    result = run_cli("classify", garbage_first, "--image", PHOTO, "--engine", "inductor-cpu-fp32", check=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "failed to load" in result.stderr


def test_unknown_engine_name_lists_the_bundles_engines_and_the_backends(reference_bundle):
    result = run_cli("classify", reference_bundle, "--image", PHOTO, "--engine", "bogus", check=False)
    assert result.returncode == 1 and "--backend bogus" not in result.stderr
    assert "no 'bogus' engine in this bundle (it has: reference-cpu-fp32)" in result.stderr
    assert "--engine takes a backend (tensorrt, inductor, reference) or an engine key" in result.stderr


def test_known_backend_missing_from_the_bundle_says_how_to_add_it(reference_bundle):
    with pytest.raises(EngineUnavailable, match=r"no 'tensorrt' engine .*add one with `trtmc build \.\.\. --backend tensorrt`"):
        Runtime.open(reference_bundle, engine="tensorrt")
