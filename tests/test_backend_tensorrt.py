"""The TensorRT backend, checked with real TensorRT-RTX builds on the CPU (no GPU, nothing mocked)."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import torch

from trtmc.backends import Batching, EngineEntry, EngineSpec
from trtmc.backends import tensorrt as backend
from trtmc.files import update_file_atomically
from trtmc.backends.tensorrt_lowering import TRT_LOWERINGS, lowering
from trtmc.backends.torch_lowering import LOWERINGS
from trtmc.graph import (
    Activation,
    Binary,
    Conv2dAttrs,
    DType,
    Graph,
    InputAttrs,
    Node,
    OpKind,
    PoolMode,
    Reduction,
    TensorType,
)
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.passes.quantize import quantize
from trtmc.quantization import FP8_RECIPE, calibrate

needs_builder = pytest.mark.skipif(backend.trt is None, reason="neither tensorrt nor tensorrt_rtx imports")


def every_op_graph() -> Graph:
    """A tiny network that uses every op kind, most attributes, and a token branch with attention."""
    r = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 3, 16, 16))
    y = b.conv2d(x, "stem.conv", r.standard_normal((8, 3, 3, 3)), r.standard_normal(8), stride=2, padding=(0, 0, 1, 1))
    y = b.scale(y, "stem.bn", r.random(8) + 0.5, r.standard_normal(8))
    for fn in Activation:
        y = b.activation(y, fn, f"act.{fn.value}")
    y = b.conv2d(y, "blocks.0.conv_dw", r.standard_normal((8, 1, 3, 3)), padding=1, groups=8)
    y = b.conv2d(y, "blocks.0.conv_grouped", r.standard_normal((8, 4, 3, 3)), padding=2, dilation=2, groups=2)
    pooled_max = b.pool2d(y, "pool.max", PoolMode.MAX, 3, 2, (0, 0, 1, 1))
    pooled_avg = b.pool2d(y, "pool.avg", PoolMode.AVG, 3, 2, 1, count_include_pad=False)
    y = b.add(pooled_max, pooled_avg, "pool.sum")
    y = b.concat([b.slice(y, 1, 4, 8, "split.1"), b.slice(y, 1, 0, 4, "split.0")], 1, "shuffle")
    y = b.layer_norm(y, "norm.channels", r.random(8) + 0.5, r.standard_normal(8), 1e-6, axis=1)
    y = b.group_norm(y, "norm.groups", 2, r.random(8) + 0.5, r.standard_normal(8), 1e-5)
    gate = b.activation(b.global_avg_pool(y, "se.pool", keepdim=True), Activation.SIGMOID, "se.gate")
    y = b.binary(y, gate, Binary.MUL, "se.mul")
    bias = b.constant("pos_bias", r.standard_normal((1, 8, 1, 1)))
    y = b.binary(y, bias, Binary.SUB, "sub")
    y = b.binary(y, b.reduce(y, "rmax", Reduction.MAX, (2, 3), keepdim=True), Binary.DIV, "div")
    y = b.binary(y, b.reduce(y, "rsum", Reduction.SUM, (2,), keepdim=True), Binary.MAX, "max")
    y = b.binary(y, bias, Binary.MIN, "min")
    t = b.transpose(b.reshape(y, (8, 16), "tokens"), (0, 2, 1), "tokens.t")  # [1, 16, 8]
    pos_embed = b.constant("pos_embed", r.standard_normal((1, 17, 8)))  # constants keep batch 1 through a slice
    t = b.add(t, b.slice(pos_embed, 1, 1, 17, "pos_embed.tokens"), "pos_drop")
    t = b.layer_norm(t, "attn.norm", r.random(8) + 0.5, r.standard_normal(8), 1e-5)
    q = b.linear(t, "attn.q", r.standard_normal((8, 8)), r.standard_normal(8))
    k = b.linear(t, "attn.k", r.standard_normal((8, 8)))
    attn = b.softmax(b.matmul(q, k, "attn.qk", transpose_b=True, sensitive=True), -1, "attn.softmax")
    t = b.scale(b.matmul(attn, t, "attn.av"), "attn.ls", r.random(8), r.random(8), axis=-1)
    q, k, v = (b.transpose(b.reshape(y, (16, 2, 4), f"mha.{n}"), (0, 2, 1, 3), f"mha.{n}") for n, y in zip("qkv", (q, k, t)))
    mixed = b.transpose(b.attention(q, k, v, "mha", scale=0.5, bias=r.standard_normal((1, 2, 16, 16))), (0, 2, 1, 3), "mha.merge")
    t = b.add(t, b.reshape(mixed, (16, 8), "mha.merge"), "mha.residual")
    features = b.scale(b.reduce(t, "head.pool", Reduction.MEAN, (1,), keepdim=False), "head.norm", r.random(8), r.random(8))
    b.output(b.linear(features, "head.fc", r.standard_normal((10, 8)), r.standard_normal(10)))
    return b.finish()


def typed_every_op_graph(precision: str) -> Graph:
    """every_op_graph in `precision`, its linear ops on tokens in FP8 (the default recipe's choice)."""
    scales = calibrate(every_op_graph(), [torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))])
    return quantize(assign_precision(every_op_graph(), PrecisionPolicy(precision)), FP8_RECIPE, scales)


def conv_graph() -> Graph:
    r = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", (1, 3, 8, 8))
    y = b.conv2d(x, "conv_stem", r.standard_normal((4, 3, 3, 3)), r.standard_normal(4), padding=1)
    y = b.conv2d(y, "conv_head", r.standard_normal((6, 4, 1, 1)))
    b.output(b.flatten(b.global_avg_pool(y, "global_pool"), "flatten"))
    return b.finish()


def spec(precision: str, **kwargs) -> EngineSpec:
    return EngineSpec("tensorrt", "cuda", precision, **kwargs)


def test_tensorrt_and_torch_lowerings_cover_exactly_every_op_kind():
    assert set(TRT_LOWERINGS) == set(LOWERINGS) == set(OpKind)


def test_registering_a_lowering_twice_is_an_error():
    with pytest.raises(RuntimeError, match="registered twice"):
        lowering(OpKind.CONV2D)(lambda lw, node, args: None)


def test_the_every_op_graph_uses_every_op_kind():
    graph = typed_every_op_graph("fp16")
    assert {n.kind for n in graph.nodes} == set(OpKind)


@needs_builder
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_every_op_kind_builds_a_plan(precision):
    graph = typed_every_op_graph(precision)
    progress: list[str] = []
    built = backend.build(graph, spec(precision, max_batch=4), progress.append)

    plan = built.files["engine.plan"]
    record = built.record
    assert len(plan) > 0 and record["plan_bytes"] == len(plan)
    assert record["builder"] == backend.TRT_MODULE
    assert record["builder_version"] == backend.trt.__version__
    assert record["network_layers"] >= len(graph.nodes)
    assert record["build_seconds"] > 0
    assert record["options"]["profile"] == {"min": [1, 3, 16, 16], "opt": [4, 3, 16, 16], "max": [4, 3, 16, 16]}
    assert record["options"]["io_dtype"] == "f32"
    assert built.batching == Batching.up_to(4)  # the profile serves every batch 1..4
    # Each math op computes in the dtype the precision pass gave its node.
    for kinds, layer_kind in (((OpKind.CONV2D,), "CONVOLUTION"), ((OpKind.MATMUL, OpKind.LINEAR), "MATRIX_MULTIPLY")):
        dtypes = Counter(n.type.dtype.value for n in graph.nodes if n.kind in kinds)
        assert record["layer_precisions"][layer_kind] == dict(dtypes)
    assert any("plan" in line for line in progress)


@needs_builder
def test_bf16_network_has_bf16_convolution_inputs_and_weights():
    graph = assign_precision(conv_graph(), PrecisionPolicy("bf16"))
    definition = backend.define_network(graph, spec("bf16"))

    convs = [layer for layer in definition.layers() if layer["type"] == "CONVOLUTION"]
    assert [c["name"] for c in convs] == ["[conv2d]-conv_stem", "[conv2d]-conv_head"]
    assert all(c["inputs"] == ["bf16"] and c["weights"] == "bf16" and c["outputs"] == ["bf16"] for c in convs)
    assert definition.precisions()["CONVOLUTION"] == {"bf16": 2}
    assert definition.precisions()["CAST"] == {"f32->bf16": 1, "bf16->f32": 1}


@needs_builder
def test_network_input_is_pixels_with_a_free_batch_and_output_is_logits():
    graph = assign_precision(conv_graph(), PrecisionPolicy("fp16", io_dtype=DType.F16))
    network = backend.define_network(graph, spec("fp16", io_dtype=DType.F16)).network
    pixels, logits = network.get_input(0), network.get_output(0)
    assert (pixels.name, tuple(pixels.shape), pixels.dtype) == ("pixels", (-1, 3, 8, 8), backend.trt.float16)
    assert (logits.name, logits.dtype) == ("logits", backend.trt.float16)


@needs_builder
def test_io_dtype_must_match_the_precision_pass():
    graph = assign_precision(conv_graph(), PrecisionPolicy("fp16"))  # f32 input and output
    with pytest.raises(ValueError, match="io_dtype f16"):
        backend.define_network(graph, spec("fp16", io_dtype=DType.F16))


@needs_builder
def test_mismatched_channels_fail_the_build_with_the_tensorrt_error(monkeypatch):
    # GraphBuilder would refuse this conv, so the graph is written by hand: 5 input channels in the
    # weight, 3 in the tensor. Graph.verify() refuses it too; switched off, only TensorRT can object.
    monkeypatch.setattr(Graph, "verify", lambda self: None)
    weights = {"conv.weight": np.ones((4, 5, 3, 3), np.float32)}
    nodes = [
        Node("x", OpKind.INPUT, (), InputAttrs(), TensorType((1, 3, 8, 8), DType.F32), "x"),
        Node(
            "conv",
            OpKind.CONV2D,
            ("x",),
            Conv2dAttrs("conv.weight", None, (1, 1), (1, 1, 1, 1), (1, 1), 1),
            TensorType((1, 4, 8, 8), DType.F32),
            "conv",
        ),
    ]
    broken = Graph(nodes=nodes, weights=weights, outputs=["conv"])
    with pytest.raises(backend.TensorRTBuildError) as error:
        backend.build(broken, spec("fp32"))
    message = str(error.value)
    assert "conv2d node 'conv'" in message
    assert error.value.tensorrt_errors
    assert "kernel weights has count 180 but 108 was expected" in message


@needs_builder
def test_build_options_reach_the_record():
    graph = assign_precision(conv_graph(), PrecisionPolicy("fp16"))
    record = backend.build(graph, spec("fp16", opt_level=0, workspace=1 << 26)).record
    assert record["options"]["opt_level"] == 0 and record["options"]["workspace"] == 1 << 26
    assert record["options"]["profile"]["opt"] == [1, 3, 8, 8]  # max_batch 1: opt is 1 too
    with pytest.raises(ValueError, match="0..5"):
        backend.build(graph, spec("fp16", opt_level=6))


@needs_builder
def test_timing_cache_path_is_honoured_only_where_timing_caches_work(tmp_path):
    graph = assign_precision(conv_graph(), PrecisionPolicy("fp16"))
    cache = tmp_path / "caches" / "timing.cache"
    first = backend.build(graph, spec("fp16", timing_cache=cache)).record
    second = backend.build(graph, spec("fp16", timing_cache=cache)).record
    if backend.TRT_MODULE == "tensorrt_rtx":
        # TensorRT-RTX made timing caches no-ops: nothing is written, and the record says why.
        assert first["timing_cache"] == second["timing_cache"] == "not used: timing caches are no-ops in tensorrt_rtx"
        assert not cache.exists()
    else:
        assert (first["timing_cache"], second["timing_cache"]) == ("created", "reused")
        assert cache.stat().st_size > 0


def test_concurrent_cache_writers_take_turns_and_lose_nothing(tmp_path):
    path = tmp_path / "shared" / "timing.cache"

    def append(token: bytes):
        def update(current: bytes | None) -> bytes:
            threading.Event().wait(0.01)  # widen the read-modify-write window
            return (current or b"") + token

        update_file_atomically(path, update)

    threads = [threading.Thread(target=append, args=(f"{i};".encode(),)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(path.read_bytes().decode().strip(";").split(";"), key=int) == [str(i) for i in range(12)]
    assert sorted(p.name for p in path.parent.iterdir()) == ["timing.cache", "timing.cache.lock"]  # no temp files


def plan_entry(record: dict) -> EngineEntry:
    return EngineEntry("tensorrt-cuda-fp16", "tensorrt", "cuda", "fp16", ("engine.plan",), Batching.up_to(1), record)


def test_a_plan_from_tensorrt_rtx_names_what_this_machine_lacks():
    record = {"builder": "tensorrt_rtx", "builder_version": "1.7.1.116", "options": {"max_batch": 1}}
    reason = backend.unavailable_reason(plan_entry(record))
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        assert reason is not None and "CUDA GPU" in reason
    elif torch.cuda.get_device_capability() == (9, 0):
        assert reason is not None and reason.startswith("TensorRT-RTX plans cannot run on compute capability 9.0")
    unknown = backend.unavailable_reason(plan_entry({"builder": "onnxruntime"}))
    assert unknown.startswith("this TensorRT engine names an unknown builder")
