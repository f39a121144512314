"""Shape and dtype inference: one rule per op kind, shared by `GraphBuilder` and `Graph.verify()`.

A rule reads a node's attributes, its inputs (nodes, so a rule can see a constant) and the shapes of
its weights, and returns the output shape, or raises GraphError saying why the inputs do not fit.
The builder runs a rule before it adds a node; `verify()` re-runs it on every node of a finished
graph, so a pass that records a type its inputs do not give is caught where it happened.

Dtypes follow one rule unless a kind says otherwise: an op computes in the dtype of its inputs, and
they must agree (a change of dtype is a CAST). Inputs and constants take the dtype they are
assigned; a CAST gives its attribute's dtype. Quantized dtypes (FP8, INT8) have their own edges:
only a QUANTIZE (or a constant holding a stored quantized weight) produces one, only a DEQUANTIZE
reads one, and a dequantize gives the float dtype it is assigned (see `trtmc.ops` for the weight
path of a quantized convolution or linear op).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .ops import Activation, GraphError, Node, OpKind, TensorType
from .precision import DType, precision_of


@dataclass(frozen=True)
class Site:
    """What a rule sees of one node."""

    name: str  # for messages: the checkpoint source in the builder, the node name in verify()
    inputs: tuple[Node, ...]
    weights: Mapping[str, Any]  # weight key -> array (only its shape is read)
    declared: TensorType  # the type a source node (input, constant) is given

    @property
    def x(self) -> TensorType:
        return self.inputs[0].type

    def weight(self, key: str) -> tuple[int, ...]:
        if key not in self.weights:
            raise GraphError(f"node {self.name!r} refers to missing weight {key!r}")
        return tuple(int(d) for d in np.shape(self.weights[key]))


ShapeRule = Callable[[Any, Site], tuple[int, ...]]
DTypeRule = Callable[[Any, Site], DType]


@dataclass(frozen=True)
class TypeRule:
    shape: ShapeRule
    dtype: DTypeRule
    arity: int | None  # how many inputs the kind reads; None: one or more


def _same_as_inputs(attrs: Any, site: Site) -> DType:
    first = site.inputs[0]
    for other in site.inputs[1:]:
        if other.type.dtype is not first.type.dtype:
            raise GraphError(
                f"node {site.name!r} reads {first.name!r} ({first.type.dtype.value}) and {other.name!r} "
                f"({other.type.dtype.value}) without a cast"
            )
    return first.type.dtype


def _assigned(attrs: Any, site: Site) -> DType:
    return site.declared.dtype


RULES: dict[OpKind, TypeRule] = {}


def rule(kind: OpKind, *, arity: int | None = 1, dtype: DTypeRule = _same_as_inputs):
    def register(fn: ShapeRule) -> ShapeRule:
        if kind in RULES:
            raise RuntimeError(f"type rule for {kind.value} registered twice")
        RULES[kind] = TypeRule(fn, dtype, arity)
        return fn

    return register


def infer_type(kind: OpKind, attrs: Any, site: Site) -> TensorType:
    """The output type of a `kind` node at `site`; raises GraphError naming the node if none fits."""
    rule_ = RULES[kind]
    if rule_.arity is not None and len(site.inputs) != rule_.arity:
        raise GraphError(f"{kind.value} {site.name!r} reads {rule_.arity} inputs, got {len(site.inputs)}")
    if rule_.arity is None and not site.inputs:
        raise GraphError(f"{kind.value} {site.name!r} needs at least one input")
    _check_quantized_edges(kind, site)
    shape = tuple(int(d) for d in rule_.shape(attrs, site))
    if any(d <= 0 for d in shape):
        raise GraphError(f"{kind.value} {site.name!r} would produce an empty shape {shape}")
    dtype = rule_.dtype(attrs, site)
    if quantized(dtype) and kind not in (OpKind.QUANTIZE, OpKind.CONSTANT):
        raise GraphError(
            f"{kind.value} {site.name!r} would produce {dtype.value}: quantized tensors come only from a quantize "
            "(or a constant holding a quantized weight)"
        )
    return TensorType(shape, dtype)


def quantized(dtype: DType) -> bool:
    return precision_of(dtype).quantized


def holds_weight(node: Node, inputs: Sequence[Node]) -> bool:
    """Whether `node` is a stored weight rather than a batched tensor: a quantized constant (in the
    weight's own layout, e.g. [out, in, kh, kw]) or its dequantized value. Their dimension 0 is the
    output channel, not the batch."""
    if node.kind is OpKind.CONSTANT:
        return quantized(node.type.dtype)
    return node.kind is OpKind.DEQUANTIZE and inputs[0].kind is OpKind.CONSTANT


def _check_quantized_edges(kind: OpKind, site: Site) -> None:
    if kind is OpKind.DEQUANTIZE:
        return
    for i in site.inputs:
        if quantized(i.type.dtype):
            raise GraphError(
                f"{kind.value} {site.name!r} reads {i.name!r}, a quantized {i.type.dtype.value} tensor: only a "
                "dequantize reads quantized values; read the tensor the quantize read, or dequantize it first"
            )


# ---- helpers shared by the rules ---------------------------------------------------------------


def window_out(size: int, kernel: int, stride: int, before: int, after: int, dilation: int = 1) -> int:
    """Output length of a convolution or pooling window sliding over `size` padded positions."""
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError as exc:
        raise GraphError(f"shapes {a} and {b} do not broadcast") from exc


def _check_axis(what: str, site: Site, axis: int, shape: tuple[int, ...]) -> int:
    """A stored axis is normalised: 1..rank-1 (ops never work across the batch axis 0)."""
    if not 1 <= axis < len(shape):
        raise GraphError(f"{what} {site.name!r}: axis {axis} is not a non-batch axis of shape {shape}")
    return axis


def _image(what: str, site: Site) -> tuple[int, int, int, int]:
    if len(site.x.shape) != 4:
        raise GraphError(f"{what} {site.name!r}: needs an NCHW input, got shape {site.x.shape}")
    return site.x.shape  # type: ignore[return-value]


# ---- the rules, one per op kind ----------------------------------------------------------------


@rule(OpKind.INPUT, arity=0, dtype=_assigned)
def _input(a, site: Site):
    return site.declared.shape


@rule(OpKind.CONSTANT, arity=0, dtype=_assigned)
def _constant(a, site: Site):
    shape = site.weight(a.weight)
    if shape and quantized(site.declared.dtype):  # a stored weight in its own layout (see holds_weight)
        return shape
    if not shape or shape[0] != 1:
        raise GraphError(f"constant {site.name!r} needs a leading broadcast dimension of 1, got {shape}")
    return shape


def _weight_shape(what: str, a: Any, site: Site) -> tuple[int, ...]:
    """The shape of a convolution's or linear op's weight: from its attributes, or, with weight=None,
    from its second input, which must be a dequantized weight (the quantized weight path)."""
    if a.weight is not None:
        if len(site.inputs) != 1:
            raise GraphError(
                f"{what} {site.name!r} has its weight {a.weight!r} in its attributes and reads {len(site.inputs)} "
                "inputs; it reads one"
            )
        return site.weight(a.weight)
    if len(site.inputs) != 2 or site.inputs[1].kind is not OpKind.DEQUANTIZE:
        reads = ", ".join(f"{i.kind.value} {i.name!r}" for i in site.inputs)
        raise GraphError(
            f"{what} {site.name!r} has no weight in its attributes, so it must read its input and a dequantized "
            f"weight; it reads {reads}"
        )
    return site.inputs[1].type.shape


@rule(OpKind.CONV2D, arity=None)
def _conv2d(a, site: Site):
    n, c, h, w = _image("conv", site)
    weight = _weight_shape("conv", a, site)
    if len(weight) != 4:
        raise GraphError(f"conv {site.name!r}: weight must be [out, in/groups, kh, kw], got {weight}")
    out_c, in_per_group, kh, kw = weight
    if c != in_per_group * a.groups:
        raise GraphError(
            f"conv {site.name!r}: input has {c} channels but the weight {weight} "
            f"with groups={a.groups} expects {in_per_group * a.groups}"
        )
    if out_c % a.groups:
        raise GraphError(f"conv {site.name!r}: {out_c} output channels do not split into {a.groups} groups")
    if a.bias is not None and site.weight(a.bias) != (out_c,):
        raise GraphError(f"conv {site.name!r}: bias shape {site.weight(a.bias)} does not match {out_c} channels")
    (s_h, s_w), (d_h, d_w), (top, left, bottom, right) = a.stride, a.dilation, a.padding
    return (n, out_c, window_out(h, kh, s_h, top, bottom, d_h), window_out(w, kw, s_w, left, right, d_w))


@rule(OpKind.SCALE)
def _scale(a, site: Site):
    shape = site.x.shape
    axis = _check_axis("scale", site, a.axis, shape)
    scale, shift = site.weight(a.scale), site.weight(a.shift)
    if scale != (shape[axis],) or shift != (shape[axis],):
        raise GraphError(
            f"scale {site.name!r}: scale {scale} / shift {shift} do not match {shape[axis]} channels on axis {axis}"
        )
    return shape


@rule(OpKind.ACTIVATION)
def _activation(a, site: Site):
    if a.fn is Activation.LEAKY_RELU and a.negative_slope is None:
        raise GraphError(f"activation {site.name!r}: leaky_relu needs a negative_slope")
    if a.fn is not Activation.LEAKY_RELU and a.negative_slope is not None:
        raise GraphError(f"activation {site.name!r}: {a.fn.value} takes no negative_slope (got {a.negative_slope})")
    return site.x.shape


@rule(OpKind.POOL2D)
def _pool2d(a, site: Site):
    n, c, h, w = _image("pool", site)
    (k_h, k_w), (s_h, s_w), (top, left, bottom, right) = a.kernel, a.stride, a.padding
    return (n, c, window_out(h, k_h, s_h, top, bottom), window_out(w, k_w, s_w, left, right))


@rule(OpKind.REDUCE)
def _reduce(a, site: Site):
    shape = site.x.shape
    axes = [_check_axis("reduce", site, axis, shape) for axis in a.axes]
    if list(a.axes) != sorted(set(axes)):
        raise GraphError(f"reduce {site.name!r}: axes {a.axes} must be distinct and sorted")
    if a.keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


@rule(OpKind.ELEMENTWISE, arity=2)
def _elementwise(a, site: Site):
    x, y = site.inputs[0].type.shape, site.inputs[1].type.shape
    shape = broadcast(x, y)
    if len(x) != len(y):
        raise GraphError(f"{a.op.value} {site.name!r}: operands need the same rank, got {x} and {y}")
    return shape


@rule(OpKind.CONCAT, arity=None)
def _concat(a, site: Site):
    constants = [n.name for n in site.inputs if n.kind is OpKind.CONSTANT]
    if constants:
        # A constant has batch 1 and broadcasts only in elementwise ops; concatenated, it would
        # break every batch size but 1.
        raise GraphError(f"concat {site.name!r}: constant input {constants[0]!r} cannot follow the batch")
    shapes = [list(n.type.shape) for n in site.inputs]
    base = shapes[0]
    axis = _check_axis("concat", site, a.axis, tuple(base))
    for other in shapes[1:]:
        if len(other) != len(base) or other[:axis] + other[axis + 1 :] != base[:axis] + base[axis + 1 :]:
            raise GraphError(f"concat {site.name!r}: shapes {[tuple(s) for s in shapes]} differ off axis {axis}")
    return tuple(sum(s[axis] for s in shapes) if i == axis else d for i, d in enumerate(base))


@rule(OpKind.SLICE)
def _slice(a, site: Site):
    shape = site.x.shape
    axis = _check_axis("slice", site, a.axis, shape)
    if not 0 <= a.start < a.stop <= shape[axis]:
        raise GraphError(f"slice {site.name!r}: [{a.start}:{a.stop}] is outside axis {axis} of {shape}")
    return tuple(a.stop - a.start if i == axis else d for i, d in enumerate(shape))


@rule(OpKind.LINEAR, arity=None)
def _linear(a, site: Site):
    shape, weight = site.x.shape, _weight_shape("linear", a, site)
    if len(weight) != 2 or weight[1] != shape[-1]:
        raise GraphError(f"linear {site.name!r}: weight {weight} does not take input {shape}")
    if a.bias is not None and site.weight(a.bias) != (weight[0],):
        raise GraphError(f"linear {site.name!r}: bias {site.weight(a.bias)} does not match weight {weight}")
    return shape[:-1] + (weight[0],)


@rule(OpKind.MATMUL, arity=2)
def _matmul(a, site: Site):
    x, y = site.inputs[0].type.shape, site.inputs[1].type.shape
    ys = y[:-2] + ((y[-1], y[-2]) if a.transpose_b and len(y) >= 2 else y[-2:])
    if len(x) < 3 or len(x) != len(ys) or x[-1] != ys[-2]:
        raise GraphError(f"matmul {site.name!r}: {x} @ {ys} (transpose_b={a.transpose_b}) does not fit")
    return broadcast(x[:-2], ys[:-2]) + (x[-2], ys[-1])


@rule(OpKind.SOFTMAX)
def _softmax(a, site: Site):
    _check_axis("softmax", site, a.axis, site.x.shape)
    return site.x.shape


@rule(OpKind.NORMALIZATION)
def _normalization(a, site: Site):
    shape = site.x.shape
    axis = _check_axis("layer norm", site, a.axis, shape)
    weight, bias = site.weight(a.weight), site.weight(a.bias)
    if weight != (shape[axis],) or bias != (shape[axis],):
        raise GraphError(f"layer norm {site.name!r}: weight {weight} does not match axis {axis} of {shape}")
    return shape


@rule(OpKind.GROUP_NORM)
def _group_norm(a, site: Site):
    n, c, h, w = _image("group norm", site)
    if a.groups < 1 or c % a.groups:
        raise GraphError(f"group norm {site.name!r}: {c} channels do not split into {a.groups} groups")
    weight, bias = site.weight(a.weight), site.weight(a.bias)
    if weight != (c,) or bias != (c,):
        raise GraphError(f"group norm {site.name!r}: weight {weight} / bias {bias} do not match {c} channels")
    return site.x.shape


@rule(OpKind.RESHAPE)
def _reshape(a, site: Site):
    shape = site.x.shape
    if int(np.prod(a.shape)) != int(np.prod(shape[1:])):
        raise GraphError(f"reshape {site.name!r}: {shape[1:]} cannot become {tuple(a.shape)}")
    return (shape[0],) + tuple(a.shape)


@rule(OpKind.TRANSPOSE)
def _transpose(a, site: Site):
    shape = site.x.shape
    if sorted(a.perm) != list(range(len(shape))) or a.perm[0] != 0:
        raise GraphError(f"transpose {site.name!r}: {a.perm} is not a permutation keeping the batch first")
    return tuple(shape[p] for p in a.perm)


@rule(OpKind.CAST, dtype=lambda a, site: a.dtype)
def _cast(a, site: Site):
    return site.x.shape


@rule(OpKind.ATTENTION, arity=3)
def _attention(a, site: Site):
    q, k, v = (n.type.shape for n in site.inputs)
    if not (len(q) == len(k) == len(v) == 4 and q[:2] == k[:2] == v[:2] and q[3] == k[3] and k[2] == v[2]):
        raise GraphError(
            f"attention {site.name!r}: q {q}, k {k}, v {v} must be [N, heads, tokens, head_dim] with the same "
            "batch and heads, q and k as wide, k and v as long"
        )
    if not (math.isfinite(a.scale) and a.scale > 0):
        raise GraphError(f"attention {site.name!r}: scale {a.scale} must be a positive number")
    scores = (1, q[1], q[2], k[2])
    if a.bias is not None:
        bias = site.weight(a.bias)
        if len(bias) != 4 or bias[0] != 1 or any(b not in (1, s) for b, s in zip(bias, scores)):
            raise GraphError(
                f"attention {site.name!r}: bias {bias} does not broadcast to the scores {scores} "
                "(it is the same for every image: its leading dimension is 1)"
            )
    return q[:3] + v[3:]


def _scale_shape(what: str, a: Any, site: Site) -> None:
    """The scale holds one value (axis None) or one per index of `axis`."""
    want = (1,) if a.axis is None else (site.x.shape[a.axis],)
    if site.weight(a.scale) != want:
        per = "per tensor" if a.axis is None else f"per index of axis {a.axis} of {site.x.shape}"
        raise GraphError(
            f"{what} {site.name!r}: scale {a.scale!r} has shape {site.weight(a.scale)}, {per} it needs {want}"
        )


def _quantized_format(what: str, a: Any, site: Site) -> DType:
    if not quantized(a.format):
        raise GraphError(
            f"{what} {site.name!r}: {a.format.value} is not a quantized format; a cast changes float dtypes"
        )
    return a.format


@rule(OpKind.QUANTIZE, dtype=lambda a, site: _quantized_format("quantize", a, site))
def _quantize(a, site: Site):
    if a.axis is not None:  # per-channel activations: never the batch axis
        _check_axis("quantize", site, a.axis, site.x.shape)
    _scale_shape("quantize", a, site)
    return site.x.shape


def _dequantized(a: Any, site: Site) -> DType:
    """A dequantize gives the float dtype it is assigned: that of the op that reads it."""
    if quantized(site.declared.dtype):
        raise GraphError(f"dequantize {site.name!r} must give a float dtype, not {site.declared.dtype.value}")
    return site.declared.dtype


@rule(OpKind.DEQUANTIZE, dtype=_dequantized)
def _dequantize(a, site: Site):
    source = site.inputs[0]
    _quantized_format("dequantize", a, site)
    if source.type.dtype is not a.format:
        raise GraphError(
            f"dequantize {site.name!r} reads {source.name!r} ({source.type.dtype.value}), not {a.format.value}: "
            f"a dequantize reads the output of its quantize, or a quantized weight constant"
        )
    if a.axis is not None and not (a.axis == 0 and source.kind is OpKind.CONSTANT):
        _check_axis("dequantize", site, a.axis, site.x.shape)  # axis 0 is a stored weight's output channel
    _scale_shape("dequantize", a, site)
    return site.x.shape


def input_nodes(names: Sequence[str], nodes: Mapping[str, Node], reader: str) -> tuple[Node, ...]:
    """The nodes `reader` reads, which must already be defined."""
    missing = [n for n in names if n not in nodes]
    if missing:
        raise GraphError(f"node {reader!r} reads {missing[0]!r} before it is defined")
    return tuple(nodes[n] for n in names)
