"""`trtmc bench` on the CPU: the protocol, the oracle, unstable rows, output files, YAML validation.

Nothing here compiles: the inductor backend's compiler is replaced by trtmc's uncompiled torch
module (the real build, bundle, runtime and task run around it), and the protocol tests feed
scripted timers. GPU speed is measured by running `trtmc bench` on the GPU machine.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trtmc.bench import report
from trtmc.bench.runner import TRTMC, BenchOptions, Target, run_bench, run_entry
from trtmc.bench.spec import Entry, SpecError, TimingProtocol, default_name, load_config, parse_config
from trtmc.bench.timing import ENGINE, TASK, Timing, spread, time_row
from trtmc.bench.weights import load_timm_model, resolve_source, save_random_checkpoint

REPO = Path(__file__).resolve().parents[1]
PHOTO = REPO / "examples" / "images" / "chelsea.png"
SMALL = {"pretrained_cfg_overlay": {"input_size": (3, 64, 64)}}  # a 64x64 regnetx_002: milliseconds per call
PROTOCOL = TimingProtocol()  # 3 warm-ups, 10 measurements, 5%
QUICK = TimingProtocol(warmups=1, iters=3)  # where the test is not about the protocol's counts


@pytest.fixture(autouse=True)
def one_thread():
    """The CPU numbers here are not measurements; one thread keeps a shared 2-core machine responsive."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- helpers ----


def scripted(*attempts):
    """A timer that calls the function and reports the scripted milliseconds, in order."""
    times = [ms for attempt in attempts for ms in attempt]

    def timer(fn):
        return times.pop(0), fn()

    timer.left = times
    return timer


def constant_timers(ms_by_subject, unstable=()):
    """`timer_for` giving each subject a constant time; rows in `unstable` jitter by 20% on every attempt."""

    def timer_for(subject, scope, batch, device):
        ms = ms_by_subject.get((subject, scope), ms_by_subject.get(subject, 1.0))
        if (subject, scope, batch) in unstable:
            jitter = iter([ms, ms * 1.2] * 100)
            return lambda fn: (next(jitter), fn())
        return lambda fn: (ms, fn())

    return timer_for


FAST = constant_timers({TRTMC: 1.0, "eager-fp32": 2.0, "eager-cl": 1.02, "reduce-overhead": 0.5})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """regnetx_002 with random, batch-norm-calibrated weights at 64x64, in the Hugging Face layout."""
    return save_random_checkpoint("regnetx_002", tmp_path_factory.mktemp("ckpt") / "regnetx_002", seed=0, **SMALL)


@pytest.fixture
def uncompiled(monkeypatch):
    """The inductor backend with its compile step replaced by trtmc's uncompiled graph module.

    `uncompiled.wrap` post-processes the engine's logits (a wrong engine); `uncompiled.calls` counts them.
    """
    from trtmc.backends import BuiltEngine, inductor
    from trtmc.backends.torch_lowering import GraphModule

    class Fake:
        wrap = staticmethod(lambda logits: logits)
        calls = 0

    def build(graph, spec, progress):
        return BuiltEngine(spec, {"uncompiled.txt": b"no compile in the tests"}, {"batch_sizes": [1, spec.max_batch]})

    class Engine:  # like the CPU engine: any batch up to the build's max batch
        dynamic_batch = True

        def __init__(self, graph, max_batch):
            self.module = GraphModule(graph).eval()
            self.max_batch = max_batch

        def __call__(self, pixels):
            Fake.calls += 1
            with torch.no_grad():
                return Fake.wrap(self.module(pixels).float())

    def load(files, record, graph, device):
        return Engine(graph, max(record["batch_sizes"]))

    monkeypatch.setattr(inductor, "build", build)
    monkeypatch.setattr(inductor, "load", load)
    return Fake


@pytest.fixture
def no_compile(monkeypatch):
    """torch.compile as the identity, so the compiled baselines' plumbing runs without compiling."""
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)


def tiny_entry(folder, **changes):
    fields = dict(name="tiny", model=str(folder), precision="fp32", batch_sizes=(1, 2), photo=PHOTO, protocol=QUICK)
    return Entry(**{**fields, **changes})


def options(tmp_path, baselines=("eager-fp32", "eager-cl")):
    return BenchOptions(workdir=tmp_path / "work", device="cpu", baselines=baselines)


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


def test_protocol_makes_three_untimed_warmups_then_ten_timed_measurements():
    events = []

    def fn():
        events.append("call")
        return events.count("call")

    def timer(f):
        events.append("timer")
        return 1.0, f()

    timing, last = time_row(fn, PROTOCOL, timer, sync=lambda: events.append("sync"))
    assert events[:4] == ["call", "call", "call", "sync"]
    assert events[4:] == ["timer", "call"] * 10
    assert timing.samples_ms == (1.0,) * 10 and timing.attempts == 1 and timing.stable
    assert last == 13  # the last measured call's output is handed back for the checks after timing


def test_row_spreading_beyond_the_margin_is_rerun_once_then_marked_unstable():
    calls = []
    jittery = [1.0] * 9 + [1.2]
    timer = scripted(jittery, jittery)
    timing, _ = time_row(lambda: calls.append(1), PROTOCOL, timer)
    assert len(calls) == 2 * (3 + 10) and not timer.left  # one re-run, no third attempt
    assert timing.attempts == 2 and not timing.stable
    assert timing.discarded_ms == tuple(jittery)
    assert timing.spread == pytest.approx(0.2)


def test_unstable_row_that_settles_on_its_rerun_is_a_result():
    timing, _ = time_row(lambda: None, PROTOCOL, scripted([1.0] * 9 + [3.0], [2.0] * 10))
    assert timing.stable and timing.attempts == 2
    assert timing.median_ms == 2.0  # the re-run's samples, not a mix
    assert timing.discarded_ms[-1] == 3.0


def test_spread_is_the_largest_distance_from_the_median_as_a_fraction_of_it():
    assert spread([1.0] * 9 + [1.05]) == pytest.approx(0.05)
    assert Timing((1.0,) * 9 + (1.05,), margin=0.05).stable
    assert not Timing((1.0,) * 9 + (1.06,), margin=0.05).stable
    assert not Timing((1.0,) * 9 + (0.94,), margin=0.05).stable


# ---- entries end to end (real build, bundle, runtime and task; compiler replaced) ----


def test_entry_times_both_scopes_and_every_baseline_with_the_protocol(tiny, tmp_path, uncompiled, no_compile):
    opts = options(tmp_path, baselines=("eager-fp32", "eager-cl", "reduce-overhead"))
    result = run_entry(tiny_entry(tiny, protocol=PROTOCOL), opts, timer_for=FAST)
    assert result.status == "passed", result.message
    assert result.architecture == "regnetx_002" and result.engine_key == "inductor-cpu-fp32"
    assert result.build_seconds > 0 and result.bundle_bytes > 0
    keys = [(r.subject, r.scope, r.batch) for r in result.rows]
    assert keys == [
        (TRTMC, ENGINE, 1), (TRTMC, TASK, 1), (TRTMC, ENGINE, 2), (TRTMC, TASK, 2),
        ("eager-fp32", ENGINE, 1), ("eager-fp32", ENGINE, 2),
        ("eager-cl", ENGINE, 1), ("eager-cl", ENGINE, 2),
        ("reduce-overhead", ENGINE, 1), ("reduce-overhead", ENGINE, 2),
    ]
    for row in result.rows:
        assert row.status == "ok" and len(row.timing.samples_ms) == 10 and row.first_call_s is not None
        assert row.top_classes == (result.reference.top_class,) and row.finite
    # per trtmc row: 1 first call + 3 warm-ups + 10 measurements; the task scope calls the engine too
    assert uncompiled.calls == 4 * (1 + 3 + 10)
    assert result.ratio("eager-fp32", 1) == pytest.approx(2.0)
    assert result.verdict(result.ratio("eager-fp32", 1)) == "faster"
    assert result.verdict(result.ratio("eager-cl", 2)) == "on par"  # 1.02 is within the 5% margin
    assert result.verdict(result.ratio("reduce-overhead", 2)) == "slower"


def test_engine_with_shuffled_logits_fails_the_entry_whatever_its_speed(tiny, tmp_path, uncompiled):
    uncompiled.wrap = staticmethod(lambda logits: torch.roll(logits, 1, dims=-1))
    timers = constant_timers({TRTMC: 0.001, "eager-fp32": 10.0, "eager-cl": 10.0})
    result = run_entry(tiny_entry(tiny), options(tmp_path), timer_for=timers)
    assert result.status == "failed"
    expected = result.reference.top_class
    assert f"top class {(expected + 1) % 1000} where timm's is {expected}" in result.message
    assert len(result.oracle_failures) == 2  # the engine scope at both batch sizes
    assert result.ratio("eager-fp32", 1) is None  # no speed-up is reported for a wrong answer
    markdown = report.to_markdown(run_bench_result([result], tmp_path))
    assert "**WRONG**" in markdown and "10.00 ms" in markdown and "10000.00×" not in markdown


def test_non_finite_logits_fail_the_entry(tiny, tmp_path, uncompiled):
    uncompiled.wrap = staticmethod(lambda logits: logits.index_fill(-1, torch.tensor([7]), float("nan")))
    result = run_entry(tiny_entry(tiny, batch_sizes=(1,)), options(tmp_path, baselines=()), timer_for=FAST)
    assert result.status == "failed" and "non-finite logits" in result.message


def test_unstable_trtmc_row_is_rerun_then_shown_unstable_not_as_a_result(tiny, tmp_path, uncompiled):
    timers = constant_timers({TRTMC: 1.0, "eager-fp32": 2.0}, unstable={(TRTMC, ENGINE, 2)})
    result = run_entry(tiny_entry(tiny), options(tmp_path, baselines=("eager-fp32",)), timer_for=timers)
    assert result.status == "passed"  # the answer was right; the row just is not a result
    row = result.row(TRTMC, ENGINE, 2)
    assert row.status == "unstable" and row.timing.attempts == 2 and row.median_ms is None
    assert result.ratio("eager-fp32", 2) is None and result.ratio("eager-fp32", 1) == pytest.approx(2.0)
    bench = run_bench_result([result], tmp_path)
    assert "unstable (±" in report.to_markdown(bench)
    row_json = next(r for r in report.to_json(bench)["entries"][0]["rows"] if r["scope"] == "engine" and r["batch"] == 2)
    assert row_json["status"] == "unstable" and row_json["median_ms"] is None and len(row_json["timing"]["discarded_ms"]) == 3
    assert report.to_json(bench)["summary"]["unstable_rows"] == 1


def test_engine_missing_a_batch_size_is_an_error_of_that_row(tiny, tmp_path):
    from trtmc.backends.torch_lowering import GraphModule
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph
    from trtmc.preprocess import PreprocessSpec

    checkpoint = Checkpoint(tiny)
    module = GraphModule(build_graph(checkpoint)[1]).eval()

    def prepare(entry, source, opts, progress):
        return Target(engine=module, task=lambda images: np.zeros((len(images), 1000), np.float32),
                      preprocess=PreprocessSpec.from_pretrained(checkpoint.config.pretrained),
                      device="cpu", batch_sizes=(1,))

    result = run_entry(tiny_entry(tiny), options(tmp_path, baselines=()), prepare=prepare, timer_for=FAST)
    assert result.status == "error"  # a trtmc row that cannot run is the entry's error
    assert result.row(TRTMC, ENGINE, 2).error == "the engine is compiled for batch sizes [1], not 2"


def test_unsupported_architecture_is_reported_without_building(tmp_path, uncompiled):
    folder = tmp_path / "alien"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "alien_net", "num_classes": 10}))
    (folder / "model.safetensors").write_bytes(b"")
    result = run_entry(tiny_entry(folder), options(tmp_path), timer_for=FAST)
    assert result.status == "unsupported" and "'alien_net' is not supported" in result.message
    assert not (tmp_path / "work" / "bundles").exists()


def run_bench_result(entries, tmp_path):
    from trtmc.bench.runner import BenchResult, environment

    return BenchResult(environment("cpu"), options(tmp_path), tuple(entries), "2026-01-01T00:00:00", 1.0)


def test_results_json_markdown_and_plot_are_written(tiny, tmp_path, uncompiled):
    bench = run_bench([tiny_entry(tiny)], options(tmp_path), timer_for=FAST)
    written = report.write_results(bench, tmp_path / "out")
    data = json.loads(written["json"].read_text())
    entry = data["entries"][0]
    assert data["summary"] == {"entries": 1, "passed": 1, "unstable_rows": 0}
    assert entry["status"] == "passed" and entry["build_seconds"] is not None
    assert entry["speedup"]["eager-fp32"] == {"1": 2.0, "2": 2.0}
    assert entry["oracle"]["timm"]["top_class"] == bench.entries[0].reference.top_class
    assert {r["scope"] for r in entry["rows"]} == {"engine", "task"}
    markdown = written["markdown"].read_text()
    assert "| tiny | fp32 | 1 | ok " in markdown and "**2.00×** (2.000 ms)" in markdown
    assert "1.02× ≈ (1.020 ms)" in markdown and "## Builds" in markdown
    assert written["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_benches_one_model_on_the_cpu(tiny, tmp_path, uncompiled):
    code, out, err = run_cli(
        "bench", "--device", "cpu", "--model", tiny, "--precision", "fp32", "--batch", "1", "--batch", "2",
        "--baseline", "eager-fp32", "--warmups", "1", "--iters", "3", "--out", tmp_path / "out",
    )
    assert code in (0, 1), err
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["entries"][0]["status"] == "passed" and code == 0
    assert data["entries"][0]["protocol"] == {"warmups": 1, "iters": 3, "margin": 0.05}
    assert (tmp_path / "out" / "results.md").is_file() and (tmp_path / "out" / "latency.png").is_file()
    assert "[1/1 regnetx_002] building (fp32, cpu, max batch 2)" in err  # progress on stderr
    assert "regnetx_002                  passed" in out


def test_bench_help_explains_scopes_protocol_and_baselines():
    code, out, _ = run_cli("bench", "--help")
    assert code == 0
    for phrase in ("engine scope", "task scope", "reduce-overhead", "--max-autotune", "--random-weights", "unstable"):
        assert phrase in out


# ---- checkpoints ----


def test_random_weights_are_written_in_the_hugging_face_layout_with_sane_logits(tiny):
    config = json.loads((tiny / "config.json").read_text())
    assert config["architecture"] == "regnetx_002" and config["pretrained_cfg"]["input_size"] == [3, 64, 64]
    with torch.no_grad():
        logits = load_timm_model(tiny)(torch.randn(2, 3, 64, 64))
    # calibrated batch norm keeps a trained network's scale (the parity tests' weights reach 1e18)
    assert torch.isfinite(logits).all() and 1e-2 < logits.abs().max() < 1e3


def test_hugging_face_id_with_random_weights_needs_no_network_and_is_reused(tmp_path):
    source = resolve_source("timm/regnetx_002.pycls_in1k", "random", tmp_path, seed=3)
    assert source.architecture == "regnetx_002" and source.weights == "random"
    assert source.folder == tmp_path / "checkpoints" / "regnetx_002.pycls_in1k-random-seed3"
    stamp = (source.folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_source("timm/regnetx_002.pycls_in1k", "random", tmp_path, seed=3) == source
    assert (source.folder / "model.safetensors").stat().st_mtime_ns == stamp


def test_bare_architecture_name_asks_for_random_weights(tmp_path):
    with pytest.raises(SpecError, match="add `weights: random`.*--random-weights"):
        resolve_source("resnet50", "checkpoint", tmp_path)


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
        ("entries:\n  - model: resnet50\n    photo: nope.png", r"'photo' .*nope.png: no such image file"),
        ("protocol: {margin: 5}\nentries:\n  - model: resnet50", r"bench.yaml: protocol: 'margin' must be a fraction"),
        ("entries:\n  - model: resnet50\n    protocol: {iters: 2}", r"entries\[0\] \(resnet50\): protocol: 'iters' must be an integer >= 3"),
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
    (tmp_path / "images" / "cat.png").write_bytes(b"")
    config = load_config(write(tmp_path, """
protocol: {warmups: 2}
defaults: {precision: bf16, batch: [4], photo: images/cat.png, protocol: {iters: 20}}
entries:
  - model: timm/resnet50.a1_in1k
  - model: ghostnet_100
    name: ghost
    weights: random
    batch: 1
    protocol: {margin: 0.1}
"""))
    first, second = config.entries
    assert (first.name, first.precision, first.batch_sizes, first.weights) == ("resnet50", "bf16", (4,), "checkpoint")
    assert first.photo == tmp_path / "images" / "cat.png"
    assert first.protocol == TimingProtocol(warmups=2, iters=20, margin=0.05)
    assert (second.name, second.batch_sizes, second.weights) == ("ghost", (1,), "random")
    assert second.protocol == TimingProtocol(warmups=2, iters=20, margin=0.1)
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
        assert entry.photo == PHOTO
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
