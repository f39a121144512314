"""The Inductor options of the compiled CUDA engine: chosen at build for the GPU it runs on, recorded with the engine,
and taken from that record when the engine loads (so a fresh process compiles as the build did, from the bundle's
caches), and how a load says whether those caches answered. Programmatic dependent launch itself runs on Hopper
GPUs only: whether it is faster is the GPU's to say (tools/autotune_probe.py's `pdl` variant, benchmarks/NOTES.md)."""

import logging

import numpy as np
import pytest
import torch

from trtmc.backends import inductor_lowerings
from trtmc.backends.inductor import describe_cache_use, graph_cache_counts
from trtmc.backends.inductor_lowerings import INDUCTOR_OPTIONS, PDL, compile_cuda, inductor_options, known_options
from trtmc.backends.torch_lowering import GraphModule
from trtmc.graph import Activation
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision


def _small_graph():
    rng = np.random.default_rng(3)
    g = GraphBuilder()
    x = g.input("pixels", (1, 3, 8, 8))
    y = g.activation(g.conv2d(x, "conv", rng.standard_normal((4, 3, 3, 3)) * 0.2, rng.standard_normal(4) * 0.1,
                              padding=1), Activation.RELU, "act")
    g.output(g.global_avg_pool(y, "pool"))
    return assign_precision(g.finish(), PrecisionPolicy("fp32"))


def test_no_inductor_option_is_taken_while_programmatic_launch_is_unmeasured():
    assert not inductor_lowerings.LAUNCH_DEPENDENTS_EARLY
    assert inductor_options((9, 0)) == {} and inductor_options((10, 0)) == {}


def test_programmatic_launch_once_taken_is_for_hopper_and_later_gpus_only(monkeypatch):
    monkeypatch.setattr(inductor_lowerings, "LAUNCH_DEPENDENTS_EARLY", True)
    assert inductor_options((9, 0)) == {PDL: True} and inductor_options((12, 0)) == {PDL: True}
    assert inductor_options((8, 9)) == {} and inductor_options((7, 5)) == {}


def test_an_option_this_torch_lacks_is_dropped_with_a_warning_that_names_it(caplog):
    with caplog.at_level(logging.WARNING, logger=inductor_lowerings.__name__):
        kept = known_options({"triton.no_such_option": True, "max_autotune": False})
    assert kept == {"max_autotune": False}
    assert "triton.no_such_option" in caplog.text


def test_the_engine_compiles_with_the_options_its_record_names_over_the_builds():
    graph = _small_graph()
    assert compile_cuda(graph).options == {}  # bundles from before the record compile with Inductor's defaults
    assert compile_cuda(graph, options={PDL: True}).options == {PDL: True}
    assert compile_cuda(graph, {INDUCTOR_OPTIONS: {}}, options={PDL: True}).options == {}
    assert compile_cuda(graph, {INDUCTOR_OPTIONS: {PDL: True}}).options == {PDL: True}


@pytest.mark.slow
def test_a_graph_compiled_with_programmatic_launch_answers_as_the_reference():
    # On the CPU Inductor takes the option and generates no launch code for it: what this checks is that the option
    # reaches torch.compile, which refuses options it does not know.
    graph = _small_graph()
    compiled = compile_cuda(graph, {INDUCTOR_OPTIONS: {PDL: True}})
    x = torch.rand((1, 3, 8, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), GraphModule(graph)(x))


def test_a_compile_is_counted_as_a_hit_or_a_miss_of_inductors_graph_cache():
    before = graph_cache_counts()
    assert describe_cache_use(before) == ""  # nothing compiled since
    with torch.no_grad():
        torch.compile(lambda x: torch.nn.functional.gelu(x) * 3, dynamic=False)(torch.rand(5))
    hits, misses = (now - then for now, then in zip(graph_cache_counts(), before))
    assert hits + misses == 1
    assert describe_cache_use(before) == f" (Inductor's graph cache: {hits} hits, {misses} misses)"
