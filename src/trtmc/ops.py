"""The graph's vocabulary: op kinds, one frozen attributes dataclass per kind, tensor types, nodes.

`trtmc.graph` re-exports every name here; families, passes and backends import them from there.
How each kind's output type follows from its inputs and attributes is `trtmc.type_inference`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .precision import DType

__all__ = [
    "OpKind", "Activation", "Binary", "Reduction", "PoolMode",
    "InputAttrs", "ConstantAttrs", "Conv2dAttrs", "ScaleAttrs", "ActivationAttrs", "Pool2dAttrs", "ReduceAttrs",
    "ElementwiseAttrs", "ConcatAttrs", "SliceAttrs", "LinearAttrs", "MatmulAttrs", "SoftmaxAttrs",
    "NormalizationAttrs", "ReshapeAttrs", "TransposeAttrs", "CastAttrs", "ATTRS",
    "TensorType", "Node", "GraphError", "DType",
]


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
    LEAKY_RELU = "leaky_relu"  # max(x, 0) + negative_slope * min(x, 0), as torch's F.leaky_relu


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
    negative_slope: float | None = None  # LEAKY_RELU's slope below zero; None for every other function


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
    """A graph that breaks an invariant; the message names the node and what is wrong."""
