"""The committed study decisions (trtmc.families.STUDY_DECISIONS) are the ones their reports made:
each row's report is in the repository, and its study.json names the same family, decision and numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtmc.families import STUDY_DECISIONS, quantized_build_refusal

REPO = Path(__file__).resolve().parents[1]


def study_json(decision) -> dict:
    return json.loads((REPO / decision.report).with_name("study.json").read_text())


@pytest.mark.parametrize("decision", STUDY_DECISIONS, ids=lambda d: f"{d.family}-{d.precision}")
def test_each_committed_decision_is_the_one_its_study_report_made(decision):
    assert (REPO / decision.report).is_file()
    study = study_json(decision)
    assert study["family"] == decision.family and study["device"] == "cuda"
    made = next(d for d in study["decisions"] if d["precision"] == decision.precision)
    assert made["ships"] is decision.ships
    speedups = " / ".join(f"{made['speedup_vs_fp16'][b]:.2f}x" for b in ("1", "32", "128"))
    assert decision.summary.startswith(f"{speedups} the speed of fp16 at batch 1 / 32 / 128, {made['agreement']:.1%}")


def test_every_family_with_a_committed_study_decides_both_quantized_formats():
    decided = {(d.family, d.precision) for d in STUDY_DECISIONS}
    assert {f for f, _ in decided} == {"convnext", "ghostnet", "resnet", "vit"}
    assert decided == {(f, p) for f, _ in decided for p in ("fp8", "int8")}


def test_a_studied_family_refuses_a_quantized_build_with_its_numbers_and_report():
    reason = quantized_build_refusal("vit_base_patch16_224", "vit", "fp8")
    assert "decided that fp8 does not pay" in reason and "benchmarks/studies/vit_base_patch16_224/study.md" in reason
    assert "1.05x the speed of fp16" in reason and "build --precision fp16" in reason
