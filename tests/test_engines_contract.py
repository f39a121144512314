"""The `Engine` and `Backend` contracts, checked over every engine kind that can run on this machine.

Each kind is built by its backend and loaded back exactly as the runtime does it, from a small
network whose every logit depends on every pixel. The TensorRT engine and the CUDA inductor engine
cannot run on a CPU-only machine (and TensorRT is never mocked here): for those the classes are
checked against the protocol's members and signatures and shown to keep the boundary the CPU engines
exercise (`engine_io.EngineBase`: the pixel check, owned output); its helpers are tested directly.
"""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli
from trtmc.backends import BACKENDS, DEVICES, Backend, Batching, Engine, EngineSpec, LoadOptions, get_backend
from trtmc.backends.engine_io import EngineBase, WarnOnce, device_missing_reason, owned_logits
from trtmc.backends.inductor import InductorCudaEngine, UncompiledCudaEngine, compiled_batch_sizes, feed_dtype
from trtmc.backends.reference import ReferenceEngine
from trtmc.backends.tensorrt_engine import TensorRTEngine
from trtmc.backends.torch_lowering import channels_last_weights, to_fx
from trtmc.graph import Activation
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.runtime import Runtime

MAX_BATCH = 3
CLASSES = 10
CHW = (3, 16, 16)
# Largest logit difference from the CPU reference engine, relative to its largest logit. CPU: compiled
# kernels only reorder sums (measured ~1e-7 here); DESIGN.md's fp32 parity bound, 1e-4, is the limit.
# CUDA: cuDNN may run fp32 convolutions in TF32 (PyTorch's default, cudnn.allow_tf32); lite0's fp32
# inductor engine measured 3.3e-4 against the reference engine on the H200 (2026-12-01), hence 1e-3.
TOLERANCE = {"cpu": 1e-4, "cuda": 1e-3}


def small_classifier(precision: str = "fp32"):
    r = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, *CHW))
    y = b.conv2d(x, "stem.conv", r.standard_normal((8, 3, 3, 3)) * 0.3, r.standard_normal(8), stride=2, padding=1)
    y = b.activation(y, Activation.SILU, "stem.act")
    y = b.conv2d(y, "blocks.0.conv_dw", r.standard_normal((8, 1, 3, 3)) * 0.3, padding=1, groups=8)
    y = b.flatten(b.global_avg_pool(y, "global_pool"), "flatten")
    b.output(b.linear(y, "classifier", r.standard_normal((CLASSES, 8)), r.standard_normal(CLASSES)))
    return assign_precision(b.finish(), PrecisionPolicy(precision))


def engine_kinds():
    """(backend, device) for every engine kind this machine can run; compiled kinds are slow."""
    kinds = []
    for name in BACKENDS:
        for device in get_backend(name).devices:
            if device_missing_reason(device) is not None or get_backend(name).cannot_build_reason(device):
                continue  # e.g. no GPU, or no TensorRT module to build a plan with
            marks = () if name == "reference" else (pytest.mark.slow,)
            kinds.append(pytest.param((name, device), id=f"{name}-{device}", marks=marks))
    return kinds


@pytest.fixture(scope="module")
def graph():
    return small_classifier()


@pytest.fixture(scope="module")
def loaded(graph):
    """(backend, device) -> (the BuiltEngine, the Engine loaded from it), built once per kind."""
    cache = {}

    def load(kind):
        if kind not in cache:
            name, device = kind
            backend = get_backend(name)
            built = backend.build(graph, EngineSpec(name, device, "fp32", max_batch=MAX_BATCH), lambda message: None)
            reason = backend.unavailable_reason(built.entry())
            if reason is not None:  # e.g. a TensorRT-RTX plan on a GPU it does not support
                pytest.skip(reason)
            cache[kind] = built, backend.load(built.files, built.entry(), graph)
        return cache[kind]

    return load


def served_sizes(batching: Batching) -> list[int]:
    return list(batching.sizes or range(1, batching.max_batch + 1))


def pixels(batch: int, seed: int, device: str) -> torch.Tensor:
    return torch.randn((batch, *CHW), generator=torch.Generator().manual_seed(seed)).to(device)


# ---- the registry and the Backend protocol ----------------------------------------------------------


@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_registered_backend_implements_the_backend_protocol(name):
    backend = get_backend(name)
    assert isinstance(backend, Backend) and backend.name == name
    assert backend.devices and set(backend.devices) <= set(DEVICES)
    for device in backend.devices:
        reason = backend.cannot_build_reason(device)
        assert reason is None or (isinstance(reason, str) and reason)
    # One `load` signature for every backend; callers that pass no options get the default load.
    parameters = inspect.signature(backend.load).parameters
    assert list(parameters) == ["files", "entry", "graph", "options"]
    assert parameters["options"].default == LoadOptions() and LoadOptions().quick_start is False


def test_build_help_offers_every_registered_backend_with_its_summary():
    help_text = " ".join(run_cli("build", "--help").stdout.split())
    assert "{" + ",".join(BACKENDS) + "}" in help_text
    for name, summary in BACKENDS.items():
        assert f"{name} {' '.join(summary.split())}" in help_text


def test_an_unknown_backend_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match="unknown backend 'onnx'; this trtmc has tensorrt, inductor, reference"):
        get_backend("onnx")


# ---- every engine kind that runs here -------------------------------------------------------------


@pytest.mark.parametrize("kind", engine_kinds())
def test_engine_states_its_device_and_the_batching_its_build_recorded(loaded, kind):
    built, engine = loaded(kind)
    assert isinstance(engine, Engine)
    assert engine.device == kind[1]
    assert engine.batching == built.batching == built.entry().batching
    assert engine.batching.max_batch == MAX_BATCH


@pytest.mark.parametrize("kind", engine_kinds())
def test_engine_returns_owned_float32_logits_that_a_later_call_leaves_alone(loaded, kind):
    _, engine = loaded(kind)
    first = engine(pixels(1, seed=1, device=kind[1]))
    kept = first.clone()
    second = engine(pixels(1, seed=2, device=kind[1]))
    assert first.dtype == second.dtype == torch.float32 and first.shape == (1, CLASSES)
    assert not torch.equal(first, second)  # different pixels, different logits: the check below means something
    assert torch.equal(first, kept)
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()


@pytest.mark.parametrize("kind", engine_kinds())
def test_engine_serves_every_batch_it_declares_and_refuses_the_others(loaded, kind):
    _, engine = loaded(kind)
    batching = engine.batching
    for batch in served_sizes(batching):
        assert engine(pixels(batch, seed=batch, device=kind[1])).shape == (batch, CLASSES)
    for batch in [0, batching.max_batch + 1] + [n for n in range(1, batching.max_batch) if not batching.accepts(n)]:
        with pytest.raises(ValueError, match=rf"with N {batching}, got \({batch}, 3, 16, 16\)"):
            engine(pixels(batch, seed=0, device=kind[1]))


@pytest.mark.parametrize(
    "shape, dtype, got",
    [
        ((1, 3, 8, 8), torch.float32, r"\(1, 3, 8, 8\) float32"),  # the CPU package read out of bounds: NaN
        ((1, 3, 16, 17), torch.float32, r"\(1, 3, 16, 17\) float32"),
        ((1, 1, 16, 16), torch.float32, r"\(1, 1, 16, 16\) float32"),
        ((3, 16, 16), torch.float32, r"\(3, 16, 16\) float32"),
        ((1, 3, 16, 16), torch.float64, r"\(1, 3, 16, 16\) float64"),
        ((1, 3, 16, 16), torch.float16, r"\(1, 3, 16, 16\) float16"),
    ],
)
@pytest.mark.parametrize("kind", engine_kinds())
def test_engine_refuses_pixels_of_the_wrong_shape_or_dtype_naming_expected_and_got(loaded, kind, shape, dtype, got):
    _, engine = loaded(kind)
    wrong = torch.rand(shape, dtype=dtype, device=kind[1])
    with pytest.raises(ValueError, match=rf"expected pixels \(N, 3, 16, 16\) float32 on {kind[1]} .*, got {got}"):
        engine(wrong)


@pytest.mark.parametrize("kind", engine_kinds())
def test_engine_reads_channels_last_pixels_as_it_reads_contiguous_ones(loaded, kind):
    # Normalizing NHWC bytes gives an NCHW view with channels-last strides (trtmc.ray passes such
    # pixels); a compiled CPU kernel that assumed contiguous NCHW read them as other pixels.
    _, engine = loaded(kind)
    x = pixels(2, seed=4, device=kind[1])
    strided = x.contiguous(memory_format=torch.channels_last)
    assert not strided.is_contiguous() and torch.equal(strided, x)
    assert torch.equal(engine(strided), engine(x))


@pytest.mark.parametrize("kind", engine_kinds())
def test_warm_up_does_the_one_time_work_and_changes_no_answer(loaded, kind):
    _, engine = loaded(kind)
    x = pixels(MAX_BATCH, seed=3, device=kind[1])
    before = engine(x)
    assert engine.warm_up() is None
    assert torch.equal(engine(x), before)


@pytest.mark.parametrize("kind", engine_kinds())
def test_engine_logits_equal_the_reference_engines_within_1e_4_of_the_largest(loaded, kind):
    _, engine = loaded(kind)
    _, reference = loaded(("reference", "cpu"))
    for batch in served_sizes(engine.batching):
        x = pixels(batch, seed=10 + batch, device="cpu")
        expected = reference(x)
        got = engine(x.to(kind[1])).cpu()
        relative = float((got - expected).abs().max() / expected.abs().max())
        assert relative <= TOLERANCE[kind[1]], f"batch {batch}: {relative:.2e} of the largest logit"


def test_a_cuda_engine_compiles_from_the_bundles_caches_without_inductors_worker_pool(monkeypatch):
    # Inductor's pool (a process per core, each importing torch) cost 7 s at exit on the H200 machine
    # (benchmarks/NOTES.md, run 5); a user's own TORCHINDUCTOR_COMPILE_THREADS still wins.
    import torch._inductor.config as inductor_config

    from trtmc.backends.inductor import compiling_in_process

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    before = inductor_config.compile_threads
    with compiling_in_process():
        assert inductor_config.compile_threads == 1
    assert inductor_config.compile_threads == before
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "8")
    with compiling_in_process():
        assert inductor_config.compile_threads == before


# ---- quick start: the CUDA engine's graph uncompiled ---------------------------------------------------
# The runtime makes it on "cuda"; its device is a parameter, so the same class runs here on the CPU.


def test_the_uncompiled_engine_answers_as_the_reference_engine(graph):
    max_batch = 4
    assert 3 not in compiled_batch_sizes(max_batch)  # the compiled CUDA engine would pad 3 photos to 4
    engine = UncompiledCudaEngine(graph, "cpu", max_batch)
    reference = ReferenceEngine(graph, "cpu", Batching.up_to(max_batch))
    assert isinstance(engine, Engine) and engine.device == "cpu" and engine.batching == Batching.up_to(max_batch)
    for batch in (1, 3, 4):
        x = pixels(batch, seed=20 + batch, device="cpu")
        got, expected = engine(x), reference(x)
        assert got.shape == (batch, CLASSES) and got.dtype == torch.float32
        relative = float((got - expected).abs().max() / expected.abs().max())
        assert relative <= 1e-5, f"batch {batch}: {relative:.2e} of the largest logit"
    with pytest.raises(ValueError, match=r"with N any batch 1\.\.4, got \(5, 3, 16, 16\)"):
        engine(pixels(max_batch + 1, seed=0, device="cpu"))


def test_the_uncompiled_engine_reads_channels_last_pixels_as_contiguous_ones(graph):
    # It takes the pixels as they come (copies_input) and makes its own channels-last copy.
    engine = UncompiledCudaEngine(graph, "cpu", MAX_BATCH)
    x = pixels(2, seed=5, device="cpu")
    assert torch.equal(engine(x.contiguous(memory_format=torch.channels_last)), engine(x))


def test_the_uncompiled_engine_runs_grouped_convolutions_with_cudnn_off_and_dense_ones_with_it(monkeypatch):
    # cuDNN's first call of each depthwise shape costs ~0.2 s on the H200: a quick start leaves them to PyTorch.
    g = GraphBuilder()
    x = g.input("x", (1, *CHW))
    y = g.conv2d(x, "stem.conv", np.ones((8, 3, 3, 3)), stride=2, padding=1)
    g.output(g.conv2d(y, "blocks.dw", np.ones((8, 1, 3, 3)), padding=1, groups=8))
    engine = UncompiledCudaEngine(assign_precision(g.finish(), PrecisionPolicy("fp32")), "cpu", MAX_BATCH)
    seen, conv2d = [], torch.conv2d

    def recording(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        seen.append((groups, torch.backends.cudnn.enabled))
        return conv2d(x, weight, bias, stride, padding, dilation, groups)

    monkeypatch.setattr(torch, "conv2d", recording)
    engine(pixels(1, seed=0, device="cpu"))
    assert seen == [(1, True), (8, False)]


@pytest.mark.slow
def test_the_compiled_cuda_module_compiles_one_module_per_set_of_depthwise_taps():
    # Batch 1 runs the wide depthwise convolution as taps, batch 4 leaves it to cuDNN: two compiled modules, the
    # batch sizes sharing a set share a module. torch.compile runs on the CPU too, which is what this checks.
    from trtmc.backends.inductor_lowerings import compile_cuda

    g = GraphBuilder()
    x = g.input("x", (1, *CHW))
    y = g.conv2d(x, "stem.conv", np.full((32, 3, 3, 3), 0.1), padding=1)
    g.output(g.conv2d(y, "blocks.dw", np.full((32, 1, 3, 3), 0.2), padding=1, groups=32))
    graph = assign_precision(g.finish(), PrecisionPolicy("fp32"))
    compiled, reference = compile_cuda(graph), ReferenceEngine(graph, "cpu", Batching.up_to(4))
    for batch in (1, 4, 2):
        x = pixels(batch, seed=batch, device="cpu")
        with torch.no_grad():
            assert torch.allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-4)
    assert len(compiled._by_lowering) == 2 and compiled._by_batch[2] is compiled._by_batch[4]


def test_the_cuda_engines_round_the_pixels_to_the_graphs_precision_as_they_copy_them():
    # An fp16 graph's only use of its float32 input is the cast to fp16: the engine's own copy of the
    # pixels rounds them instead (the same rounding), and the cast inside the graph has nothing left to do.
    fp16 = small_classifier("fp16")
    assert feed_dtype(fp16) is torch.float16 and feed_dtype(small_classifier()) is torch.float32
    module = channels_last_weights(to_fx(fp16).eval(), fp16)
    x = pixels(2, seed=3, device="cpu")
    with torch.no_grad():
        casting_inside = module(x.contiguous(memory_format=torch.channels_last))
    engine, fed = UncompiledCudaEngine(fp16, "cpu", MAX_BATCH), []
    engine._module.register_forward_pre_hook(lambda _, args: fed.append((args[0].dtype, args[0].stride())))
    assert torch.equal(engine(x), casting_inside)
    assert fed == [(torch.float16, x.contiguous(memory_format=torch.channels_last).stride())]


def test_only_convolution_weights_go_channels_last_for_the_cuda_engines():
    g = GraphBuilder()
    x = g.input("x", (1, *CHW))
    y = g.conv2d(x, "stem.conv", np.ones((8, 3, 3, 3)), stride=2, padding=1)
    tokens = g.reshape(y, (1, 8, 64), "tokens")  # [1, heads=1, tokens=8, dim=64]
    g.output(g.attention(tokens, tokens, tokens, "attn", scale=0.125, bias=np.zeros((1, 1, 8, 8))))
    graph = assign_precision(g.finish(), PrecisionPolicy("fp32"))
    module = channels_last_weights(to_fx(graph), graph)
    weights = {name: t for name, t in [*module.named_buffers(), *module.named_parameters()] if t.dim() == 4}
    conv, bias = weights["w_stem_conv_weight"], weights["w_attn_bias"]
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert bias.is_contiguous()  # `Module.to(memory_format=)` would have made it channels-last too


def test_the_uncompiled_engine_loads_and_answers_without_importing_dynamo_or_inductor():
    # Importing and running Dynamo and Inductor is most of the compiled CUDA engine's load time: a quick start
    # must not pay it. Another process, since this one may have imported them for other tests.
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_engines_contract import MAX_BATCH, small_classifier, pixels\n"
        "from trtmc.backends.inductor import UncompiledCudaEngine\n"
        "UncompiledCudaEngine(small_classifier(), 'cpu', MAX_BATCH)(pixels(2, seed=1, device='cpu'))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_quick_start_loads_a_cpu_bundles_compiled_engine_as_the_default_load_does(lite0_bundle):
    # Quick start applies only to engines that compile when they load; the CPU package is compiled code already.
    default = Runtime.open(lite0_bundle)
    quick = Runtime.open(lite0_bundle, options=LoadOptions(quick_start=True))
    assert quick.choice.key == default.choice.key == "inductor-cpu-fp32"
    assert type(quick.engine) is type(default.engine) and not isinstance(quick.engine, UncompiledCudaEngine)
    assert quick.batching == default.batching
    x = torch.randn((3, *default.graph.inputs[0].type.shape[1:]), generator=torch.Generator().manual_seed(7))
    assert np.array_equal(quick.logits(x), default.logits(x))


# ---- engines that cannot run here: checked against the protocol, not mocked --------------------------


def protocol_members(protocol: type) -> dict[str, object]:
    """The protocol's attributes (None) and methods, by name."""
    members: dict[str, object] = {name: None for name in protocol.__annotations__}
    for name, value in vars(protocol).items():
        if callable(value) and (name == "__call__" or not name.startswith("_")):
            members[name] = value
    return members


def test_protocol_members_are_what_the_engine_contract_names():
    assert set(protocol_members(Engine)) == {"device", "batching", "warm_up", "__call__"}


@pytest.mark.parametrize("cls", [TensorRTEngine, InductorCudaEngine, UncompiledCudaEngine], ids=lambda c: c.__name__)
def test_engine_classes_that_need_a_gpu_declare_every_protocol_member(cls):
    # No GPU here can run a TensorRT plan or the CUDA inductor engine, so the class is checked, not an instance.
    for name, method in protocol_members(Engine).items():
        assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
        if method is not None:
            assert list(inspect.signature(getattr(cls, name)).parameters) == list(inspect.signature(method).parameters)
    # They keep the boundary the CPU engines exercise above: checked pixels in, owned logits out.
    assert issubclass(cls, EngineBase) and cls.__call__ is EngineBase.__call__


# ---- the boundary every engine shares ----------------------------------------------------------------


def test_owned_logits_copy_a_static_buffer_so_the_next_replay_cannot_change_them():
    static_out = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    logits = owned_logits(static_out)
    static_out.add_(100)  # what the next CUDA graph replay does to its output buffer
    assert torch.equal(logits, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert logits.untyped_storage().data_ptr() != static_out.untyped_storage().data_ptr()


def test_owned_logits_of_a_half_buffer_are_float32():
    static_out = torch.tensor([[1.5, -2.0]], dtype=torch.float16)
    logits = owned_logits(static_out)
    assert logits.dtype == torch.float32 and logits.tolist() == [[1.5, -2.0]]


def test_warn_once_warns_on_the_first_failure_of_each_engine_and_keeps_the_rest_for_debugging(caplog):
    log = logging.getLogger("trtmc.test.warn_once")
    first_engine, second_engine = WarnOnce(log), WarnOnce(log)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for batch in (1, 8, 64):
            first_engine("CUDA graph capture failed for batch %d", batch)
        second_engine("CUDA graph capture failed for batch %d", 1)
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels == [
        (logging.WARNING, "CUDA graph capture failed for batch 1"),
        (logging.DEBUG, "CUDA graph capture failed for batch 8"),
        (logging.DEBUG, "CUDA graph capture failed for batch 64"),
        (logging.WARNING, "CUDA graph capture failed for batch 1"),
    ]
