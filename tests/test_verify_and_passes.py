"""Graph.verify() re-infers every node's type with the rules GraphBuilder uses; enum attributes come
back from JSON by their type hints."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

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
from trtmc.passes.precision import PrecisionPolicy, assign_precision
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
    bias = g.constant("bias", r.standard_normal((1, 8, 1, 1)))
    for op in Binary:
        y = g.binary(y, bias, op, f"bias.{op.value}")
    reduced = [g.reduce(y, f"reduce.{op.value}", op, (2, 3), keepdim=False) for op in Reduction]
    t = g.reshape(g.add(reduced[0], g.mul(reduced[1], reduced[2], "r.mul"), "r.add"), (1, 8), "tokens")
    t = g.layer_norm(t, "norm", np.ones(8), np.zeros(8), 1e-6)
    t = g.softmax(g.matmul(g.transpose(t, (0, 2, 1), "t"), t, "attn"), -1, "attn.softmax")
    g.output(g.linear(g.flatten(t, "flat"), "head", r.standard_normal((5, 64))))
    return g.finish()


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
    graph = assign_precision(every_enum_graph(), PrecisionPolicy("fp16"))
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
