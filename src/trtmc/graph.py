"""The typed dataflow graph that families emit and backends lower.

Every tensor has a static shape and a dtype. Dimension 0 is the batch (of every tensor but a stored
quantized weight: see `trtmc.ops`): the graph records it as 1 and it is the only dimension a backend
may vary at run time, so every op is batch-preserving (reshapes and transposes never touch
dimension 0). Nodes are named after the checkpoint module they came
from, made unique by one helper, so precision rules, reports and TensorRT layer names map back to
the checkpoint. Weights are float32 numpy arrays owned by the graph; lowerings cast them to the
dtype of the node that uses them.

The vocabulary (op kinds, their attributes, nodes) lives in `trtmc.ops` and is re-exported here;
`verify()` re-infers every node's type with the rules in `trtmc.type_inference`, the same rules
`GraphBuilder` applies, and every pass runs it on its result.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

# The vocabulary is re-exported: families, passes, backends and tests import it from here.
from .ops import *  # noqa: F401,F403
from .ops import ATTRS, GraphError, Node, OpKind, TensorType
from .precision import DType
from .type_inference import Site, holds_weight, infer_type, input_nodes


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)

    # ---- queries ----

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.kind is OpKind.INPUT]

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                users[i].append(n)
        return users

    def op_counts(self) -> dict[str, int]:
        """Op counts keyed by 'kind:dtype', e.g. 'conv2d:f16'."""
        return dict(sorted(Counter(f"{n.kind.value}:{n.type.dtype.value}" for n in self.nodes).items()))

    def __str__(self) -> str:
        lines = [str(n) for n in self.nodes]
        lines.append("return " + ", ".join(f"%{o}" for o in self.outputs))
        return "\n".join(lines)

    # ---- invariants ----

    def verify(self) -> None:
        """Topological order, unique names, known weights, batch 1 (stored quantized weights aside: see
        `trtmc.ops`), and every node's recorded type equal to what its kind's rule
        (`trtmc.type_inference`) infers from its inputs, attributes and weights; raises GraphError
        naming the first node that breaks one."""
        seen: dict[str, Node] = {}
        for n in self.nodes:
            if n.name in seen:
                raise GraphError(f"duplicate node name {n.name!r}")
            if not isinstance(n.attrs, ATTRS[n.kind]):
                raise GraphError(f"node {n.name!r}: {n.kind.value} needs {ATTRS[n.kind].__name__}")
            site = Site(n.name, input_nodes(n.inputs, seen, n.name), self.weights, declared=n.type)
            for key in n.weight_keys():
                site.weight(key)
            implied = infer_type(n.kind, n.attrs, site)
            if implied != n.type:
                reads = ", ".join(f"%{i.name}: {i.type}" for i in site.inputs)
                fix = "; a change of dtype needs a cast" if implied.shape == n.type.shape else ""
                raise GraphError(
                    f"node {n.name!r} records {n.type}, but {n.kind.value}({reads}) gives {implied}{fix}"
                )
            if n.type.shape and n.type.shape[0] != 1 and not holds_weight(n, site.inputs):
                raise GraphError(f"node {n.name!r}: the graph records batch 1, got {n.type.shape}")
            seen[n.name] = n
        for o in self.outputs:
            if o not in seen:
                raise GraphError(f"output {o!r} is not a node")
        if not self.outputs:
            raise GraphError("graph has no outputs")

    # ---- serialisation (weights travel separately, as safetensors) ----

    def to_json(self) -> dict:
        return {
            "nodes": [
                {
                    "name": n.name,
                    "kind": n.kind.value,
                    "inputs": list(n.inputs),
                    "attrs": _attrs_to_json(n.attrs),
                    "shape": list(n.type.shape),
                    "dtype": n.type.dtype.value,
                    "source": n.source,
                    "sensitive": n.sensitive,
                }
                for n in self.nodes
            ],
            "outputs": list(self.outputs),
        }

    @classmethod
    def from_json(cls, data: dict, weights: dict[str, np.ndarray]) -> "Graph":
        nodes = []
        for d in data["nodes"]:
            kind = OpKind(d["kind"])
            nodes.append(
                Node(
                    name=d["name"],
                    kind=kind,
                    inputs=tuple(d["inputs"]),
                    attrs=_attrs_from_json(kind, d["attrs"]),
                    type=TensorType(tuple(d["shape"]), DType(d["dtype"])),
                    source=d["source"],
                    sensitive=bool(d.get("sensitive", False)),
                )
            )
        graph = cls(nodes=nodes, weights=dict(weights), outputs=list(data["outputs"]))
        graph.verify()
        return graph

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)


def _attrs_to_json(attrs: Any) -> dict:
    out = {}
    for f in dataclasses.fields(attrs):
        value = getattr(attrs, f.name)
        out[f.name] = value.value if isinstance(value, Enum) else (list(value) if isinstance(value, tuple) else value)
    return out


def _attrs_from_json(kind: OpKind, data: dict) -> Any:
    cls = ATTRS[kind]
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _decode(hints[f.name], data[f.name]) for f in dataclasses.fields(cls)})


def _decode(hint: Any, value: Any) -> Any:
    """A JSON value as the attribute's annotated type: enums by value, tuples from lists."""
    if value is None:
        return None
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple(value)
    if origin in (typing.Union, types.UnionType):  # `X | None`: decode as X
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _decode(inner, value)
    return value
