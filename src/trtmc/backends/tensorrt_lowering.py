"""Lowering the graph to a strongly typed TensorRT network: one function per op kind.

`TRT_LOWERINGS` parallels `torch_lowering.LOWERINGS` key for key, and each entry means exactly what
its torch twin means. Precision comes only from tensor types: every constant and weight is handed to
TensorRT in the dtype of the node that reads it (bf16 and FP8 through torch, since numpy has none;
quantize/dequantize scales in float32), and the precision pass has already put a CAST wherever
dtypes change. Layers are named `[kind]-<node name>` (`[kind]-<node name>/<role>` for helper
layers), so TensorRT's messages and reports map back to the checkpoint.

`trt` is the `tensorrt` module when it imports, else `tensorrt_rtx` (same API family; see the notes
where they differ), else None (`tensorrt_common` chooses): the table still imports, so the parity
test and `unavailable_reason` work on machines without either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..graph import Activation, Binary, DType, Graph, Node, OpKind, PoolMode, Reduction
from ..precision import precision_of
from .tensorrt_common import trt

INPUT_NAME = "pixels"
OUTPUT_NAME = "logits"


class UnsupportedNode(ValueError):
    """A node this lowering cannot express; the message names the op, the node and the reason."""


def trt_dtype(dtype: DType):
    return precision_of(dtype).tensorrt_dtype(trt)


def host_array(value: np.ndarray, dtype: DType) -> np.ndarray:
    """The bytes TensorRT reads for `value` in `dtype` (see `Precision.host_array`)."""
    return precision_of(dtype).host_array(value)


@dataclass
class Lowerer:
    """What a lowering needs: the network, the graph's weights, and the arrays TensorRT points into."""

    network: Any
    graph: Graph
    # TensorRT keeps raw pointers into these arrays until the plan is built.
    keepalive: list[np.ndarray] = field(default_factory=list)
    node: Node | None = None
    _batch: Any = None
    _shapes: dict = field(default_factory=dict)

    # ---- weights and constants ----

    def weights(self, key: str | None, dtype: DType | None = None):
        """The graph weight `key` as trt.Weights in `dtype` (default: the current node's dtype)."""
        if key is None:
            return None
        return self.array_weights(self.graph.weights[key], dtype or self.node.type.dtype)

    def array_weights(self, value: np.ndarray, dtype: DType):
        array = host_array(value, dtype)
        self.keepalive.append(array)
        return trt.Weights(trt_dtype(dtype), array.ctypes.data, array.size)

    def constant(self, value: np.ndarray, shape: tuple[int, ...], role: str, dtype: DType | None = None):
        """A constant tensor of `shape` holding `value` in `dtype` (default: the node's dtype)."""
        value = np.asarray(value, dtype=np.float32).reshape(shape)
        layer = self.network.add_constant(tuple(shape), self.array_weights(value, dtype or self.node.type.dtype))
        return self.out(layer, role)

    def channel_shape(self, axis: int) -> tuple[int, ...]:
        """[1, .., C, .., 1]: a per-channel constant that broadcasts along every other axis."""
        shape = [1] * len(self.node.type.shape)
        shape[axis] = self.node.type.shape[axis]
        return tuple(shape)

    def batched_shape(self, rest: tuple[int, ...]):
        """A shape tensor [N, *rest] with N, the batch, read from the input at run time (shared by
        every op that asks for the same shape, so its layers are named after the shape)."""
        key = tuple(int(d) for d in rest)
        if key not in self._shapes:
            if self._batch is None:
                shape = self.network.add_shape(self.network.get_input(0))
                shape.name = f"[shape]-{INPUT_NAME}"
                batch = self.network.add_slice(shape.get_output(0), (0,), (1,), (1,))
                batch.name = "[shape]-batch"
                self._batch = batch.get_output(0)
            array = np.asarray(key, dtype=np.int64)
            self.keepalive.append(array)
            dims = self.network.add_constant(array.shape, trt.Weights(trt.int64, array.ctypes.data, array.size))
            dims.name = f"[shape]-{list(key)}"
            layer = self.network.add_concatenation([self._batch, dims.get_output(0)])
            layer.name = f"[shape]-{['N', *key]}"
            self._shapes[key] = layer.get_output(0)
        return self._shapes[key]

    # ---- layers ----

    def named(self, layer, role: str | None = None):
        if layer is None:
            raise UnsupportedNode(f"TensorRT returned no layer for {self.node.kind.value} {self.node.name!r}")
        layer.name = f"[{self.node.kind.value}]-{self.node.name}" + (f"/{role}" if role else "")
        return layer

    def out(self, layer, role: str | None = None):
        """Name the layer and return its output tensor."""
        return self.named(layer, role).get_output(0)

    def binary(self, a, b, op: str, role: str | None = None):
        return self.out(self.network.add_elementwise(a, b, getattr(trt.ElementWiseOperation, op)), role)

    def activation(self, x, kind: str, role: str | None = None, alpha: float | None = None, beta: float | None = None):
        layer = self.named(self.network.add_activation(x, getattr(trt.ActivationType, kind)), role)
        if alpha is not None:
            layer.alpha = alpha
        if beta is not None:
            layer.beta = beta
        return layer.get_output(0)


Lowering = Callable[[Lowerer, Node, list], Any]
TRT_LOWERINGS: dict[OpKind, Lowering] = {}


def lowering(kind: OpKind):
    def register(fn: Lowering) -> Lowering:
        if kind in TRT_LOWERINGS:
            raise RuntimeError(f"TensorRT lowering for {kind.value} registered twice")
        TRT_LOWERINGS[kind] = fn
        return fn

    return register


def _mask(axes) -> int:
    return sum(1 << a for a in axes)


@lowering(OpKind.INPUT)
def _input(lw, node, args):
    if lw.network.num_inputs:
        raise UnsupportedNode(f"input {node.name!r}: a TensorRT engine here takes one input, {INPUT_NAME!r}")
    return lw.network.add_input(INPUT_NAME, trt_dtype(node.type.dtype), (-1, *node.type.shape[1:]))


@lowering(OpKind.CONSTANT)
def _constant(lw, node, args):
    return lw.constant(lw.graph.weights[node.attrs.weight], node.type.shape, None)


@lowering(OpKind.CONV2D)
def _conv2d(lw, node, args):
    a = node.attrs
    stored = a.weight is not None  # else the kernel is args[1], a dequantized weight tensor
    out_c, _, kh, kw = lw.graph.weights[a.weight].shape if stored else tuple(args[1].shape)
    extra = {"bias": lw.weights(a.bias)} if a.bias else {}
    kernel = lw.weights(a.weight) if stored else trt.Weights()
    layer = lw.named(lw.network.add_convolution_nd(args[0], out_c, (kh, kw), kernel, **extra))
    if not stored:
        layer.set_input(1, args[1])
    layer.stride_nd = a.stride
    layer.dilation_nd = a.dilation
    layer.num_groups = a.groups
    top, left, bottom, right = a.padding  # TF "SAME" is asymmetric: pre and post padding differ
    layer.pre_padding = (top, left)
    layer.post_padding = (bottom, right)
    return layer.get_output(0)


@lowering(OpKind.SCALE)
def _scale(lw, node, args):
    a = node.attrs
    if len(node.type.shape) >= 3:  # IScaleLayer needs rank 3 or more
        layer = lw.network.add_scale_nd(
            args[0], trt.ScaleMode.CHANNEL, lw.weights(a.shift), lw.weights(a.scale), None, a.axis
        )
        return lw.out(layer)
    shape = lw.channel_shape(a.axis)
    scaled = lw.binary(args[0], lw.constant(lw.graph.weights[a.scale], shape, "scale"), "PROD", "mul")
    return lw.binary(scaled, lw.constant(lw.graph.weights[a.shift], shape, "shift"), "SUM")


# Activations TensorRT has as one layer: name -> (ActivationType, alpha, beta).
_ACTIVATIONS = {
    Activation.RELU: ("RELU", None, None),
    Activation.RELU6: ("CLIP", 0.0, 6.0),
    Activation.GELU: ("GELU_ERF", None, None),
    Activation.GELU_TANH: ("GELU_TANH", None, None),
    # torch: relu6(x + 3) / 6 == clamp(x / 6 + 0.5, 0, 1), TensorRT's max(0, min(1, alpha * x + beta)).
    Activation.HARD_SIGMOID: ("HARD_SIGMOID", 1.0 / 6.0, 0.5),
    Activation.SIGMOID: ("SIGMOID", None, None),
    Activation.TANH: ("TANH", None, None),
}
# x * gate(x): the gate is one of the above.
_GATED = {Activation.SILU: Activation.SIGMOID, Activation.HARD_SWISH: Activation.HARD_SIGMOID}
# Functions TensorRT has as a unary layer, not an activation: name -> UnaryOperation.
_UNARY = {Activation.SQRT: "SQRT"}


def _one_activation(lw, x, fn: Activation, role: str | None = None):
    kind, alpha, beta = _ACTIVATIONS[fn]
    return lw.activation(x, kind, role, alpha, beta)


@lowering(OpKind.ACTIVATION)
def _activation(lw, node, args):
    fn = node.attrs.fn
    if fn is Activation.LEAKY_RELU:  # TensorRT's LEAKY_RELU: x >= 0 ? x : alpha * x
        return lw.activation(args[0], "LEAKY_RELU", alpha=node.attrs.negative_slope)
    if fn in _UNARY:
        return lw.out(lw.network.add_unary(args[0], getattr(trt.UnaryOperation, _UNARY[fn])))
    if fn in _GATED:
        return lw.binary(args[0], _one_activation(lw, args[0], _GATED[fn], "gate"), "PROD")
    return _one_activation(lw, args[0], fn)


@lowering(OpKind.POOL2D)
def _pool2d(lw, node, args):
    a = node.attrs
    kind = trt.PoolingType.MAX if a.mode is PoolMode.MAX else trt.PoolingType.AVERAGE
    layer = lw.named(lw.network.add_pooling_nd(args[0], kind, a.kernel))
    layer.stride_nd = a.stride
    top, left, bottom, right = a.padding  # max pooling never picks a padded value (torch pads -inf)
    layer.pre_padding = (top, left)
    layer.post_padding = (bottom, right)
    if a.mode is PoolMode.AVG:
        layer.average_count_excludes_padding = not a.count_include_pad
    return layer.get_output(0)


_REDUCTIONS = {Reduction.MEAN: "AVG", Reduction.SUM: "SUM", Reduction.MAX: "MAX"}


@lowering(OpKind.REDUCE)
def _reduce(lw, node, args):
    a = node.attrs
    op = getattr(trt.ReduceOperation, _REDUCTIONS[a.op])
    return lw.out(lw.network.add_reduce(args[0], op, _mask(a.axes), a.keepdim))


_BINARY = {Binary.ADD: "SUM", Binary.SUB: "SUB", Binary.MUL: "PROD", Binary.DIV: "DIV", Binary.MAX: "MAX", Binary.MIN: "MIN"}


@lowering(OpKind.ELEMENTWISE)
def _elementwise(lw, node, args):
    # Same rank on both sides (GraphBuilder checks); TensorRT broadcasts size-1 axes like torch.
    return lw.binary(args[0], args[1], _BINARY[node.attrs.op])


@lowering(OpKind.CONCAT)
def _concat(lw, node, args):
    layer = lw.named(lw.network.add_concatenation(args))
    layer.axis = node.attrs.axis
    return layer.get_output(0)


@lowering(OpKind.SLICE)
def _slice(lw, node, args):
    a = node.attrs
    rank = len(node.type.shape)
    start = tuple(a.start if i == a.axis else 0 for i in range(rank))
    layer = lw.named(lw.network.add_slice(args[0], start, node.type.shape, (1,) * rank))
    if args[0].shape[0] == -1:  # a batched tensor: its batch size is known only at run time
        layer.set_input(2, lw.batched_shape(node.type.shape[1:]))
    return layer.get_output(0)


@lowering(OpKind.LINEAR)
def _linear(lw, node, args):
    a = node.attrs
    lead = (1,) * (len(node.type.shape) - 2)  # the weight broadcasts over the batch (and token) axes
    if a.weight is not None:
        weight = lw.graph.weights[a.weight]
        w = lw.constant(weight, lead + weight.shape, "weight")
    else:  # a dequantized weight tensor [out, in]
        w = _reshaped(lw, args[1], lead + tuple(args[1].shape), "weight") if lead else args[1]
    matmul = lw.network.add_matrix_multiply(args[0], trt.MatrixOperation.NONE, w, trt.MatrixOperation.TRANSPOSE)
    y = lw.out(matmul, "matmul" if a.bias else None)
    if not a.bias:
        return y
    return lw.binary(y, lw.constant(lw.graph.weights[a.bias], lw.channel_shape(-1), "bias"), "SUM")


@lowering(OpKind.MATMUL)
def _matmul(lw, node, args):
    op_b = trt.MatrixOperation.TRANSPOSE if node.attrs.transpose_b else trt.MatrixOperation.NONE
    return lw.out(lw.network.add_matrix_multiply(args[0], trt.MatrixOperation.NONE, args[1], op_b))


@lowering(OpKind.SOFTMAX)
def _softmax(lw, node, args):
    layer = lw.named(lw.network.add_softmax(args[0]))
    layer.axes = 1 << node.attrs.axis
    return layer.get_output(0)


@lowering(OpKind.NORMALIZATION)
def _normalization(lw, node, args):
    a = node.attrs
    shape = lw.channel_shape(a.axis)
    scale = lw.constant(lw.graph.weights[a.weight], shape, "weight")
    bias = lw.constant(lw.graph.weights[a.bias], shape, "bias")
    # add_normalization_v2 supersedes add_normalization from TensorRT 10.15 (and in TensorRT-RTX);
    # for one group (layer norm) both mean the same.
    add = getattr(lw.network, "add_normalization_v2", None) or lw.network.add_normalization
    layer = lw.named(add(args[0], scale, bias, 1 << a.axis))
    layer.epsilon = a.eps
    return layer.get_output(0)


@lowering(OpKind.GROUP_NORM)
def _group_norm(lw, node, args):
    a = node.attrs
    spatial = _mask(range(2, len(node.type.shape)))  # with num_groups, a group's statistics span its pixels
    if hasattr(lw.network, "add_normalization_v2"):
        # v2 takes torch's per-channel affine, [1, C, 1, 1].
        shape = lw.channel_shape(1)
        weight = lw.constant(lw.graph.weights[a.weight], shape, "weight")
        bias = lw.constant(lw.graph.weights[a.bias], shape, "bias")
        return _grouped(lw.named(lw.network.add_normalization_v2(args[0], weight, bias, spatial)), a).get_output(0)
    # Before TensorRT 10.15 the layer's scale and bias are per group, [1, G, 1, 1]: normalize with the
    # identity there, then apply the per-channel affine in a scale layer.
    unit = np.ones((1, a.groups, 1, 1), np.float32)
    one, zero = lw.constant(unit, unit.shape, "one"), lw.constant(0 * unit, unit.shape, "zero")
    layer = _grouped(lw.named(lw.network.add_normalization(args[0], one, zero, spatial), "normalize"), a)
    affine = lw.network.add_scale_nd(
        layer.get_output(0), trt.ScaleMode.CHANNEL, lw.weights(a.bias), lw.weights(a.weight), None, 1
    )
    return lw.out(affine)


def _grouped(layer, attrs):
    layer.num_groups = attrs.groups
    layer.epsilon = attrs.eps
    return layer


@lowering(OpKind.RESHAPE)
def _reshape(lw, node, args):
    layer = lw.named(lw.network.add_shuffle(args[0]))
    layer.reshape_dims = (0, *node.attrs.shape)  # 0 copies the batch from the input
    return layer.get_output(0)


@lowering(OpKind.TRANSPOSE)
def _transpose(lw, node, args):
    layer = lw.named(lw.network.add_shuffle(args[0]))
    layer.first_transpose = tuple(node.attrs.perm)
    return layer.get_output(0)


@lowering(OpKind.CAST)
def _cast(lw, node, args):
    return lw.out(lw.network.add_cast(args[0], trt_dtype(node.attrs.dtype)))


def _scaled(lw, q, scale: float, dtype: DType):
    """q * scale: TensorRT's attention has no scale of its own and asks for q scaled beforehand."""
    if scale == 1.0:
        return q
    factor = lw.constant(np.full((1, 1, 1, 1), scale, np.float32), (1, 1, 1, 1), "scale", dtype)
    return lw.binary(q, factor, "PROD", "scale_q")


def _add_attention_layer(network, q, k, v):
    softmax = trt.AttentionNormalizationOp.SOFTMAX
    if hasattr(network, "add_attention_v2"):  # TensorRT 10.16 on, TensorRT-RTX 1.7
        return network.add_attention_v2(q, k, v, softmax, trt.CausalMaskKind.NONE)
    return network.add_attention(q, k, v, softmax, False)  # TensorRT 10.14 and 10.15


def _attention_unfused(lw, node, q, k, v):
    """The attention from matrix products and a softmax, for what TensorRT's attention layer cannot
    take (a value width other than the key's; a TensorRT before 10.14). It keeps the statistics in
    fp32 as a fused kernel does: the products and the softmax run in fp32, the result is cast back."""
    a, low = node.attrs, node.type.dtype is not DType.F32
    if low:
        q, k, v = (lw.out(lw.network.add_cast(t, trt_dtype(DType.F32)), f"{role}_f32") for t, role in zip((q, k, v), "qkv"))
    q = _scaled(lw, q, a.scale, DType.F32)
    scores = lw.out(lw.network.add_matrix_multiply(q, trt.MatrixOperation.NONE, k, trt.MatrixOperation.TRANSPOSE), "scores")
    if a.bias:
        bias = lw.graph.weights[a.bias]
        scores = lw.binary(scores, lw.constant(bias, bias.shape, "bias", DType.F32), "SUM", "bias_add")
    softmax = lw.named(lw.network.add_softmax(scores), "softmax")
    softmax.axes = 1 << 3
    mixed = lw.network.add_matrix_multiply(softmax.get_output(0), trt.MatrixOperation.NONE, v, trt.MatrixOperation.NONE)
    if not low:
        return lw.out(mixed)
    return lw.out(lw.network.add_cast(lw.out(mixed, "mix"), trt_dtype(node.type.dtype)))


@lowering(OpKind.ATTENTION)
def _attention(lw, node, args):
    q, k, v = args
    has_layer = hasattr(lw.network, "add_attention_v2") or hasattr(lw.network, "add_attention")
    if not has_layer or k.shape[3] != v.shape[3]:
        return _attention_unfused(lw, node, q, k, v)
    layer = lw.named(_add_attention_layer(lw.network, _scaled(lw, q, node.attrs.scale, node.type.dtype), k, v))
    # TensorRT-RTX 1.7 has no fused fp32 kernel (the build fails); decomposable lets an fp32 build,
    # or a shape no kernel takes, fall back to separate layers. fp16 and bf16 builds get the kernel.
    layer.decomposable = True
    if node.attrs.bias:
        bias = lw.graph.weights[node.attrs.bias]
        layer.mask = lw.constant(bias, bias.shape, "bias")  # a float mask is added to the scores
    return layer.get_output(0)


def _reshaped(lw, x, shape: tuple[int, ...], role: str):
    """`x` (a tensor without a batch axis) reshaped to the static `shape`."""
    layer = lw.named(lw.network.add_shuffle(x), role)
    layer.reshape_dims = shape
    return layer.get_output(0)


def _quantization_scale(lw, node):
    """The node's scale as a float32 constant: TensorRT takes float32 scales for every format."""
    scale = lw.graph.weights[node.attrs.scale]
    return lw.constant(scale, scale.shape, "scale", DType.F32)


def _per_channel(layer, node):
    """Per-channel along the node's axis (TensorRT's default is per tensor)."""
    if node.attrs.axis is not None:
        layer.axis = node.attrs.axis
    return layer.get_output(0)


@lowering(OpKind.QUANTIZE)
def _quantize(lw, node, args):
    layer = lw.network.add_quantize(args[0], _quantization_scale(lw, node), trt_dtype(node.attrs.format))
    return _per_channel(lw.named(layer), node)


@lowering(OpKind.DEQUANTIZE)
def _dequantize(lw, node, args):
    layer = lw.network.add_dequantize(args[0], _quantization_scale(lw, node), trt_dtype(node.type.dtype))
    return _per_channel(lw.named(layer), node)
