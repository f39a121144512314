"""The graph's vocabulary: op kinds, one frozen attributes dataclass per kind, tensor types, nodes.

`trtmc.graph` re-exports every name here; families, passes and backends import them from there.
How each kind's output type follows from its inputs and attributes is `trtmc.type_inference`.

Quantized tensors (FP8 E4M3, INT8: the `quantized` rows of `trtmc.precision`) appear only between a
QUANTIZE and the DEQUANTIZE that reads it; no other op reads them. A quantized convolution or linear
op reads its weight as a second input instead of from its attributes (`weight=None`):

    %x.q  : f8e4m3[1,16,56,56] = quantize(%x, format=f8e4m3)            per-tensor activation scale
    %x.dq : f16[1,16,56,56]    = dequantize(%x.q, format=f8e4m3)
    %conv.weight.q  : f8e4m3[24,16,1,1] = constant()                      the kernel, stored quantized
    %conv.weight.dq : f16[24,16,1,1]    = dequantize(%conv.weight.q, axis=0, format=f8e4m3)
    %conv : f16[1,24,56,56] = conv2d(%x.dq, %conv.weight.dq, ...)         bias stays in its attributes

This is the pattern TensorRT's strongly typed networks fuse into an FP8/INT8 convolution (a kernel
tensor set as the layer's second input), and the one torch lowers literally, so one graph means the
same in both backends; a weight scale kept in the conv's attributes instead would have hidden the
quantization from verify() and from every reader of the graph. A quantized constant is a stored
weight in its own layout ([out, in, kh, kw], [out, in]), not a tensor broadcast over the batch, so
its dimension 0 is the output channel, the axis its per-channel dequantize scales; it and its
dequantized value are the graph's only tensors whose dimension 0 is not the batch.
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
    "NormalizationAttrs", "GroupNormAttrs", "ReshapeAttrs", "TransposeAttrs", "CastAttrs", "AttentionAttrs",
    "QuantAttrs", "ATTRS",
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
    GROUP_NORM = "group_norm"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    CAST = "cast"
    ATTENTION = "attention"
    QUANTIZE = "quantize"
    DEQUANTIZE = "dequantize"


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
    SQRT = "sqrt"  # torch.sqrt, for L2 norms (ConvNeXt V2's GRN, EdgeNeXt's channel attention)
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
    weight: str | None  # None: the kernel is the node's second input (a dequantized weight)
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

    weight: str | None  # None: the weight is the node's second input (a dequantized weight)
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
class GroupNormAttrs:
    """Group norm of an NCHW map: statistics over each of `groups` runs of channels and all pixels,
    then a per-channel affine (torch.nn.GroupNorm)."""

    groups: int
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


@dataclass(frozen=True)
class AttentionAttrs:
    """softmax(q k^T * scale + bias) v over inputs q, k, v, each [N, heads, tokens, head_dim]
    (q and k as wide, k and v as long; v's width is the output's).

    One op rather than matmul-softmax-matmul so that backends can run a fused kernel (flash or
    memory-efficient attention, TensorRT's attention layer) that keeps the softmax statistics in
    fp32 whatever the op's dtype. `bias` is a weight that broadcasts to [1, heads, q tokens,
    k tokens] and is the same for every image (a relative position bias, a window mask).
    """

    scale: float
    bias: str | None = None


@dataclass(frozen=True)
class QuantAttrs:
    """QUANTIZE: x / scale, saturated and rounded into `format`. DEQUANTIZE: a `format` value times
    scale, in the node's dtype. `scale` is a float32 weight of shape (1,) with `axis` None (one scale
    per tensor), or one scale per index of `axis` (per channel: axis 0 of a stored weight)."""

    scale: str
    axis: int | None
    format: DType  # the quantized dtype, e.g. DType.F8E4M3


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
    OpKind.GROUP_NORM: GroupNormAttrs,
    OpKind.RESHAPE: ReshapeAttrs,
    OpKind.TRANSPOSE: TransposeAttrs,
    OpKind.CAST: CastAttrs,
    OpKind.ATTENTION: AttentionAttrs,
    OpKind.QUANTIZE: QuantAttrs,
    OpKind.DEQUANTIZE: QuantAttrs,
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

    def weight_dtype(self, key: str) -> DType:
        """The dtype a lowering hands weight `key` to this node in: the node's own dtype, except a
        quantize/dequantize scale, which stays f32 whatever format it scales."""
        if self.kind in (OpKind.QUANTIZE, OpKind.DEQUANTIZE) and key == self.attrs.scale:
            return DType.F32
        return self.type.dtype

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
            if value is None or (f.name in ("weight", "bias", "scale", "shift") and isinstance(value, str)):
                continue  # weight keys: the weights travel separately
            details.append(f"{f.name}={value.value if isinstance(value, Enum) else value}")
        if self.sensitive:
            details.append("sensitive")
        inner = ", ".join([a for a in [args, ", ".join(details)] if a])
        return f"%{self.name} : {self.type} = {self.kind.value}({inner})"


class GraphError(ValueError):
    """A graph that breaks an invariant; the message names the node and what is wrong."""
