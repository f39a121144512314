"""Graph.verify() re-infers every node's type with the rules GraphBuilder uses, and every pass runs it
on its result; enum attributes come back from JSON by their type hints."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil

import numpy as np
import pytest
import torch

import trtmc.passes
from trtmc.graph import (
    ATTRS,
    Activation,
    Binary,
    Conv2dAttrs,
    DType,
    Graph,
    GraphError,
    InputAttrs,
    Node,
    OpKind,
    PoolMode,
    Reduction,
    TensorType,
)
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.fold_batch_norm import fold_batch_norm
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.passes.quantize import quantize
from trtmc.passes.rewrite import graph_pass, rewrite
from trtmc.quantization import LayerOverride, QuantRecipe, calibrate
from trtmc.type_inference import RULES


def every_enum_graph() -> Graph:
    """A small network using every member of every attribute enum, and every op kind but CAST."""
    r = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.input("pixels", (1, 3, 12, 12))
    y = g.conv2d(x, "stem.conv", r.standard_normal((8, 3, 3, 3)), stride=2, padding=(0, 0, 1, 1))
    y = g.scale(y, "stem.bn", r.random(8) + 0.5, r.standard_normal(8))
    for fn in Activation:
        y = g.activation(y, fn, f"act.{fn.value}")
    pooled = [g.pool2d(y, f"pool.{mode.value}", mode, 3, 1, 1) for mode in PoolMode]
    y = g.concat([g.slice(pooled[0], 1, 0, 4, "split.0"), g.slice(pooled[1], 1, 4, 8, "split.1")], 1, "merge")
    y = g.group_norm(y, "merge.norm", 4, np.ones(8), np.zeros(8), 1e-5)
    bias = g.constant("bias", r.standard_normal((1, 8, 1, 1)))
    for op in Binary:
        y = g.binary(y, bias, op, f"bias.{op.value}")
    reduced = [g.reduce(y, f"reduce.{op.value}", op, (2, 3), keepdim=False) for op in Reduction]
    t = g.reshape(g.add(reduced[0], g.mul(reduced[1], reduced[2], "r.mul"), "r.add"), (1, 8), "tokens")
    t = g.layer_norm(t, "norm", np.ones(8), np.zeros(8), 1e-6)
    t = g.softmax(g.matmul(g.transpose(t, (0, 2, 1), "t"), t, "attn"), -1, "attn.softmax")
    heads = g.reshape(t, (1, 8, 8), "mha.heads")
    t = g.reshape(g.attention(heads, heads, heads, "mha", scale=0.5, bias=r.standard_normal((1, 1, 8, 8))), (8, 8), "mha.merge")
    g.output(g.linear(g.flatten(t, "flat"), "head", r.standard_normal((5, 64))))
    return g.finish()


def head_in_fp8(graph: Graph) -> Graph:
    """`graph` (an every_enum_graph) with its head linear op in FP8, by an override: the recipe would
    keep a classifier in the compute precision."""
    scales = calibrate(every_enum_graph(), [torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0))])
    return quantize(graph, QuantRecipe(overrides=(LayerOverride("head", True),)), scales)


def with_type(graph: Graph, name: str, type_: TensorType) -> Graph:
    """`graph` with one node's recorded type replaced, as a buggy pass would leave it."""
    nodes = [dataclasses.replace(n, type=type_) if n.name == name else n for n in graph.nodes]
    return Graph(nodes=nodes, weights=graph.weights, outputs=graph.outputs)


# ---- one table of type rules ---------------------------------------------------------------------


def test_every_op_kind_has_a_type_rule():
    assert set(RULES) == set(OpKind)


def test_verify_rejects_a_node_whose_recorded_shape_its_inputs_do_not_give():
    graph = every_enum_graph()
    assert graph.node("stem.conv").type == TensorType((1, 8, 6, 6), DType.F32)
    broken = with_type(graph, "stem.conv", TensorType((1, 8, 5, 5), DType.F32))
    with pytest.raises(GraphError) as error:
        broken.verify()
    assert str(error.value) == (
        "node 'stem.conv' records f32[1,8,5,5], but conv2d(%pixels: f32[1,3,12,12]) gives f32[1,8,6,6]"
    )


def test_verify_rejects_a_dtype_change_without_a_cast():
    graph = assign_precision(every_enum_graph(), PrecisionPolicy("fp16"))
    broken = with_type(graph, "stem.bn", TensorType((1, 8, 6, 6), DType.F32))
    with pytest.raises(GraphError, match=r"'stem.bn' records f32\[1,8,6,6\], .* gives f16\[1,8,6,6\]; a change of dtype needs a cast"):
        broken.verify()


def test_verify_rejects_a_convolution_whose_weight_does_not_fit_its_input():
    # The graph the TensorRT tests write by hand: GraphBuilder's own check now guards finished graphs too.
    nodes = [
        Node("x", OpKind.INPUT, (), InputAttrs(), TensorType((1, 3, 8, 8), DType.F32), "x"),
        Node("conv", OpKind.CONV2D, ("x",), Conv2dAttrs("conv.weight", None, (1, 1), (1, 1, 1, 1), (1, 1), 1),
             TensorType((1, 4, 8, 8), DType.F32), "conv"),
    ]
    graph = Graph(nodes=nodes, weights={"conv.weight": np.ones((4, 5, 3, 3), np.float32)}, outputs=["conv"])
    with pytest.raises(GraphError, match=r"conv 'conv': input has 3 channels but the weight \(4, 5, 3, 3\)"):
        graph.verify()


def test_builder_refuses_what_verify_refuses_before_adding_anything():
    g = GraphBuilder()
    x = g.input("pixels", (1, 4, 8))
    with pytest.raises(GraphError, match=r"linear 'head': weight \(5, 3\) does not take input \(1, 4, 8\)"):
        g.linear(x, "head", np.zeros((5, 3)))
    assert [n.name for n in g.graph.nodes] == ["pixels"] and not g.graph.weights


# ---- enum attributes round-trip through JSON by their type hints ---------------------------------


def test_enum_attributes_come_back_from_json_as_their_annotated_enums():
    graph = head_in_fp8(assign_precision(every_enum_graph(), PrecisionPolicy("fp16")))
    again = Graph.from_json(json.loads(graph.dumps()), graph.weights)
    assert again.nodes == graph.nodes
    seen: set[type] = set()
    for before, after in zip(graph.nodes, again.nodes):
        for f in dataclasses.fields(before.attrs):
            value = getattr(after.attrs, f.name)
            # str enums compare equal to their strings (Binary.MAX == Reduction.MAX == "max"): check the type.
            assert type(value) is type(getattr(before.attrs, f.name)), (after.name, f.name)
            seen.add(type(value))
    assert {Activation, Binary, Reduction, PoolMode, DType} <= seen
    assert {n.kind for n in graph.nodes} == set(OpKind) == set(ATTRS)


# ---- passes: one rewrite helper, every result verified ------------------------------------------


PASS_CALLS = {
    "fold_batch_norm": lambda graph: fold_batch_norm(graph),
    "assign_precision": lambda graph: assign_precision(graph, PrecisionPolicy("fp16")),
    "quantize": head_in_fp8,
}


def test_every_pass_in_the_passes_package_is_covered_here():
    found = set()
    for module in pkgutil.iter_modules(trtmc.passes.__path__):
        loaded = importlib.import_module(f"trtmc.passes.{module.name}")
        for name, fn in inspect.getmembers(loaded, inspect.isfunction):
            if fn.__module__ == loaded.__name__ and not name.startswith("_") and fn is not rewrite:
                if inspect.signature(fn).return_annotation in ("Graph", Graph):
                    found.add(name)
    assert found == set(PASS_CALLS)


@pytest.mark.parametrize("name", sorted(PASS_CALLS))
def test_every_pass_verifies_the_graph_it_returns(name, monkeypatch):
    graph = every_enum_graph()
    verified: list[int] = []
    real_verify = Graph.verify

    def recording_verify(self):
        verified.append(id(self))
        real_verify(self)

    monkeypatch.setattr(Graph, "verify", recording_verify)
    result = PASS_CALLS[name](graph)
    assert id(result) in verified and result is not graph


def test_a_pass_that_records_a_wrong_shape_is_caught_in_the_pass():
    @graph_pass
    def halve_the_stem(graph: Graph) -> Graph:
        return with_type(graph, "stem.conv", TensorType((1, 8, 3, 3), DType.F32))

    with pytest.raises(GraphError, match=r"pass halve_the_stem made an invalid graph: node 'stem.conv' records f32\[1,8,3,3\]"):
        halve_the_stem(every_enum_graph())


def test_rewrite_renames_the_readers_and_outputs_of_a_dropped_node():
    graph = every_enum_graph()
    out = rewrite(graph, lambda n: [] if n.name == "flat" else [n], renames={"flat": "attn.softmax"})
    # The linear head now reads the softmax directly; its recorded shape no longer fits, and verify says so.
    assert out.node("head").inputs == ("attn.softmax",)
    with pytest.raises(GraphError, match="linear 'head'"):
        out.verify()
    last = rewrite(graph, lambda n: [] if n.name == "head" else [n], renames={"head": "flat"})
    assert last.outputs == ["flat"]
    last.verify()


def test_rewrite_refuses_to_drop_a_node_that_is_read_without_naming_its_replacement():
    with pytest.raises(GraphError, match="dropped 'stem.bn', which is read"):
        rewrite(every_enum_graph(), lambda n: [] if n.name == "stem.bn" else [n])


def test_folding_a_chain_of_convolutions_keeps_every_reader_pointing_at_a_defined_node():
    r = np.random.default_rng(3)
    g = GraphBuilder()
    y = g.input("pixels", (1, 3, 8, 8))
    for i in range(3):
        y = g.conv2d(y, f"conv{i}", r.standard_normal((3, 3, 1, 1)))
        y = g.scale(y, f"bn{i}", r.random(3) + 0.5, r.standard_normal(3))
    g.output(y)
    folded = fold_batch_norm(g.finish())
    assert [(n.name, n.inputs) for n in folded.nodes] == [
        ("pixels", ()), ("conv0", ("pixels",)), ("conv1", ("conv0",)), ("conv2", ("conv1",))
    ]
    assert folded.outputs == ["conv2"]
