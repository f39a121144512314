"""`trtmc bench` on the CPU: the protocol, the oracle, unstable and wrong rows, output files, YAML validation.

Nothing here compiles: trtmc is benched through its reference engine, the uncompiled graph (the real
build, bundle, runtime and task run around it), torch.compile is the identity, and
the protocol tests feed scripted clocks. GPU speed is measured by running `trtmc bench` on the GPU machine.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from trtmc.bench import answers, baselines, oracle, report, runner, timing
from trtmc.bench.results import ENGINE, TASK, TRTMC, BenchResult
from trtmc.bench import prepare as prepare_phase
from trtmc.bench.prepare import prepare_entries
from trtmc.bench.runner import Target, answers_path, run_bench, run_entry
from trtmc.bench.sources import resolve_source
from trtmc.bench.spec import BenchOptions, Entry, SpecError, TimingProtocol, default_name, load_config, parse_config
from trtmc.bench.timing import TimedCall, Timing, spread, time_interleaved
from trtmc.checkpoint import Checkpoint
from trtmc.preprocess import PreprocessSpec
from trtmc.random_weights import calibrate_on_photos, load_timm_model, save_random_checkpoint, timm_pixels

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "examples" / "images"
PHOTOS = oracle.photo_files()
SMALL = {"pretrained_cfg_overlay": {"input_size": (3, 64, 64)}}  # a 64x64 regnetx_002: milliseconds per call
PROTOCOL = TimingProtocol()  # 3 warm-up rounds, 10 measured rounds, 5%, 20 ms
QUICK = TimingProtocol(warmups=1, iters=3)  # where the test is not about the protocol's counts


@pytest.fixture(autouse=True)
def one_thread():
    """The CPU numbers here are not measurements; one thread keeps a shared 2-core machine responsive."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- helpers ----


class Scripted:
    """A clock that calls the row once per round and reports the scripted ms per call, in turn, times
    the calls; it keeps what it was asked (`calls`)."""

    name = "scripted"
    on_host = False

    def __init__(self, *per_call_ms: float, log: list | None = None, key=None) -> None:
        self.times = list(per_call_ms)
        self.calls: list[int] = []
        self.log, self.key = log, key

    def __call__(self, fn, calls):
        fn()
        self.calls.append(calls)
        if self.log is not None:
            self.log.append(self.key)
        ms = self.times.pop(0) if len(self.times) > 1 else self.times[0]
        return ms * calls


def constant_clocks(ms_by_subject, unstable=()):
    """`clock_for` giving each subject a constant time; rows in `unstable` alternate 1x and 1.2x on every round."""

    def clock_for(subject, scope, batch, device):
        ms = ms_by_subject.get((subject, scope), ms_by_subject.get(subject, 1.0))
        if (subject, scope, batch) in unstable:
            return Scripted(*[ms, ms * 1.2] * 100)
        return Scripted(ms)

    return clock_for


FAST = constant_clocks({TRTMC: 1.0, "expert": 1.1, "eager-fp32": 2.0, "eager-cl": 1.02, "reduce-overhead": 0.5})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """regnetx_002 at 64x64 with random weights calibrated on the shipped photos, as the bench writes
    them (each photo has its own clear winner), in the Hugging Face layout."""
    drawn = save_random_checkpoint("regnetx_002", tmp_path_factory.mktemp("drawn") / "regnetx_002", **SMALL)
    return calibrate_on_photos(drawn, tmp_path_factory.mktemp("ckpt") / "regnetx_002", timm_pixels(drawn, PHOTOS))


@pytest.fixture(scope="module")
def few_photos(tmp_path_factory):
    """The first four shipped photos (classes 0 to 3 of `tiny`): the oracle's work, a fifth of the time."""
    folder = tmp_path_factory.mktemp("photos")
    for photo in PHOTOS[:4]:
        (folder / photo.name).symlink_to(photo)
    return folder


@pytest.fixture
def uncompiled(monkeypatch):
    """Bench options build the reference engine (trtmc's uncompiled graph: nothing compiles), and the
    engine's forward is observed: `uncompiled.wrap` post-processes its logits (a wrong engine),
    `uncompiled.calls` counts its calls."""
    from trtmc.backends.reference import ReferenceEngine

    class Fake:
        wrap = staticmethod(lambda logits: logits)
        calls = 0

    forward = ReferenceEngine._forward

    def observed(self, pixels):
        Fake.calls += 1
        return Fake.wrap(forward(self, pixels))

    monkeypatch.setattr(ReferenceEngine, "_forward", observed)
    return Fake


@pytest.fixture
def no_compile(monkeypatch):
    """torch.compile as the identity, so the compiled baselines' plumbing runs without compiling."""
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)


def tiny_entry(folder, photos=None, **changes):
    fields = dict(name="tiny", model=str(folder), precision="fp32", batch_sizes=(1, 2), protocol=QUICK, photos=photos)
    return Entry(**{**fields, **changes})


def options(tmp_path, baselines=("eager-fp32", "eager-cl")):
    return BenchOptions(workdir=tmp_path / "work", device="cpu", baselines=baselines, backend="reference")


def bench_result(entries, tmp_path, baselines=("eager-fp32", "eager-cl")):
    return BenchResult(runner.environment("cpu"), options(tmp_path, baselines), tuple(entries), "2026-01-01T00:00:00", 1.0)


def run_cli(*args):
    from trtmc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


# ---- the protocol ----


def test_warmup_rounds_calibrate_the_calls_per_round_to_last_at_least_round_ms():
    # 0.3 ms a call, but the first warm-up round is slow (a cold cache): the later rounds correct it.
    clock = Scripted(3.0, 0.3)
    outcome = time_interleaved({"row": TimedCall(lambda: None, clock)}, PROTOCOL)
    timing_ = outcome.timings["row"]
    assert clock.calls[:3] == [1, 7, 67]  # 20 ms / 3 ms -> 7 calls; 7 calls took 2.1 ms -> 67 calls
    assert clock.calls[3:] == [67] * 10 and timing_.calls_per_round == 67
    assert timing_.samples_ms == pytest.approx((0.3,) * 10) and timing_.clock == "scripted"


def test_rows_are_interleaved_round_by_round_after_their_warmups():
    log = []
    rows = {key: TimedCall(lambda: None, Scripted(1.0, log=log, key=key)) for key in ("trtmc", "expert", "eager")}
    outcome = time_interleaved(rows, PROTOCOL)
    assert log == ["trtmc", "expert", "eager"] * (3 + 10)
    assert all(t.attempts == 1 and len(t.samples_ms) == 10 for t in outcome.timings.values())


def test_row_spreading_beyond_the_margin_is_rerun_up_to_the_attempts_then_marked_unstable():
    jittery, attempts = [1.0] * 9 + [1.2], timing.MAX_ATTEMPTS
    steady, shaky = Scripted(1.0), Scripted(*([1.0] * 3 + jittery * attempts))
    outcome = time_interleaved({"steady": TimedCall(lambda: None, steady), "shaky": TimedCall(lambda: None, shaky)}, PROTOCOL)
    shaky_timing = outcome.timings["shaky"]
    assert len(shaky.calls) == 3 + attempts * 10 and len(steady.calls) == 3 + 10  # only the unstable row is re-run
    assert shaky_timing.attempts == attempts and not shaky_timing.stable and shaky_timing.spread == pytest.approx(0.2)
    assert [list(a) for a in shaky_timing.discarded_ms] == [pytest.approx(jittery)] * (attempts - 1)
    assert outcome.timings["steady"].stable


def test_unstable_row_that_settles_on_its_rerun_is_a_result():
    clock = Scripted(*([1.0] * 3 + [1.0] * 9 + [3.0] + [2.0] * 10))
    timing_ = time_interleaved({"row": TimedCall(lambda: None, clock)}, PROTOCOL).timings["row"]
    assert timing_.stable and timing_.attempts == 2
    assert timing_.median_ms == pytest.approx(2.0)  # the re-run's samples, not a mix
    assert len(timing_.discarded_ms) == 1 and timing_.discarded_ms[0][-1] == pytest.approx(3.0)


def test_a_row_settling_only_on_its_third_attempt_is_a_result_with_both_earlier_attempts_kept():
    clock = Scripted(*([1.0] * 3 + ([1.0] * 9 + [3.0]) * 2 + [2.0] * 10))
    timing_ = time_interleaved({"row": TimedCall(lambda: None, clock)}, PROTOCOL).timings["row"]
    assert timing_.stable and timing_.attempts == 3 and timing_.median_ms == pytest.approx(2.0)
    assert [a[-1] for a in timing_.discarded_ms] == pytest.approx([3.0, 3.0])


def test_a_row_that_raises_is_dropped_and_the_others_are_timed():
    def broken():
        raise RuntimeError("capture failed")

    outcome = time_interleaved({"ok": TimedCall(lambda: None, Scripted(1.0)), "broken": TimedCall(broken, Scripted(1.0))}, QUICK)
    assert outcome.errors == {"broken": "RuntimeError: capture failed"}
    assert set(outcome.timings) == {"ok"}


def test_garbage_collection_is_paused_during_the_rounds_only():
    import gc

    seen = []
    time_interleaved({"row": TimedCall(lambda: seen.append(gc.isenabled()), Scripted(1.0))}, QUICK)
    assert seen == [False] * (1 + 3) and gc.isenabled()


def test_spread_is_the_largest_distance_from_the_median_as_a_fraction_of_it():
    assert spread([1.0] * 9 + [1.05]) == pytest.approx(0.05)
    assert Timing((1.0,) * 9 + (1.05,), 1, margin=0.05, clock="c").stable
    assert not Timing((1.0,) * 9 + (1.06,), 1, margin=0.05, clock="c").stable
    assert not Timing((1.0,) * 9 + (0.94,), 1, margin=0.05, clock="c").stable


def test_protocol_text_states_the_numbers_that_run():
    text = timing.describe(TimingProtocol(warmups=2, iters=7, margin=0.1, round_ms=30))
    for phrase in ("2 warm-up rounds", "at least 30 ms", "7 measured rounds", "further than 10%", "interleaved"):
        assert phrase in text


class HostScripted(Scripted):
    """A scripted clock that says it times on the host."""

    on_host = True


class ScriptedHost(timing.HostSpeed):
    """A HostSpeed whose probes take the scripted seconds in turn, on a clock that each probe advances by 1 s."""

    def __init__(self, *probe_seconds: float) -> None:
        self.now, self.seconds = 0.0, list(probe_seconds)
        super().__init__(probe=self._next, clock=lambda: self.now)

    def _next(self) -> float:
        self.now += 1.0
        return self.seconds.pop(0) if len(self.seconds) > 1 else self.seconds[0]


def test_rows_timed_on_the_host_get_rounds_of_host_round_ms_and_the_others_of_round_ms():
    gpu, host = Scripted(1.0), HostScripted(1.0)
    protocol = TimingProtocol(round_ms=20, host_round_ms=100)
    outcome = time_interleaved({"engine": TimedCall(lambda: None, gpu), "task": TimedCall(lambda: None, host)}, protocol)
    assert outcome.timings["engine"].calls_per_round == 20 and outcome.timings["task"].calls_per_round == 100


def test_host_speed_is_the_quickest_probe_of_its_window_over_the_latest():
    host = ScriptedHost(1.0, 1.8, 1.25)
    assert host.probe() == 1.0 and host.speed() == pytest.approx(1.0 / 1.8) and host.speed() == pytest.approx(0.8)


def test_host_speed_forgets_a_lucky_probe_after_its_window():
    host = ScriptedHost(*([0.5] + [1.0] * 70))
    speeds = [host.speed() for _ in range(70)]
    assert speeds[0] == 1.0 and speeds[58] == pytest.approx(0.5)  # the lucky probe at 1 s is still in the window at 60 s
    assert speeds[-1] == pytest.approx(1.0) and host.fastest == pytest.approx(1.0)  # and forgotten after


def test_the_host_speed_is_recorded_after_each_attempt_at_host_rows_only():
    # The host row spreads 20% on every attempt, so it gets every attempt; the host runs at half its best.
    jittery = [1.0] * 9 + [1.2]
    rows = {"engine": TimedCall(lambda: None, Scripted(1.0)),
            "task": TimedCall(lambda: None, HostScripted(*([1.0] * 3 + jittery * timing.MAX_HOST_ATTEMPTS)))}
    outcome = time_interleaved(rows, PROTOCOL, ScriptedHost(1.0, 2.0))
    task, engine = outcome.timings["task"], outcome.timings["engine"]
    attempts = timing.MAX_HOST_ATTEMPTS
    assert task.attempts == attempts and task.host_speed == pytest.approx([1.0] + [0.5] * (attempts - 1))
    assert engine.host_speed == ()  # a row timed on the GPU does not follow the host


def test_a_row_timed_on_the_host_gets_fewer_attempts_than_one_timed_on_the_device():
    jittery = [1.0] * 9 + [1.2]
    device, hosted = Scripted(*([1.0] * 3 + jittery * 8)), HostScripted(*([1.0] * 3 + jittery * 8))
    outcome = time_interleaved({"engine": TimedCall(lambda: None, device), "task": TimedCall(lambda: None, hosted)},
                               PROTOCOL)
    assert timing.MAX_HOST_ATTEMPTS < timing.MAX_ATTEMPTS
    assert outcome.timings["task"].attempts == timing.MAX_HOST_ATTEMPTS and not outcome.timings["task"].stable
    assert outcome.timings["engine"].attempts == timing.MAX_ATTEMPTS
    assert len(hosted.calls) == 3 + timing.MAX_HOST_ATTEMPTS * 10 and len(device.calls) == 3 + timing.MAX_ATTEMPTS * 10


def test_without_a_host_probe_nothing_is_recorded():
    rows = {"task": TimedCall(lambda: None, HostScripted(1.0))}
    assert time_interleaved(rows, PROTOCOL).timings["task"].host_speed == ()


def test_the_real_host_probe_runs_a_loop_of_about_a_millisecond():
    host = timing.HostSpeed()
    seconds = host.probe()
    assert 0 < seconds < 0.05 and host.fastest == seconds and 0 < host.speed() <= 1.0 + 1e-9


def test_host_clock_times_every_call_of_the_round():
    calls = []
    ms = timing.HostClock("cpu")(lambda: calls.append(1), 5)
    assert len(calls) == 5 and ms >= 0


# ---- the oracle ----


def logits_with_top(*tops, classes=10, size=1.0):
    """One row per photo: classes in `tops` order score 10, 9, 8, ...; the rest below."""
    rows = []
    for top in tops:
        row = torch.linspace(0, 1, classes) * size
        for rank, c in enumerate(top):
            row[c] = (10 - rank) * size
        rows.append(row)
    return torch.stack(rows)


def reference_of(logits):
    return oracle.Reference(tuple(f"p{i}.jpg" for i in range(len(logits))), logits.double())


def test_oracle_compares_the_top1_class_and_the_top5_set_on_every_photo():
    ref = reference_of(logits_with_top((0, 1, 2, 3, 4), (5, 6, 7, 8, 9)))
    same_set_other_order = logits_with_top((0, 2, 1, 4, 3), (5, 9, 8, 7, 6))
    assert oracle.judge(same_set_other_order, ref, 1e-6).right
    other_fifth = logits_with_top((0, 1, 2, 3, 9), (5, 6, 7, 8, 9))
    verdict = oracle.judge(other_fifth, ref, 1e-3)
    assert not verdict.right and verdict.wrong_photos == 1
    assert verdict.mismatches[0].describe() == "p0.jpg: top-5 set {0, 1, 2, 3, 9} where timm's is {0, 1, 2, 3, 4}"
    other_winner = logits_with_top((1, 0, 2, 3, 4), (5, 6, 7, 8, 9))
    assert oracle.judge(other_winner, ref, 1e-3).mismatches[0].k == 1


def test_oracle_lets_a_near_tie_change_places_within_the_tolerance():
    ref = logits_with_top((0, 1, 2, 3, 4))
    ref[0, 7] = 5.6  # timm's 6th class trails its 5th (6.0) by 0.04 of the largest logit (10)
    swapped = logits_with_top((0, 1, 2, 3, 7))
    assert oracle.judge(swapped, reference_of(ref), 0.03).mismatches
    assert oracle.judge(swapped, reference_of(ref), 0.05).right


def test_a_swap_that_timms_own_precision_makes_is_a_tie_and_a_larger_one_is_not():
    ref = logits_with_top((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))
    ref[0, 7] = 5.6  # timm's 6th class trails its 5th (6.0) by 0.04 of the largest logit (10)
    swapped = logits_with_top((0, 1, 2, 3, 7), (5, 6, 7, 8, 9))
    timm_low = ref.clone()
    timm_low[0, 0] += 0.25  # timm's own low-precision model strays by 0.25 on photo 0
    noisy = reference_of(ref).with_noise(timm_low)
    assert float(noisy.noise[0]) == 0.25 and float(noisy.noise[1]) == 0.0
    assert oracle.judge(swapped, noisy, 0.01).right  # 0.4 apart: within 0.01 x 10 + 2 x 0.25
    timm_low[0, 0] = ref[0, 0] + 0.1
    assert oracle.judge(swapped, reference_of(ref).with_noise(timm_low), 0.01).mismatches  # beyond 0.1 + 2 x 0.1
    assert reference_of(ref).with_noise(timm_low).to_json()["noise"]["p0.jpg"] == 0.01


def test_oracle_reports_non_finite_logits():
    ref = reference_of(logits_with_top((0, 1, 2, 3, 4), (5, 6, 7, 8, 9)))
    ours = ref.logits.clone()
    ours[1, 3] = float("nan")
    verdict = oracle.judge(ours, ref, 0.01)
    assert verdict.non_finite == ("p1.jpg",) and "non-finite logits on p1.jpg" in verdict.describe()


def test_oracle_runs_in_chunks_of_the_batch_size_padding_the_last():
    seen = []

    def run(chunk):
        seen.append(len(chunk))
        return chunk.sum(dim=(1, 2, 3))[:, None]

    out = oracle.in_chunks(run, torch.ones(5, 1, 2, 2), 2, pad=True)
    assert seen == [2, 2, 2] and out.shape == (5, 1) and bool((out == 4).all())
    assert oracle.in_chunks(lambda c: np.ones((len(c), 3), np.float32), [1, 2, 3], 2, pad=False).shape == (3, 3)


def test_the_oracle_judges_every_shipped_photo():
    assert len(PHOTOS) == 22 and PHOTOS[0].parent == IMAGES


# ---- entries end to end (real build, bundle, runtime and task; compiler replaced) ----


def test_entry_times_both_scopes_and_every_baseline_interleaved_and_judges_each_row(tiny, tmp_path, uncompiled, no_compile):
    opts = options(tmp_path, baselines=("expert", "eager-fp32", "eager-cl", "reduce-overhead"))
    result = run_entry(tiny_entry(tiny, protocol=PROTOCOL, batch_sizes=(1, 4)), opts, clock_for=FAST)
    assert result.status == "passed", result.message
    assert result.architecture == "regnetx_002" and result.engine_key == "reference-cpu-fp32"
    assert result.build_seconds > 0 and result.bundle_bytes > 0
    assert [(r.subject, r.scope, r.batch) for r in result.rows] == [
        (TRTMC, ENGINE, 1), (TRTMC, TASK, 1), (TRTMC, ENGINE, 4), (TRTMC, TASK, 4),
        ("expert", ENGINE, 1), ("expert", ENGINE, 4), ("eager-fp32", ENGINE, 1), ("eager-fp32", ENGINE, 4),
        ("eager-cl", ENGINE, 1), ("eager-cl", ENGINE, 4), ("reduce-overhead", ENGINE, 1), ("reduce-overhead", ENGINE, 4),
    ]
    for row in result.rows:
        assert row.status == "ok" and len(row.timing.samples_ms) == 10 and row.first_call_s is not None
        assert row.verdict.right and row.verdict.photos == 22
    # 1 ms a call, rounds of 20 ms
    assert result.row(TRTMC, ENGINE, 1).timing.calls_per_round == 20
    # Per trtmc row: a first call, 3 warm-up and 10 measured rounds (the scripted clock calls once a
    # round), then the oracle's 22 photos in chunks of the batch size; the task calls the engine too.
    # Before all of it, the engine's warm-up calls it once at each size it serves (1 and 2).
    assert uncompiled.calls == 2 + 2 * (14 + 22) + 2 * (14 + 6)
    assert result.headline(1) == pytest.approx(1.1) and result.verdict(result.headline(1)) == "faster"
    # The oracle measured how far timm itself strays on each photo (here fp32 on the CPU: the same model)
    assert result.reference.noise is not None and result.reference.noise.shape == (22,)
    assert result.ratio("eager-fp32", 1) == pytest.approx(2.0)
    assert result.verdict(result.ratio("eager-cl", 4)) == "on par"  # 1.02 is within the 5% margin
    assert result.verdict(result.ratio("reduce-overhead", 4)) == "slower"


def test_engine_with_shuffled_logits_fails_the_entry_whatever_its_speed(tiny, few_photos, tmp_path, uncompiled):
    uncompiled.wrap = staticmethod(lambda logits: torch.roll(logits, 1, dims=-1))
    clocks = constant_clocks({TRTMC: 0.001, "eager-fp32": 10.0, "eager-cl": 10.0})
    result = run_entry(tiny_entry(tiny, few_photos), options(tmp_path), clock_for=clocks)
    assert result.status == "failed"
    # photo 0's class is 0 (the weights are calibrated so): rolled logits put it at 1
    assert "trtmc engine batch 1: wrong on 4 of 4 photos (chelsea.png: top-1 class 1 where timm's is 0" in result.message
    assert {(r.scope, r.batch) for r in result.rows if r.status == "wrong"} == {(ENGINE, 1), (ENGINE, 2), (TASK, 1), (TASK, 2)}
    assert result.ratio("eager-fp32", 1) is None  # no speed-up is reported for a wrong answer
    markdown = report.to_markdown(bench_result([result], tmp_path))
    assert "**WRONG** engine 4/4, task 4/4" in markdown
    assert "— (10.00 ms)" in markdown and "10000.00×" not in markdown and "**10000" not in markdown


def test_a_wrong_task_scope_fails_the_entry_even_when_the_engine_is_right(tiny, few_photos, tmp_path):
    target = right_engine_target(tiny, rolled_task=True)
    result = run_entry(tiny_entry(tiny, few_photos), options(tmp_path, baselines=()), prepare=lambda *a: target, clock_for=FAST)
    assert result.status == "failed" and "trtmc task batch 1: wrong on 4 of 4 photos" in result.message
    assert result.row(TRTMC, ENGINE, 1).status == "ok" and result.row(TRTMC, TASK, 1).status == "wrong"


def right_engine_target(folder, *, rolled_task=False, batch_sizes=None):
    """A Target around trtmc's uncompiled graph; with `rolled_task` its task shifts every logit by one class."""
    from trtmc.backends.torch_lowering import GraphModule
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph
    from trtmc.preprocess import PreprocessSpec

    checkpoint = Checkpoint(folder)
    module = GraphModule(build_graph(checkpoint)[1]).eval()
    spec = PreprocessSpec.from_pretrained(checkpoint.config.pretrained)

    def task(images):
        logits = module(torch.stack([spec.from_array(image) for image in images])).numpy()
        return np.roll(logits, 1, axis=-1) if rolled_task else logits

    return Target(engine=module, task=task, preprocess=spec, device="cpu", batch_sizes=batch_sizes)


def test_a_baseline_that_answers_wrong_is_reported_wrong_without_a_ratio(tiny, few_photos, tmp_path, uncompiled, monkeypatch):
    make = baselines.make_baseline

    def make_wrong_eager_cl(key, model, precision, device):
        baseline = make(key, model, precision, device)
        if key != "eager-cl":
            return baseline
        return replace(baseline, forward=lambda x, f=baseline.forward: torch.roll(f(x), 1, dims=-1))

    monkeypatch.setattr(runner, "make_baseline", make_wrong_eager_cl)
    result = run_entry(tiny_entry(tiny, few_photos), options(tmp_path), clock_for=FAST)
    assert result.status == "passed"  # a wrong baseline does not fail trtmc's entry
    assert result.row("eager-cl", ENGINE, 1).status == "wrong" and result.ratio("eager-cl", 1) is None
    assert result.ratio("eager-fp32", 1) == pytest.approx(2.0)
    markdown = report.to_markdown(bench_result([result], tmp_path))
    assert "**wrong** on 4/4 photos" in markdown
    assert "timm eager fp32 CL batch 1 answers wrong: wrong on 4 of 4 photos" in markdown
    assert report.to_json(bench_result([result], tmp_path))["summary"]["wrong_rows"] == 2


def test_non_finite_logits_fail_the_entry(tiny, few_photos, tmp_path, uncompiled):
    uncompiled.wrap = staticmethod(lambda logits: logits.index_fill(-1, torch.tensor([7]), float("nan")))
    result = run_entry(tiny_entry(tiny, few_photos, batch_sizes=(1,)), options(tmp_path, baselines=()), clock_for=FAST)
    assert result.status == "failed" and "non-finite logits on" in result.message


def test_an_entry_records_what_the_cpus_did_while_its_rows_were_timed(tiny, few_photos, tmp_path, uncompiled):
    result = run_entry(tiny_entry(tiny, few_photos, batch_sizes=(1,)), options(tmp_path, baselines=()), clock_for=FAST)
    host = result.host
    assert host is not None and host.seconds > 0 and 0 <= host.others <= host.busy <= 1 and 0 <= host.steal <= 1
    assert report.entry_to_json(result)["host"]["busy"] == pytest.approx(host.busy, abs=1e-4)
    assert "others" in report.to_markdown(bench_result([result], tmp_path, baselines=()))


def test_unstable_trtmc_row_is_rerun_then_shown_unstable_not_as_a_result(tiny, few_photos, tmp_path, uncompiled):
    clocks = constant_clocks({TRTMC: 1.0, "eager-fp32": 2.0}, unstable={(TRTMC, ENGINE, 2)})
    result = run_entry(tiny_entry(tiny, few_photos), options(tmp_path, baselines=("eager-fp32",)), clock_for=clocks)
    assert result.status == "passed"  # the answer was right; the row just is not a result
    row = result.row(TRTMC, ENGINE, 2)
    assert row.status == "unstable" and row.timing.attempts == timing.MAX_ATTEMPTS and row.median_ms is None
    assert result.ratio("eager-fp32", 2) is None and result.ratio("eager-fp32", 1) == pytest.approx(2.0)
    bench = bench_result([result], tmp_path, baselines=("eager-fp32",))
    assert "unstable (±" in report.to_markdown(bench)
    row_json = next(r for r in report.to_json(bench)["entries"][0]["rows"] if r["scope"] == "engine" and r["batch"] == 2)
    assert row_json["status"] == "unstable" and row_json["median_ms"] is None and [len(a) for a in row_json["timing"]["discarded_ms"]] == [3] * (timing.MAX_ATTEMPTS - 1)
    assert report.to_json(bench)["summary"]["unstable_rows"] == 1


def test_engine_missing_a_batch_size_is_an_error_of_that_row(tiny, few_photos, tmp_path):
    target = right_engine_target(tiny, batch_sizes=(1,))
    result = run_entry(tiny_entry(tiny, few_photos), options(tmp_path, baselines=()), prepare=lambda *a: target, clock_for=FAST)
    assert result.status == "error"  # a trtmc row that cannot run is the entry's error
    assert result.row(TRTMC, ENGINE, 2).error == "the engine is compiled for batch sizes [1], not 2"
    assert result.row(TRTMC, TASK, 2).status == "ok"


def test_unsupported_architecture_is_reported_without_building(tmp_path, uncompiled):
    folder = tmp_path / "alien"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "alien_net", "num_classes": 10}))
    (folder / "model.safetensors").write_bytes(b"")
    result = run_entry(tiny_entry(folder), options(tmp_path), clock_for=FAST)
    assert result.status == "unsupported" and "'alien_net' is not supported" in result.message
    assert not (tmp_path / "work" / "bundles").exists()


def test_results_json_markdown_and_plot_are_written_with_the_expert_as_headline(tiny, few_photos, tmp_path, uncompiled, no_compile):
    bench = run_bench([tiny_entry(tiny, few_photos)], options(tmp_path, ("expert", "eager-fp32", "eager-cl")), clock_for=FAST)
    written = report.write_results(bench, tmp_path / "out")
    data = json.loads(written["json"].read_text())
    entry = data["entries"][0]
    assert data["summary"]["passed"] == 1 and data["summary"]["headline"] == {"tiny": {"1": 1.1, "2": 1.1}}
    assert entry["headline"] == {"1": 1.1, "2": 1.1} and entry["speedup"]["eager-fp32"] == {"1": 2.0, "2": 2.0}
    assert entry["oracle"]["photos"] == 4 and entry["oracle"]["top5"]["chelsea.png"][0] == 0
    assert {r["scope"] for r in entry["rows"]} == {"engine", "task"}
    assert all(r["oracle"]["right"] and r["timing"]["calls_per_round"] >= 1 for r in entry["rows"])
    markdown = written["markdown"].read_text()
    headline = markdown.split("## Headline")[1].split("##")[0]
    assert "| tiny | fp32 | 1 | right 4/4 | 1.000 ms | 1.100 ms | **1.10×** |" in headline
    assert "**2.00×** (2.000 ms)" in markdown and "1.02× ≈ (1.020 ms)" in markdown and "## Builds" in markdown
    # the protocol paragraph is the code's own description of what ran
    assert timing.describe(QUICK) in markdown and oracle.describe(str(few_photos), 4) in markdown
    assert written["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    partial = report.write_results(bench, tmp_path / "partial", draw=False)  # a run's report after each entry
    assert set(partial) == {"json", "markdown"} and not (tmp_path / "partial" / report.PLOT_PNG).exists()


def test_prepare_phase_runs_in_workers_and_the_timing_reuses_its_bundles(tiny, few_photos, tmp_path, uncompiled, no_compile):
    opts = options(tmp_path, baselines=("expert",))
    messages = []
    entry = tiny_entry(tiny, few_photos)
    failures = prepare_entries([entry], opts, 1, messages.append, quiet=True, executor=ThreadPoolExecutor(1))
    assert failures == {} and any(m.startswith("prepared tiny") for m in messages)
    assert (tmp_path / "work" / "bundles" / "tiny-fp32-reference.build.json").is_file()
    result = run_entry(entry, replace(opts, reuse_bundles=True), clock_for=FAST, progress=messages.append)
    assert result.status == "passed" and any(m.startswith("using the prepared bundle") for m in messages)


def test_the_timing_takes_timm_answers_the_prepare_left_only_for_the_same_weights_and_photos(
        tiny, few_photos, tmp_path, uncompiled, no_compile):
    opts = replace(options(tmp_path, baselines=()), reuse_bundles=True)
    entry = tiny_entry(tiny, few_photos)
    assert prepare_entries([entry], opts, 1, quiet=True, executor=ThreadPoolExecutor(1)) == {}
    left = answers.TimmAnswers.load(answers_path(opts, entry))
    files, preprocess = oracle.photo_files(few_photos), PreprocessSpec.from_pretrained(Checkpoint(tiny).config.pretrained)
    assert left is not None and left.answers_for(tiny, files, preprocess)
    assert not left.answers_for(tiny, files[1:], preprocess)
    computed = answers.compute(load_timm_model(tiny), tiny, runner.Photos.load(files, tiny, preprocess), preprocess)
    assert torch.allclose(left.reference, computed.reference) and torch.allclose(left.on_array_pixels, computed.on_array_pixels)
    taken = "timm fp32's answers on the photos from the prepare phase"
    messages = []
    assert run_entry(entry, opts, clock_for=FAST, progress=messages.append).status == "passed" and taken in messages
    replace(left, photos=("another.jpg",) + left.photos[1:]).save(answers_path(opts, entry))  # another photo set's
    messages.clear()
    assert run_entry(entry, opts, clock_for=FAST, progress=messages.append).status == "passed" and taken not in messages


def test_a_prepare_phase_cut_short_is_taken_up_where_it_stopped(tiny, few_photos, tmp_path, uncompiled, no_compile):
    opts = replace(options(tmp_path, baselines=("expert",)), reuse_bundles=True)
    done, left = tiny_entry(tiny, few_photos), tiny_entry(tiny, few_photos, name="tiny2")
    assert prepare_entries([done], opts, 1, quiet=True, executor=ThreadPoolExecutor(1)) == {}
    messages = []
    assert prepare_entries([done, left], opts, 1, messages.append, quiet=True, executor=ThreadPoolExecutor(1)) == {}
    assert "already prepared: tiny" in messages and "preparing 1 entries (build and baselines in processes of their own), 1 at a time" in messages
    assert [m for m in messages if m.startswith("prepared ")] == [m for m in messages if m.startswith("prepared tiny2 ")]
    # another set of compiled baselines is another preparation
    assert not prepare_phase.is_prepared(done, replace(opts, baselines=("expert", "reduce-overhead")))


def test_an_entry_failing_its_prepare_is_not_prepared_again_and_its_error_is_noted(few_photos, tmp_path):
    opts = replace(options(tmp_path, baselines=("expert",)), reuse_bundles=True)
    broken = tiny_entry(tmp_path / "no-such-checkpoint", few_photos, name="broken", weights="random", model="not_a_timm_model")
    failures = prepare_entries([broken], opts, 1, quiet=True, executor=ThreadPoolExecutor(1))
    assert set(failures) == {"broken"} and prepare_phase.is_prepared(broken, opts)
    assert "not_a_timm_model" in json.loads((tmp_path / "work" / "prepared" / "broken.json").read_text())["error"]


def test_the_timed_run_compiles_in_its_own_process_without_a_pool_of_compile_workers(tiny, few_photos, tmp_path, monkeypatch):
    import torch._inductor.config as inductor_config

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    seen = []

    def prepare(*args):
        seen.append(inductor_config.compile_threads)
        return right_engine_target(tiny)

    before = inductor_config.compile_threads
    run_bench([tiny_entry(tiny, few_photos, batch_sizes=(1,))], options(tmp_path, baselines=()), prepare=prepare, clock_for=FAST)
    assert seen == [1] and inductor_config.compile_threads == before


def test_resumed_run_takes_finished_entries_from_their_records_and_times_only_the_rest(tiny, few_photos, tmp_path, uncompiled):
    opts = options(tmp_path, baselines=("eager-fp32",))
    first, second = tiny_entry(tiny, few_photos), tiny_entry(tiny, few_photos, name="tiny2")
    earlier = run_bench([first], opts, clock_for=FAST)
    calls_before = uncompiled.calls
    partials = []  # what a partial report sees: once per entry timed here, none for the resumed one
    resumed = run_bench([first, second], replace(opts, resume=True), clock_for=FAST, on_result=partials.append)
    assert [[e.entry.name for e in partial.entries] for partial in partials] == [["tiny", "tiny2"]]
    assert report.entry_to_json(resumed.entries[0]) == report.entry_to_json(earlier.entries[0])
    assert resumed.resumed == {"tiny": earlier.started}
    assert resumed.entries[1].status == "passed" and uncompiled.calls > calls_before  # only tiny2 was timed
    markdown = report.to_markdown(resumed)
    assert "1 of 2 entries come from earlier runs in the same work folder" in markdown and f"tiny ({earlier.started})" in markdown
    calls_before = uncompiled.calls
    again = run_bench([first, second], replace(opts, resume=True), clock_for=FAST)
    assert set(again.resumed) == {"tiny", "tiny2"} and uncompiled.calls == calls_before  # nothing timed


def test_a_report_from_records_alone_is_the_report_of_the_runs_that_timed_them(tiny, few_photos, tmp_path, uncompiled):
    opts = options(tmp_path, baselines=("eager-fp32",))
    first, second = tiny_entry(tiny, few_photos), tiny_entry(tiny, few_photos, name="tiny2")
    timed = run_bench([first, second], opts, clock_for=FAST)
    calls_before = uncompiled.calls
    recorded = runner.recorded_result([first, second], opts.workdir)
    assert uncompiled.calls == calls_before  # nothing timed or judged again
    assert report.to_json(recorded)["entries"] == report.to_json(timed)["entries"]
    assert recorded.environment == timed.environment and recorded.options.baselines == ("eager-fp32",)
    assert recorded.resumed == {"tiny": timed.started, "tiny2": timed.started}
    with pytest.raises(ValueError, match="tiny3 has no record"):
        runner.recorded_result([first, tiny_entry(tiny, few_photos, name="tiny3")], opts.workdir)
    # A bench cut short reports the entries it has records for (tools/bench_report.py --partial).
    untimed = tiny_entry(tiny, few_photos, name="tiny3")
    assert runner.recorded_entries([untimed, second, first], opts.workdir) == [second, first]
    with pytest.raises(ValueError, match="another definition of the entry"):
        runner.recorded_result([replace(first, batch_sizes=(1,))], opts.workdir)
    run_bench([second], replace(opts, baselines=("eager-cl",)), clock_for=FAST)  # tiny2 timed again, otherwise
    with pytest.raises(ValueError, match=r"records differ in options \(tiny2 against tiny\)"):
        runner.recorded_result([first, second], opts.workdir)


def test_resume_times_again_an_entry_whose_settings_or_baselines_changed(tiny, few_photos, tmp_path, uncompiled):
    opts = options(tmp_path, baselines=("eager-fp32",))
    entry = tiny_entry(tiny, few_photos)
    run_bench([entry], opts, clock_for=FAST)
    changed_batches = run_bench([replace(entry, batch_sizes=(1,))], replace(opts, resume=True), clock_for=FAST)
    assert changed_batches.resumed == {}
    other_baselines = run_bench([entry], replace(opts, resume=True, baselines=("eager-cl",)), clock_for=FAST)
    assert other_baselines.resumed == {} and other_baselines.entries[0].subjects() == [TRTMC, "eager-cl"]
    assert run_bench([entry], opts, clock_for=FAST).resumed == {}  # without --resume, every entry is timed


def test_resume_times_again_an_entry_that_other_code_timed(tiny, few_photos, tmp_path, uncompiled, monkeypatch):
    from trtmc.bench import runner

    opts = options(tmp_path, baselines=("eager-fp32",))
    entry = tiny_entry(tiny, few_photos)
    earlier = run_bench([entry], opts, clock_for=FAST)
    assert earlier.environment["trtmc_source"] == runner.source_digest()
    assert f"(source {runner.source_digest()})" in report.to_markdown(earlier)  # the report names the code
    monkeypatch.setattr(runner, "source_digest", lambda: "0123456789abcdef")  # as if trtmc's files had changed
    assert run_bench([entry], replace(opts, resume=True), clock_for=FAST).resumed == {}


def test_the_source_digest_reads_code_not_comments_so_a_corrected_comment_keeps_the_records():
    before = 'x = 1  # one\n\n\ndef f():\n    return "#not a comment"\n'
    commented = '# a new note\nx = 1  # one, corrected\n\ndef f():\n    # why\n    return "#not a comment"   \n'
    assert runner.code_text(before) == runner.code_text(commented)
    assert runner.code_text(before) != runner.code_text(before.replace("x = 1", "x = 2"))
    assert runner.code_text(before) != runner.code_text(before.replace("#not", "#no"))  # a hash in a string is code


def _rewrite_record(workdir, name: str, **environment) -> None:
    import pickle

    path = Path(workdir) / runner.RECORDS / f"{name}.pickle"
    record = pickle.loads(path.read_bytes())
    record["environment"] = {**record["environment"], **environment}
    path.write_bytes(pickle.dumps(record))


def test_resume_takes_a_record_from_another_host_kernel_of_the_same_machine_and_versions(tiny, few_photos, tmp_path,
                                                                                          uncompiled):
    # The lent GPU machines' host kernel changed between two sessions (run 31); any other difference times again.
    opts = options(tmp_path, baselines=("eager-fp32",))
    first, second = tiny_entry(tiny, few_photos), tiny_entry(tiny, few_photos, name="tiny2")
    earlier = run_bench([first, second], opts, clock_for=FAST)
    _rewrite_record(opts.workdir, "tiny", host_kernel="6.18.44-older")
    resumed = run_bench([first], replace(opts, resume=True), clock_for=FAST)
    both = ", ".join(sorted({"6.18.44-older", earlier.environment["host_kernel"]}))
    assert resumed.resumed == {"tiny": earlier.started} and resumed.environment["host_kernel"] == both
    assert runner.recorded_result([first, second], opts.workdir).environment["host_kernel"] == both
    _rewrite_record(opts.workdir, "tiny", torch="0.0.1")
    assert run_bench([first], replace(opts, resume=True), clock_for=FAST).resumed == {}
    _rewrite_record(opts.workdir, "tiny2", os="Windows")
    with pytest.raises(ValueError, match=r"records differ in environment \(tiny2 against tiny\)"):
        runner.recorded_result([first, second], opts.workdir)


def test_cli_benches_one_model_on_the_cpu(tiny, few_photos, tmp_path, uncompiled):
    code, out, err = run_cli(
        "bench", "--device", "cpu", "--model", tiny, "--precision", "fp32", "--batch", "1", "--batch", "2", "--photos", few_photos,
        "--baseline", "eager-fp32", "--warmups", "1", "--iters", "3", "--round-ms", "1", "--host-round-ms", "2",
        "--backend", "reference", "--out", tmp_path / "out",
    )
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["entries"][0]["status"] == "passed" and code == 0, err
    assert data["entries"][0]["protocol"] == {"warmups": 1, "iters": 3, "margin": 0.05, "round_ms": 1.0,
                                              "host_round_ms": 2.0}
    task = next(r for r in data["entries"][0]["rows"] if r["scope"] == "task")  # timed on the host: probed after
    assert len(task["timing"]["host_speed"]) == task["timing"]["attempts"]
    assert all(0 < s <= 1.0 for s in task["timing"]["host_speed"])
    assert (tmp_path / "out" / "results.md").is_file() and (tmp_path / "out" / "latency.png").is_file()
    assert "[1/1 regnetx_002] building (fp32, cpu, max batch 2)" in err  # progress on stderr
    assert re.search(r"trtmc fp32 engine, batch 1: [0-9.]+ ms \(spread [0-9.]+%, \d+ calls per round", err)
    assert "regnetx_002                  passed" in out


def test_bench_help_explains_scopes_protocol_baselines_oracle_and_the_extra():
    code, out, _ = run_cli("bench", "--help")
    assert code == 0
    for phrase in ("engine scope", "task scope", "expert", "reduce-overhead", "--max-autotune", "--random-weights",
                   "unstable", "warm-up rounds", "22 photos", "top-5 set", "pip install 'trtmc[bench]'"):
        assert phrase in out, phrase


def test_bench_without_timm_says_how_to_install_it(tiny, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` now raises ImportError
    code, _, err = run_cli("bench", "--device", "cpu", "--model", tiny, "--out", tmp_path / "out")
    assert code == 1 and "trtmc bench needs timm" in err and "pip install 'trtmc[bench]'" in err


def test_expert_baseline_is_the_default_mode_compile_of_the_channels_last_model(monkeypatch):
    from timm import create_model

    compiled = {}
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: compiled.update(kwargs) or model)
    model = create_model("regnetx_002", pretrained=False, **SMALL).eval()
    expert = baselines.make_baseline("expert", model, "bf16", "cpu")
    assert compiled == {"mode": "default", "dynamic": False}
    assert expert.label == "expert bf16 CL" and expert.precision == "bf16" and not expert.marks_steps
    x = expert.prepare(torch.rand(2, 3, 64, 64))
    assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
    assert expert(x).dtype == torch.float32
    assert next(model.parameters()).dtype == torch.float32  # timm's model is left untouched


# ---- checkpoints ----


def test_random_weights_for_the_bench_give_each_photo_its_own_class_and_are_reused(tmp_path):
    source = resolve_source("timm/regnetx_002.pycls_in1k", "random", tmp_path, 3, PHOTOS)
    assert source.architecture == "regnetx_002" and source.weights == "random"
    assert source.folder.parent == tmp_path / "checkpoints"
    assert source.folder.name.startswith("regnetx_002.pycls_in1k-random-seed3-photos-")
    with torch.no_grad():
        logits = load_timm_model(source.folder)(timm_pixels(source.folder, PHOTOS))
    assert logits.argmax(-1).tolist() == list(range(22))  # a clear winner per photo, as trained weights give
    stamp = (source.folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_source("timm/regnetx_002.pycls_in1k", "random", tmp_path, 3, PHOTOS) == source
    assert (source.folder / "model.safetensors").stat().st_mtime_ns == stamp


def test_bare_architecture_name_asks_for_random_weights(tmp_path):
    with pytest.raises(SpecError, match="add `weights: random`.*--random-weights"):
        resolve_source("resnet50", "checkpoint", tmp_path, 0, PHOTOS)


# ---- support code ----


def test_tools_use_only_public_apis_and_import_nothing_from_tests():
    for path in sorted((REPO / "tools").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module.split(".")[0] not in ("support", "tests"), f"{path.name} imports {node.module}"
                names = [a.name for a in node.names]
                assert not any(n.startswith("_") for n in names), f"{path.name} imports private {names} from {node.module}"
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] not in ("support", "tests") for a in node.names), path.name
        assert '"tests"' not in path.read_text(), f"{path.name} puts tests/ on sys.path"


# ---- the YAML ----


def write(tmp_path, text):
    path = tmp_path / "bench.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        ("entrys: []", r"bench.yaml: unknown key 'entrys' \(did you mean 'entries'\?\)"),
        ("entries: []", r"bench.yaml: 'entries' must be a non-empty list"),
        ("entries:\n  - model: resnet50\n    batchs: [1]",
         r"entries\[0\] \(resnet50\): unknown key 'batchs' \(did you mean 'batch'\?\)"),
        ("entries:\n  - model: resnet50\n    precision: fp8",
         r"entries\[0\] \(resnet50\): 'precision' must be one of fp32, fp16, bf16, got 'fp8'"),
        ("entries:\n  - model: resnet50\n    batch: [1, 0]", r"entries\[0\] \(resnet50\): 'batch' must be a list of integers from 1 to 4096, got \[1, 0\]"),
        ("entries:\n  - model: resnet50\n    batch: [8, 8]", r"'batch' lists a size twice: \[8, 8\]"),
        ("entries:\n  - model: resnet50\n    batch: 1x", r"'batch' must be a list of integers such as \[1, 128\], got '1x'"),
        ("entries:\n  - model: resnet50\n  - name: x", r"entries\[1\]: 'model' is required"),
        ("entries:\n  - model: timm/resnet50.a1_in1k\n  - model: resnet50",
         r"entries\[1\] \(resnet50\): name 'resnet50' is already used by entries\[0\]"),
        ("entries:\n  - model: resnet50\n    weights: pretrained", r"'weights' must be 'checkpoint' or 'random'"),
        ("entries:\n  - model: resnet50\n    photos: nope", r"'photos' .*nope: no such folder"),
        ("entries:\n  - model: resnet50\n    photo: a.png", r"unknown key 'photo' \(did you mean 'photos'\?\)"),
        ("protocol: {margin: 5}\nentries:\n  - model: resnet50", r"bench.yaml: protocol: 'margin' must be a fraction"),
        ("protocol: {round_ms: 0}\nentries:\n  - model: resnet50", r"protocol: 'round_ms' must be a positive number"),
        ("entries:\n  - model: resnet50\n    protocol: {iters: 2}", r"entries\[0\] \(resnet50\): protocol: 'iters' must be an integer >= 3"),
        ("entries:\n  - model: resnet50\n    protocol: {warmups: 0}", r"'warmups' must be an integer >= 1 \(they calibrate"),
        ("entries:\n  - model: resnet50\n    protocol: {warmup: 2}", r"protocol: unknown key 'warmup' \(did you mean 'warmups'\?\)"),
        ("defaults: {name: x}\nentries:\n  - model: resnet50", r"defaults: unknown key 'name'"),
        ("entries:\n  - model: resnet50\n    name: a/b", r"'name' 'a/b' names files: no slashes"),
        ("entries:\n  - model: [resnet50]", r"entries\[0\]: 'model' must be a Hugging Face id"),
        ("entries: [model: resnet50", r"bench.yaml: not valid YAML"),
    ],
)
def test_yaml_mistakes_name_the_file_entry_and_key(tmp_path, text, message):
    with pytest.raises(SpecError, match=message):
        load_config(write(tmp_path, text))


def test_yaml_defaults_fill_entries_and_paths_are_relative_to_the_file(tmp_path):
    (tmp_path / "images").mkdir()
    config = load_config(write(tmp_path, """
protocol: {warmups: 2}
defaults: {precision: bf16, batch: [4], photos: images, protocol: {iters: 20}}
entries:
  - model: timm/resnet50.a1_in1k
  - model: ghostnet_100
    name: ghost
    weights: random
    batch: 1
    protocol: {margin: 0.1, round_ms: 50}
"""))
    first, second = config.entries
    assert (first.name, first.precision, first.batch_sizes, first.weights) == ("resnet50", "bf16", (4,), "checkpoint")
    assert first.photos == tmp_path / "images"
    assert first.protocol == TimingProtocol(warmups=2, iters=20, margin=0.05)
    assert (second.name, second.batch_sizes, second.weights) == ("ghost", (1,), "random")
    assert second.protocol == TimingProtocol(warmups=2, iters=20, margin=0.1, round_ms=50)
    assert config.select(["ghost"]) == (second,)
    with pytest.raises(SpecError, match=r"--only 'ghots'.*did you mean 'ghost'"):
        config.select(["ghots"])


def test_shipped_performance_yaml_covers_every_family_at_batch_1_and_128_in_fp16():
    from trtmc.families import all_families

    config = load_config(REPO / "benchmarks" / "performance.yaml")
    names = {e.name for e in config.entries}
    wanted = {"efficientnet_b0", "tf_efficientnet_lite0", "ghostnet_100", "mobilenetv3_large_100", "dpn68b",
              "resnet50", "convnext_tiny", "vit_base_patch16_224", "efficientvit_b1"}
    assert wanted <= names and names & {"regnetx_016", "regnety_016"}
    for entry in config.entries:
        assert entry.precision == "fp16" and entry.batch_sizes == (1, 128) and entry.protocol == PROTOCOL
        assert entry.photos == IMAGES
    for family in all_families():
        assert names & set(family.architectures), f"no entry for family {family.name}"
    assert Path(next(e for e in config.entries if e.name == "tf_efficientnet_lite0").model).is_dir()


def test_default_entry_name_is_the_models_short_name():
    assert default_name("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k") == "vit_base_patch16_224"
    assert default_name("./ckpts/tf_efficientnet_lite0.in1k/") == "tf_efficientnet_lite0"
    assert default_name("resnet50") == "resnet50"
    assert parse_config({"entries": [{"model": "resnet50", "weights": "random"}]}).entries[0].weights == "random"


def test_random_weights_flag_spares_local_checkpoints_and_list_shows_it():
    code, out, err = run_cli("bench", "--config", REPO / "benchmarks" / "performance.yaml", "--list", "--random-weights")
    assert code == 0, err
    lines = {line.split()[0]: line.split() for line in out.splitlines()}
    assert lines["resnet50"][4] == "random" and lines["tf_efficientnet_lite0"][4] == "checkpoint"


def test_cli_refuses_an_architecture_name_without_random_weights_before_running():
    code, _, err = run_cli("bench", "--model", "ghostnet_100", "--device", "cpu")
    assert code == 1 and "pass --random-weights" in err


def test_a_prepare_error_that_does_not_pickle_reaches_the_parent_in_words(monkeypatch, tmp_path):
    import pickle

    class Unpicklable(RuntimeError):
        def __init__(self):
            super().__init__("the expert's compile failed")
            self.module = pickle  # what run 14's swinv2 expert error carried: "cannot pickle 'module' object"

    def failing(*args, **kwargs):
        raise Unpicklable()

    monkeypatch.setattr(prepare_phase, "prepare_entry", failing)
    with pytest.raises(prepare_phase.PrepareFailed) as caught:
        prepare_phase._prepare_in_child(tiny_entry(tmp_path), options(tmp_path), True, None, prepare_phase.BASELINES)
    arrived = pickle.loads(pickle.dumps(caught.value))
    assert str(arrived) == "Unpicklable: the expert's compile failed"
    assert "raise Unpicklable()" in arrived.trace


def test_a_prepare_process_takes_its_share_of_the_cpus_and_at_least_the_compile_workers(monkeypatch, tmp_path):
    import torch._inductor.config as inductor_config

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(prepare_phase, "prepare_entry", lambda *args, **kwargs: 1.5)
    entry, opts = tiny_entry(tmp_path), options(tmp_path)
    # Inductor's config module is not monkeypatch's to restore (its undo deletes the option): its own patch is.
    with inductor_config.patch(compile_threads=inductor_config.compile_threads):
        assert prepare_phase._prepare_in_child(entry, opts, True, 1, prepare_phase.BUILD) == 1.5
        assert threads == [1] and inductor_config.compile_threads == prepare_phase.COMPILE_WORKERS > 1
        prepare_phase._prepare_in_child(entry, opts, True, 12, prepare_phase.BUILD)
        assert threads == [1, 12] and inductor_config.compile_threads == 12


def test_an_entrys_build_and_baselines_are_prepared_apart_and_noted_once_both_are_done(monkeypatch, tmp_path):
    seen = []

    def part(entry, options, progress, parts):
        seen.append(parts)
        assert not prepare_phase.is_prepared(entry, options)  # no note before the last part has run
        return 1.5

    monkeypatch.setattr(prepare_phase, "prepare_entry", part)
    opts = options(tmp_path, baselines=("expert",))
    entry = tiny_entry(tmp_path)
    assert prepare_entries([entry], opts, 1, quiet=True, executor=ThreadPoolExecutor(1)) == {}
    assert seen == [("build",), ("baselines",)] and prepare_phase.is_prepared(entry, opts)
    assert json.loads((tmp_path / "work" / "prepared" / "tiny.json").read_text())["seconds"] == 3.0
    seen.clear()
    eager_only = options(tmp_path / "eager", baselines=("eager-fp32",))
    assert prepare_entries([entry], eager_only, 1, quiet=True, executor=ThreadPoolExecutor(1)) == {}
    assert seen == [("build",), ("baselines",)]  # nothing to compile, but timm's answers to compute
