"""The typed dataflow graph that families emit and backends lower.

Every tensor has a static shape and a dtype. Dimension 0 is the batch: the graph records it as 1 and
it is the only dimension a backend may vary at run time, so every op is batch-preserving (reshapes
and transposes never touch dimension 0). Nodes are named after the checkpoint module they came
from, made unique by one helper, so precision rules, reports and TensorRT layer names map back to
the checkpoint. Weights are float32 numpy arrays owned by the graph; lowerings cast them to the
dtype of the node that uses them.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from .precision import DType


class OpKind(str, Enum):
    INPUT = "input"
    CONSTANT = "constant"
    CONV2D = "conv2d"
    SCALE = "scale"
    ACTIVATION = "activation"
    POOL2D = "pool2d"
    REDUCE = "reduce"
    ELEMENTWISE = "elementwise"
    CONCAT = "concat"
    SLICE = "slice"
    LINEAR = "linear"
    MATMUL = "matmul"
    SOFTMAX = "softmax"
    NORMALIZATION = "normalization"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    CAST = "cast"


class Activation(str, Enum):
    RELU = "relu"
    RELU6 = "relu6"
    SILU = "silu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    HARD_SWISH = "hard_swish"
    HARD_SIGMOID = "hard_sigmoid"
    SIGMOID = "sigmoid"
    TANH = "tanh"


class Binary(str, Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"


class Reduction(str, Enum):
    MEAN = "mean"
    SUM = "sum"
    MAX = "max"


class PoolMode(str, Enum):
    MAX = "max"
    AVG = "avg"


# ---- attributes, one frozen dataclass per op kind -------------------------------------------


@dataclass(frozen=True)
class InputAttrs:
    pass


@dataclass(frozen=True)
class ConstantAttrs:
    weight: str


@dataclass(frozen=True)
class Conv2dAttrs:
    weight: str
    bias: str | None
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right: TF "SAME" is asymmetric
    dilation: tuple[int, int]
    groups: int


@dataclass(frozen=True)
class ScaleAttrs:
    """y = x * scale + shift, per channel along `axis` (an inference batch norm)."""

    scale: str
    shift: str
    axis: int = 1


@dataclass(frozen=True)
class ActivationAttrs:
    fn: Activation


@dataclass(frozen=True)
class Pool2dAttrs:
    mode: PoolMode
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, left, bottom, right
    count_include_pad: bool = True


@dataclass(frozen=True)
class ReduceAttrs:
    op: Reduction
    axes: tuple[int, ...]
    keepdim: bool


@dataclass(frozen=True)
class ElementwiseAttrs:
    op: Binary


@dataclass(frozen=True)
class ConcatAttrs:
    axis: int


@dataclass(frozen=True)
class SliceAttrs:
    axis: int
    start: int
    stop: int


@dataclass(frozen=True)
class LinearAttrs:
    """y = x @ weight.T + bias over the last axis; weight is [out, in]."""

    weight: str
    bias: str | None


@dataclass(frozen=True)
class MatmulAttrs:
    """Batched matrix product of two tensors; `transpose_b` swaps the last two axes of b."""

    transpose_b: bool = False


@dataclass(frozen=True)
class SoftmaxAttrs:
    axis: int


@dataclass(frozen=True)
class NormalizationAttrs:
    """Layer norm over one axis (the channel axis: 1 for NCHW maps, -1 for tokens)."""

    axis: int
    weight: str
    bias: str
    eps: float


@dataclass(frozen=True)
class ReshapeAttrs:
    shape: tuple[int, ...]  # without the batch dimension


@dataclass(frozen=True)
class TransposeAttrs:
    perm: tuple[int, ...]  # perm[0] == 0: the batch stays first


@dataclass(frozen=True)
class CastAttrs:
    dtype: DType


ATTRS: dict[OpKind, type] = {
    OpKind.INPUT: InputAttrs,
    OpKind.CONSTANT: ConstantAttrs,
    OpKind.CONV2D: Conv2dAttrs,
    OpKind.SCALE: ScaleAttrs,
    OpKind.ACTIVATION: ActivationAttrs,
    OpKind.POOL2D: Pool2dAttrs,
    OpKind.REDUCE: ReduceAttrs,
    OpKind.ELEMENTWISE: ElementwiseAttrs,
    OpKind.CONCAT: ConcatAttrs,
    OpKind.SLICE: SliceAttrs,
    OpKind.LINEAR: LinearAttrs,
    OpKind.MATMUL: MatmulAttrs,
    OpKind.SOFTMAX: SoftmaxAttrs,
    OpKind.NORMALIZATION: NormalizationAttrs,
    OpKind.RESHAPE: ReshapeAttrs,
    OpKind.TRANSPOSE: TransposeAttrs,
    OpKind.CAST: CastAttrs,
}

# Attribute fields that hold enum values, for deserialisation.
_ENUM_FIELDS = {
    "fn": Activation,
    "op": None,  # Binary or Reduction, decided by the kind
    "mode": PoolMode,
    "dtype": DType,
}


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class Node:
    name: str
    kind: OpKind
    inputs: tuple[str, ...]
    attrs: Any
    type: TensorType
    source: str  # the checkpoint module path the op came from
    sensitive: bool = False  # overflow-prone in fp16: the precision pass may keep it in fp32

    def weight_keys(self) -> list[str]:
        keys = []
        for f in ("weight", "bias", "scale", "shift"):
            value = getattr(self.attrs, f, None)
            if isinstance(value, str):
                keys.append(value)
        return keys

    def __str__(self) -> str:
        args = ", ".join(f"%{i}" for i in self.inputs)
        details = []
        for f in dataclasses.fields(self.attrs):
            value = getattr(self.attrs, f.name)
            if f.name in ("weight", "bias", "scale", "shift") or value is None:
                continue
            details.append(f"{f.name}={value.value if isinstance(value, Enum) else value}")
        if self.sensitive:
            details.append("sensitive")
        inner = ", ".join([a for a in [args, ", ".join(details)] if a])
        return f"%{self.name} : {self.type} = {self.kind.value}({inner})"


class GraphError(ValueError):
    pass


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
        """Topological order, unique names, known weights and consistent dtypes."""
        seen: dict[str, Node] = {}
        for n in self.nodes:
            if n.name in seen:
                raise GraphError(f"duplicate node name {n.name!r}")
            if not isinstance(n.attrs, ATTRS[n.kind]):
                raise GraphError(f"node {n.name!r}: {n.kind.value} needs {ATTRS[n.kind].__name__}")
            for i in n.inputs:
                if i not in seen:
                    raise GraphError(f"node {n.name!r} reads {i!r} before it is defined")
                if n.kind is not OpKind.CAST and seen[i].type.dtype is not n.type.dtype:
                    raise GraphError(
                        f"node {n.name!r} ({n.type.dtype.value}) reads {i!r} "
                        f"({seen[i].type.dtype.value}) without a cast"
                    )
            for key in n.weight_keys():
                if key not in self.weights:
                    raise GraphError(f"node {n.name!r} refers to missing weight {key!r}")
            if n.type.shape and n.type.shape[0] != 1:
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
    values = {}
    for f in dataclasses.fields(cls):
        value = data[f.name]
        if f.name == "op":
            value = (Reduction if kind is OpKind.REDUCE else Binary)(value)
        elif f.name in _ENUM_FIELDS and _ENUM_FIELDS[f.name] is not None:
            value = _ENUM_FIELDS[f.name](value)
        elif isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    return cls(**values)
