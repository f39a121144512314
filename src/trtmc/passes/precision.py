"""Precision assignment: every op gets the dtype the user asked for, convolutions included.

Guarantees, for the graph it returns:
- every float op computes in the requested precision, except
  - ops whose name matches an override pattern, which get the override's dtype, and
  - ops a family marked `sensitive` (softmax, layer-norm statistics, attention matmuls,
    EfficientViT's division), which stay fp32 in fp16 builds; in bf16 builds they stay fp32 unless
    they are convolutions or matrix products, which stay bf16 (bf16 means bf16);
- the graph input and outputs keep the I/O dtype (float32 unless asked otherwise);
- explicit CAST nodes sit wherever a producer's dtype differs from its consumer's, so a strongly
  typed backend needs no implicit conversion.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass

from ..graph import CastAttrs, DType, Graph, GraphError, Node, OpKind, TensorType
from ..precision import precision_named

_MATH_KINDS = (OpKind.CONV2D, OpKind.MATMUL, OpKind.LINEAR)


@dataclass(frozen=True)
class PrecisionPolicy:
    precision: str = "fp32"
    io_dtype: DType = DType.F32
    overrides: tuple[tuple[str, DType], ...] = ()  # (node-name glob, dtype), first match wins

    def __post_init__(self) -> None:
        precision_named(self.precision)  # refuses anything but a compute precision, listing those

    def dtype_for(self, node: Node) -> DType:
        for pattern, dtype in self.overrides:
            if fnmatch.fnmatchcase(node.name, pattern):
                return dtype
        target = precision_named(self.precision).dtype
        if node.sensitive and target is DType.F16:
            return DType.F32
        if node.sensitive and target is DType.BF16 and node.kind not in _MATH_KINDS:
            return DType.F32
        return target


def assign_precision(graph: Graph, policy: PrecisionPolicy) -> Graph:
    """Return a new graph with dtypes assigned and casts inserted (see the module docstring)."""
    nodes: list[Node] = []
    dtype_of: dict[str, DType] = {}
    # (producer, dtype) -> name of the cast node that converts it, so one cast serves all users.
    casts: dict[tuple[str, DType], str] = {}
    taken = {n.name for n in graph.nodes}
    by_name: dict[str, Node] = {}

    def converted(name: str, want: DType) -> str:
        if dtype_of[name] is want:
            return name
        key = (name, want)
        if key not in casts:
            cast_name = f"{name}.to_{want.value}"
            while cast_name in taken:
                cast_name += "_"
            taken.add(cast_name)
            producer = by_name[name]
            nodes.append(
                Node(cast_name, OpKind.CAST, (name,), CastAttrs(want), TensorType(producer.type.shape, want), producer.source)
            )
            dtype_of[cast_name] = want
            casts[key] = cast_name
        return casts[key]

    for node in graph.nodes:
        if node.kind is OpKind.INPUT:
            dtype = policy.io_dtype
            inputs: tuple[str, ...] = ()
        elif node.kind is OpKind.CAST:
            raise GraphError(f"{node.name!r}: precision is assigned once, to a graph without casts")
        else:
            dtype = policy.dtype_for(node)
            inputs = tuple(converted(i, dtype) for i in node.inputs)
        typed = dataclasses.replace(node, inputs=inputs, type=TensorType(node.type.shape, dtype))
        nodes.append(typed)
        by_name[node.name] = typed
        dtype_of[node.name] = dtype

    outputs = [converted(o, policy.io_dtype) for o in graph.outputs]
    result = Graph(nodes=nodes, weights=graph.weights, outputs=outputs)
    result.verify()
    return result
