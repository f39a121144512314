"""`GraphBuilder`: how families write graphs.

Each method adds one node, infers its static output type and returns a `Tensor` handle. Nodes are
named after the checkpoint module they come from (`source`); `unique` adds `#2`, `#3`, ... when one
module yields several ops. Everything is built in float32: dtypes are the precision pass's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .graph import (
    Activation,
    ActivationAttrs,
    Binary,
    ConcatAttrs,
    ConstantAttrs,
    Conv2dAttrs,
    DType,
    ElementwiseAttrs,
    Graph,
    GraphError,
    InputAttrs,
    LinearAttrs,
    MatmulAttrs,
    Node,
    NormalizationAttrs,
    OpKind,
    Pool2dAttrs,
    PoolMode,
    Reduction,
    ReduceAttrs,
    ReshapeAttrs,
    ScaleAttrs,
    SliceAttrs,
    SoftmaxAttrs,
    TensorType,
    TransposeAttrs,
)


@dataclass(frozen=True)
class Tensor:
    name: str
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def channels(self) -> int:
        return self.type.shape[1]


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    a, b = value
    return (int(a), int(b))


def _padding4(value: int | Sequence[int]) -> tuple[int, int, int, int]:
    """int -> all sides; (h, w) -> symmetric; (top, left, bottom, right) as is."""
    if isinstance(value, int):
        return (value,) * 4
    value = tuple(int(v) for v in value)
    if len(value) == 2:
        return (value[0], value[1], value[0], value[1])
    if len(value) == 4:
        return value  # type: ignore[return-value]
    raise GraphError(f"padding must be an int, (h, w) or (top, left, bottom, right), got {value}")


def _window_out(size: int, kernel: int, stride: int, before: int, after: int, dilation: int = 1) -> int:
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError as exc:
        raise GraphError(f"shapes {a} and {b} do not broadcast") from exc


class GraphBuilder:
    def __init__(self) -> None:
        self.graph = Graph()
        self._names: dict[str, int] = {}

    # ---- plumbing ----

    def unique(self, source: str) -> str:
        count = self._names.get(source, 0) + 1
        self._names[source] = count
        return source if count == 1 else f"{source}#{count}"

    def _weight(self, node_name: str, role: str, value: np.ndarray | None) -> str | None:
        if value is None:
            return None
        key = f"{node_name}.{role}"
        self.graph.weights[key] = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
        return key

    def _add(self, kind: OpKind, source: str, inputs: Sequence[Tensor], attrs, shape, *, sensitive=False, name=None) -> Tensor:
        name = name or self.unique(source)
        shape = tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise GraphError(f"{kind.value} {name!r} would produce an empty shape {shape}")
        node = Node(
            name=name,
            kind=kind,
            inputs=tuple(t.name for t in inputs),
            attrs=attrs,
            type=TensorType(shape, DType.F32),
            source=source,
            sensitive=sensitive,
        )
        self.graph.nodes.append(node)
        return Tensor(name, node.type)

    @staticmethod
    def _axis(x: Tensor, axis: int) -> int:
        rank = len(x.shape)
        if not -rank <= axis < rank:
            raise GraphError(f"axis {axis} out of range for shape {x.shape}")
        axis %= rank
        if axis == 0:
            raise GraphError("ops may not work across the batch axis 0")
        return axis

    # ---- ops ----

    def input(self, name: str, shape: Sequence[int]) -> Tensor:
        return self._add(OpKind.INPUT, name, [], InputAttrs(), shape)

    def constant(self, source: str, value: np.ndarray) -> Tensor:
        """A constant tensor; its leading dimension is 1 and broadcasts over the batch."""
        value = np.asarray(value, dtype=np.float32)
        if value.ndim == 0 or value.shape[0] != 1:
            raise GraphError(f"constant {source!r} needs a leading broadcast dimension of 1, got {value.shape}")
        name = self.unique(source)
        key = self._weight(name, "weight", value)
        return self._add(OpKind.CONSTANT, source, [], ConstantAttrs(key), value.shape, name=name)

    def conv2d(
        self,
        x: Tensor,
        source: str,
        weight: np.ndarray,
        bias: np.ndarray | None = None,
        *,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
    ) -> Tensor:
        if weight.ndim != 4:
            raise GraphError(f"conv {source!r}: weight must be [out, in/groups, kh, kw], got {weight.shape}")
        out_c, in_per_group, kh, kw = weight.shape
        if x.channels != in_per_group * groups:
            raise GraphError(
                f"conv {source!r}: input has {x.channels} channels but the weight {tuple(weight.shape)} "
                f"with groups={groups} expects {in_per_group * groups}"
            )
        if out_c % groups:
            raise GraphError(f"conv {source!r}: {out_c} output channels do not split into {groups} groups")
        if bias is not None and bias.shape != (out_c,):
            raise GraphError(f"conv {source!r}: bias shape {bias.shape} does not match {out_c} channels")
        s, d, p = _pair(stride), _pair(dilation), _padding4(padding)
        h = _window_out(x.shape[2], kh, s[0], p[0], p[2], d[0])
        w = _window_out(x.shape[3], kw, s[1], p[1], p[3], d[1])
        name = self.unique(source)
        attrs = Conv2dAttrs(
            weight=self._weight(name, "weight", weight),
            bias=self._weight(name, "bias", bias),
            stride=s,
            padding=p,
            dilation=d,
            groups=int(groups),
        )
        return self._add(OpKind.CONV2D, source, [x], attrs, (x.shape[0], out_c, h, w), name=name)

    def scale(self, x: Tensor, source: str, scale: np.ndarray, shift: np.ndarray, *, axis: int = 1) -> Tensor:
        axis = self._axis(x, axis)
        if scale.shape != (x.shape[axis],) or shift.shape != (x.shape[axis],):
            raise GraphError(
                f"scale {source!r}: scale {scale.shape} / shift {shift.shape} do not match "
                f"{x.shape[axis]} channels on axis {axis}"
            )
        name = self.unique(source)
        attrs = ScaleAttrs(self._weight(name, "scale", scale), self._weight(name, "shift", shift), axis)
        return self._add(OpKind.SCALE, source, [x], attrs, x.shape, name=name)

    def activation(self, x: Tensor, fn: Activation, source: str) -> Tensor:
        return self._add(OpKind.ACTIVATION, source, [x], ActivationAttrs(Activation(fn)), x.shape)

    def pool2d(
        self,
        x: Tensor,
        source: str,
        mode: PoolMode,
        kernel: int | Sequence[int],
        stride: int | Sequence[int],
        padding: int | Sequence[int] = 0,
        *,
        count_include_pad: bool = True,
    ) -> Tensor:
        k, s, p = _pair(kernel), _pair(stride), _padding4(padding)
        h = _window_out(x.shape[2], k[0], s[0], p[0], p[2])
        w = _window_out(x.shape[3], k[1], s[1], p[1], p[3])
        attrs = Pool2dAttrs(PoolMode(mode), k, s, p, bool(count_include_pad))
        return self._add(OpKind.POOL2D, source, [x], attrs, (x.shape[0], x.shape[1], h, w))

    def reduce(
        self, x: Tensor, source: str, op: Reduction, axes: Sequence[int], *, keepdim: bool, sensitive: bool = False
    ) -> Tensor:
        axes = tuple(sorted(self._axis(x, a) for a in axes))
        if keepdim:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return self._add(OpKind.REDUCE, source, [x], ReduceAttrs(Reduction(op), axes, keepdim), shape, sensitive=sensitive)

    def global_avg_pool(self, x: Tensor, source: str, *, keepdim: bool = False) -> Tensor:
        return self.reduce(x, source, Reduction.MEAN, (2, 3), keepdim=keepdim)

    def binary(self, a: Tensor, b: Tensor, op: Binary, source: str, *, sensitive: bool = False) -> Tensor:
        shape = _broadcast(a.shape, b.shape)
        if len(shape) != max(len(a.shape), len(b.shape)) or len(a.shape) != len(b.shape):
            raise GraphError(f"{op.value} {source!r}: operands need the same rank, got {a.shape} and {b.shape}")
        return self._add(OpKind.ELEMENTWISE, source, [a, b], ElementwiseAttrs(Binary(op)), shape, sensitive=sensitive)

    def add(self, a: Tensor, b: Tensor, source: str) -> Tensor:
        return self.binary(a, b, Binary.ADD, source)

    def mul(self, a: Tensor, b: Tensor, source: str) -> Tensor:
        return self.binary(a, b, Binary.MUL, source)

    def concat(self, xs: Sequence[Tensor], axis: int, source: str) -> Tensor:
        if not xs:
            raise GraphError(f"concat {source!r} needs at least one input")
        axis = self._axis(xs[0], axis)
        kinds = {n.name: n.kind for n in self.graph.nodes}
        constants = [t.name for t in xs if kinds.get(t.name) is OpKind.CONSTANT]
        if constants:
            # A constant has batch 1 and broadcasts only in elementwise ops; concatenated, it would
            # break every batch size but 1.
            raise GraphError(f"concat {source!r}: constant input {constants[0]!r} cannot follow the batch")
        base = list(xs[0].shape)
        for t in xs[1:]:
            other = list(t.shape)
            if len(other) != len(base) or other[:axis] + other[axis + 1 :] != base[:axis] + base[axis + 1 :]:
                raise GraphError(f"concat {source!r}: shapes {[t.shape for t in xs]} differ off axis {axis}")
        base[axis] = sum(t.shape[axis] for t in xs)
        return self._add(OpKind.CONCAT, source, xs, ConcatAttrs(axis), base)

    def slice(self, x: Tensor, axis: int, start: int, stop: int, source: str) -> Tensor:
        axis = self._axis(x, axis)
        if not 0 <= start < stop <= x.shape[axis]:
            raise GraphError(f"slice {source!r}: [{start}:{stop}] is outside axis {axis} of {x.shape}")
        shape = list(x.shape)
        shape[axis] = stop - start
        return self._add(OpKind.SLICE, source, [x], SliceAttrs(axis, start, stop), shape)

    def linear(self, x: Tensor, source: str, weight: np.ndarray, bias: np.ndarray | None = None) -> Tensor:
        if weight.ndim != 2 or weight.shape[1] != x.shape[-1]:
            raise GraphError(f"linear {source!r}: weight {weight.shape} does not take input {x.shape}")
        if bias is not None and bias.shape != (weight.shape[0],):
            raise GraphError(f"linear {source!r}: bias {bias.shape} does not match weight {weight.shape}")
        name = self.unique(source)
        attrs = LinearAttrs(self._weight(name, "weight", weight), self._weight(name, "bias", bias))
        return self._add(OpKind.LINEAR, source, [x], attrs, x.shape[:-1] + (weight.shape[0],), name=name)

    def matmul(self, a: Tensor, b: Tensor, source: str, *, transpose_b: bool = False, sensitive: bool = False) -> Tensor:
        bs = b.shape[:-2] + ((b.shape[-1], b.shape[-2]) if transpose_b else b.shape[-2:])
        if len(a.shape) < 3 or len(a.shape) != len(bs) or a.shape[-1] != bs[-2]:
            raise GraphError(f"matmul {source!r}: {a.shape} @ {bs} (transpose_b={transpose_b}) does not fit")
        lead = _broadcast(a.shape[:-2], bs[:-2])
        shape = lead + (a.shape[-2], bs[-1])
        return self._add(OpKind.MATMUL, source, [a, b], MatmulAttrs(transpose_b), shape, sensitive=sensitive)

    def softmax(self, x: Tensor, axis: int, source: str, *, sensitive: bool = True) -> Tensor:
        return self._add(OpKind.SOFTMAX, source, [x], SoftmaxAttrs(self._axis(x, axis)), x.shape, sensitive=sensitive)

    def layer_norm(
        self, x: Tensor, source: str, weight: np.ndarray, bias: np.ndarray, eps: float, *, axis: int = -1, sensitive: bool = True
    ) -> Tensor:
        axis = self._axis(x, axis)
        if weight.shape != (x.shape[axis],) or bias.shape != (x.shape[axis],):
            raise GraphError(f"layer norm {source!r}: weight {weight.shape} does not match axis {axis} of {x.shape}")
        name = self.unique(source)
        attrs = NormalizationAttrs(axis, self._weight(name, "weight", weight), self._weight(name, "bias", bias), float(eps))
        return self._add(OpKind.NORMALIZATION, source, [x], attrs, x.shape, sensitive=sensitive, name=name)

    def reshape(self, x: Tensor, shape: Sequence[int], source: str) -> Tensor:
        shape = tuple(int(d) for d in shape)
        if int(np.prod(shape)) != int(np.prod(x.shape[1:])):
            raise GraphError(f"reshape {source!r}: {x.shape[1:]} cannot become {shape}")
        return self._add(OpKind.RESHAPE, source, [x], ReshapeAttrs(shape), (x.shape[0],) + shape)

    def flatten(self, x: Tensor, source: str) -> Tensor:
        return self.reshape(x, (int(np.prod(x.shape[1:])),), source)

    def transpose(self, x: Tensor, perm: Sequence[int], source: str) -> Tensor:
        perm = tuple(int(p) for p in perm)
        if sorted(perm) != list(range(len(x.shape))) or perm[0] != 0:
            raise GraphError(f"transpose {source!r}: {perm} is not a permutation keeping the batch first")
        return self._add(OpKind.TRANSPOSE, source, [x], TransposeAttrs(perm), tuple(x.shape[p] for p in perm))

    def output(self, x: Tensor) -> None:
        self.graph.outputs.append(x.name)

    def finish(self) -> Graph:
        self.graph.verify()
        return self.graph
