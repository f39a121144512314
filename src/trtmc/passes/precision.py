"""Precision assignment: every op gets the dtype the user asked for, convolutions included.

Guarantees, for the graph it returns:
- every float op computes in the requested precision, except
  - ops whose name matches an override pattern, which get the override's dtype, and
  - ops a family marked `sensitive` (softmax, layer-norm statistics, unfused attention matmuls,
    EfficientViT's division), which stay fp32 in fp16 builds; in bf16 builds they stay fp32 unless
    they are convolutions or matrix products, which stay bf16 (bf16 means bf16);
- an ATTENTION op computes in the requested precision, even if marked sensitive. Unfused, the
  scores q k^T would be an fp16 tensor that can overflow and the softmax would sum in fp16, which is
  why those ops are sensitive. The attention op's lowerings are fused kernels (flash, memory-efficient
  or cuDNN attention behind `scaled_dot_product_attention`, torch's CPU flash kernel, TensorRT's
  attention layer) that form the scores in fp32 accumulators and keep the softmax's running max and
  sum in fp32; only q, k, v, the probabilities fed to the second product and the output are rounded
  to the build's precision. That is what the fp32 island was for, without an fp32 copy of q, k, v
  and of the scores in memory. Where TensorRT's attention layer cannot take the op (a value width
  other than the key's, a TensorRT before 10.14), its lowering computes it in fp32 from primitives;
- the graph input and outputs keep the I/O dtype (float32 unless asked otherwise);
- explicit CAST nodes sit wherever a producer's dtype differs from its consumer's (one per producer
  and dtype, right before its first reader; an output's cast to the I/O dtype right after the output
  op), so a strongly typed backend needs no implicit conversion;
- every override pattern matches at least one op: a pattern that matches none is refused
  (UnmatchedOverride names it and shows real op names), never silently ignored.

The policy names a compute precision. Quantized formats (FP8, INT8) are not one: a quantization pass,
with its recipe and calibration scales, puts them into a graph that has been through this one.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from dataclasses import dataclass

from ..graph import CastAttrs, DType, Graph, GraphError, Node, OpKind, TensorType
from ..precision import precision_named
from .rewrite import graph_pass, rewrite

_MATH_KINDS = (OpKind.CONV2D, OpKind.MATMUL, OpKind.LINEAR)
_EXAMPLES = 3  # op names an unmatched-pattern error shows


class UnmatchedOverride(ValueError):
    """Override patterns (`--fp32-layers`, a quantization recipe's) that match no op; the message names
    each and shows real op names."""


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
        if node.kind is OpKind.ATTENTION:
            return target  # its kernels keep the statistics in fp32 (see the module docstring)
        if node.sensitive and target is DType.F16:
            return DType.F32
        if node.sensitive and target is DType.BF16 and node.kind not in _MATH_KINDS:
            return DType.F32
        return target

    def require_matches(self, graph: Graph) -> None:
        """Raise UnmatchedOverride unless every override pattern matches an op of `graph`."""
        patterns = [p for p, _ in self.overrides]
        require_matches(patterns, [n.name for n in graph.nodes], "op of this graph", "fix the pattern (--fp32-layers GLOB)")


def require_matches(patterns: list[str], names: list[str], ops: str, fix: str) -> None:
    """Raise UnmatchedOverride naming each glob of `patterns` that matches none of the op `names`."""
    unmatched = [p for p in patterns if not fnmatch.filter(names, p)]
    if unmatched:
        examples = difflib.get_close_matches(unmatched[0], names, n=_EXAMPLES, cutoff=0.0)
        raise UnmatchedOverride(
            f"layer pattern{'s' if len(unmatched) > 1 else ''} {', '.join(repr(p) for p in unmatched)} "
            f"match{'' if len(unmatched) > 1 else 'es'} no {ops}; ops are named after checkpoint "
            f"modules, e.g. {', '.join(repr(e) for e in examples)}: {fix}"
        )


@graph_pass
def assign_precision(graph: Graph, policy: PrecisionPolicy) -> Graph:
    """Return a new graph with dtypes assigned and casts inserted (see the module docstring)."""
    policy.require_matches(graph)
    typed: dict[str, Node] = {}
    # (producer, dtype) -> name of the cast node that converts it, so one cast serves all users.
    casts: dict[tuple[str, DType], str] = {}
    taken = {n.name for n in graph.nodes}

    def read(name: str, want: DType, emitted: list[Node]) -> str:
        """The name to read `name` as `want` by, appending the cast to `emitted` the first time."""
        producer = typed[name]
        if producer.type.dtype is want:
            return name
        key = (name, want)
        if key not in casts:
            cast_name = f"{name}.to_{want.value}"
            while cast_name in taken:
                cast_name += "_"
            taken.add(cast_name)
            emitted.append(
                Node(cast_name, OpKind.CAST, (name,), CastAttrs(want), TensorType(producer.type.shape, want), producer.source)
            )
            casts[key] = cast_name
        return casts[key]

    def assign(node: Node) -> list[Node]:
        if node.kind in (OpKind.CAST, OpKind.QUANTIZE, OpKind.DEQUANTIZE):  # quantize runs after this pass
            raise GraphError(f"{node.name!r}: precision is assigned once, to a graph without casts or quantization")
        dtype = policy.io_dtype if node.kind is OpKind.INPUT else policy.dtype_for(node)
        emitted: list[Node] = []
        inputs = tuple(read(i, dtype, emitted) for i in node.inputs)
        typed[node.name] = dataclasses.replace(node, inputs=inputs, type=TensorType(node.type.shape, dtype))
        emitted.append(typed[node.name])
        if node.name in graph.outputs:
            read(node.name, policy.io_dtype, emitted)
        return emitted

    return rewrite(graph, assign, outputs=lambda name: casts.get((name, policy.io_dtype), name))
