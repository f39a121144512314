"""The mend for torch 2.11's Inductor, whose tiling check raised `CantSplit` without the arguments its class takes."""

from __future__ import annotations

import pytest

simd = pytest.importorskip("torch._inductor.codegen.simd")

from trtmc.backends.inductor_mends import mend_inductor  # noqa: E402


def _raise_bare(groups, lengths):
    raise simd.CantSplit  # as torch 2.11's `_split_iteration_ranges` does at one of its raise sites


def test_inductors_tiling_check_answers_no_fit_when_torch_raises_cant_split_without_arguments(monkeypatch):
    mend_inductor()
    monkeypatch.setattr(simd.SIMDKernel, "prepare_split_iteration_lengths",
                        classmethod(lambda cls, groups, lengths, reduction_numel=1: lengths))
    monkeypatch.setattr(simd.SIMDKernel, "_split_iteration_ranges", staticmethod(_raise_bare))
    assert simd.SIMDKernel.is_compatible([4], [[3]]) is False


def test_the_mended_cant_split_keeps_the_arguments_torch_gives_it():
    mend_inductor()
    mend_inductor()  # a second mend wraps nothing twice
    error = simd.CantSplit(12, 5)
    assert (error.expr, error.remaining) == (12, 5) and str(error) == "12 not divisible by 5"
    bare = simd.CantSplit()
    assert (bare.expr, bare.remaining) == (None, None)
