"""`GraphBuilder`: how families write graphs.

Each method adds one node and returns a `Tensor` handle; the node's output type comes from its kind's
rule in `trtmc.type_inference` (the rule `Graph.verify()` re-checks), which also refuses inputs that
do not fit, before anything is added. Nodes are named after the checkpoint module they come from
(`source`); `unique` adds `#2`, `#3`, ... when one module yields several ops. Everything is built in
float32: dtypes are the precision pass's job.
"""

from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .graph import (
    Activation,
    ActivationAttrs,
    AttentionAttrs,
    Binary,
    ConcatAttrs,
    ConstantAttrs,
    Conv2dAttrs,
    DType,
    ElementwiseAttrs,
    Graph,
    GraphError,
    GroupNormAttrs,
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
from .type_inference import Site, infer_type, input_nodes


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


class GraphBuilder:
    def __init__(self) -> None:
        self.graph = Graph()
        self._names: dict[str, int] = {}
        self._nodes: dict[str, Node] = {}

    # ---- plumbing ----

    def unique(self, source: str) -> str:
        count = self._names.get(source, 0) + 1
        self._names[source] = count
        return source if count == 1 else f"{source}#{count}"

    @staticmethod
    def _weight(staged: dict[str, np.ndarray], node_name: str, role: str, value: np.ndarray | None) -> str | None:
        """Stage `value` as the node's `role` weight (it joins the graph with the node); its key."""
        if value is None:
            return None
        key = f"{node_name}.{role}"
        staged[key] = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
        return key

    def _add(
        self,
        kind: OpKind,
        source: str,
        inputs: Sequence[Tensor],
        attrs,
        *,
        staged: dict[str, np.ndarray] | None = None,
        shape: Sequence[int] = (),
        sensitive: bool = False,
        name: str | None = None,
    ) -> Tensor:
        """Infer the node's type (`shape` only for an input), then add it and its staged weights."""
        name = name or self.unique(source)
        staged = staged or {}
        site = Site(
            source,
            input_nodes([t.name for t in inputs], self._nodes, name),
            ChainMap(staged, self.graph.weights),
            declared=TensorType(tuple(int(d) for d in shape), DType.F32),
        )
        node = Node(name, kind, tuple(t.name for t in inputs), attrs, infer_type(kind, attrs, site), source, sensitive)
        self.graph.weights.update(staged)
        self.graph.nodes.append(node)
        self._nodes[name] = node
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
        return self._add(OpKind.INPUT, name, [], InputAttrs(), shape=shape)

    def constant(self, source: str, value: np.ndarray, *, sensitive: bool = False) -> Tensor:
        """A constant tensor; its leading dimension is 1 and broadcasts over the batch. `sensitive` for
        one that only fp32 holds exactly (a norm's eps is subnormal in fp16)."""
        name, staged = self.unique(source), {}
        key = self._weight(staged, name, "weight", value)
        return self._add(OpKind.CONSTANT, source, [], ConstantAttrs(key), staged=staged, name=name, sensitive=sensitive)

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
        name, staged = self.unique(source), {}
        attrs = Conv2dAttrs(
            weight=self._weight(staged, name, "weight", weight),
            bias=self._weight(staged, name, "bias", bias),
            stride=_pair(stride),
            padding=_padding4(padding),
            dilation=_pair(dilation),
            groups=int(groups),
        )
        return self._add(OpKind.CONV2D, source, [x], attrs, staged=staged, name=name)

    def scale(self, x: Tensor, source: str, scale: np.ndarray, shift: np.ndarray, *, axis: int = 1) -> Tensor:
        axis = self._axis(x, axis)
        name, staged = self.unique(source), {}
        attrs = ScaleAttrs(self._weight(staged, name, "scale", scale), self._weight(staged, name, "shift", shift), axis)
        return self._add(OpKind.SCALE, source, [x], attrs, staged=staged, name=name)

    def activation(
        self, x: Tensor, fn: Activation, source: str, *, sensitive: bool = False, negative_slope: float | None = None
    ) -> Tensor:
        """`fn` applied elementwise; LEAKY_RELU takes `negative_slope` (torch's default 0.01 when not given)."""
        fn = Activation(fn)
        if fn is Activation.LEAKY_RELU and negative_slope is None:
            negative_slope = 0.01
        slope = None if negative_slope is None else float(negative_slope)
        return self._add(OpKind.ACTIVATION, source, [x], ActivationAttrs(fn, slope), sensitive=sensitive)

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
        attrs = Pool2dAttrs(PoolMode(mode), _pair(kernel), _pair(stride), _padding4(padding), bool(count_include_pad))
        return self._add(OpKind.POOL2D, source, [x], attrs)

    def reduce(
        self, x: Tensor, source: str, op: Reduction, axes: Sequence[int], *, keepdim: bool, sensitive: bool = False
    ) -> Tensor:
        axes = tuple(sorted(self._axis(x, a) for a in axes))
        return self._add(OpKind.REDUCE, source, [x], ReduceAttrs(Reduction(op), axes, keepdim), sensitive=sensitive)

    def global_avg_pool(self, x: Tensor, source: str, *, keepdim: bool = False) -> Tensor:
        return self.reduce(x, source, Reduction.MEAN, (2, 3), keepdim=keepdim)

    def binary(self, a: Tensor, b: Tensor, op: Binary, source: str, *, sensitive: bool = False) -> Tensor:
        return self._add(OpKind.ELEMENTWISE, source, [a, b], ElementwiseAttrs(Binary(op)), sensitive=sensitive)

    def add(self, a: Tensor, b: Tensor, source: str) -> Tensor:
        return self.binary(a, b, Binary.ADD, source)

    def mul(self, a: Tensor, b: Tensor, source: str) -> Tensor:
        return self.binary(a, b, Binary.MUL, source)

    def concat(self, xs: Sequence[Tensor], axis: int, source: str, *, sensitive: bool = False) -> Tensor:
        if not xs:
            raise GraphError(f"concat {source!r} needs at least one input")
        return self._add(OpKind.CONCAT, source, xs, ConcatAttrs(self._axis(xs[0], axis)), sensitive=sensitive)

    def slice(self, x: Tensor, axis: int, start: int, stop: int, source: str, *, sensitive: bool = False) -> Tensor:
        attrs = SliceAttrs(self._axis(x, axis), int(start), int(stop))
        return self._add(OpKind.SLICE, source, [x], attrs, sensitive=sensitive)

    def linear(self, x: Tensor, source: str, weight: np.ndarray, bias: np.ndarray | None = None) -> Tensor:
        name, staged = self.unique(source), {}
        attrs = LinearAttrs(self._weight(staged, name, "weight", weight), self._weight(staged, name, "bias", bias))
        return self._add(OpKind.LINEAR, source, [x], attrs, staged=staged, name=name)

    def matmul(self, a: Tensor, b: Tensor, source: str, *, transpose_b: bool = False, sensitive: bool = False) -> Tensor:
        return self._add(OpKind.MATMUL, source, [a, b], MatmulAttrs(bool(transpose_b)), sensitive=sensitive)

    def softmax(self, x: Tensor, axis: int, source: str, *, sensitive: bool = True) -> Tensor:
        return self._add(OpKind.SOFTMAX, source, [x], SoftmaxAttrs(self._axis(x, axis)), sensitive=sensitive)

    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, source: str, *, scale: float, bias: np.ndarray | None = None
    ) -> Tensor:
        """softmax(q k^T * scale + bias) v; never `sensitive`: see `trtmc.passes.precision`."""
        name, staged = self.unique(source), {}
        attrs = AttentionAttrs(float(scale), self._weight(staged, name, "bias", bias))
        return self._add(OpKind.ATTENTION, source, [q, k, v], attrs, staged=staged, name=name)

    def layer_norm(
        self, x: Tensor, source: str, weight: np.ndarray, bias: np.ndarray, eps: float, *, axis: int = -1, sensitive: bool = True
    ) -> Tensor:
        axis = self._axis(x, axis)
        name, staged = self.unique(source), {}
        attrs = NormalizationAttrs(
            axis, self._weight(staged, name, "weight", weight), self._weight(staged, name, "bias", bias), float(eps)
        )
        return self._add(OpKind.NORMALIZATION, source, [x], attrs, staged=staged, sensitive=sensitive, name=name)

    def group_norm(
        self, x: Tensor, source: str, groups: int, weight: np.ndarray, bias: np.ndarray, eps: float, *, sensitive: bool = True
    ) -> Tensor:
        name, staged = self.unique(source), {}
        attrs = GroupNormAttrs(
            int(groups), self._weight(staged, name, "weight", weight), self._weight(staged, name, "bias", bias), float(eps)
        )
        return self._add(OpKind.GROUP_NORM, source, [x], attrs, staged=staged, sensitive=sensitive, name=name)

    def reshape(self, x: Tensor, shape: Sequence[int], source: str, *, sensitive: bool = False) -> Tensor:
        return self._add(OpKind.RESHAPE, source, [x], ReshapeAttrs(tuple(int(d) for d in shape)), sensitive=sensitive)

    def flatten(self, x: Tensor, source: str) -> Tensor:
        return self.reshape(x, (int(np.prod(x.shape[1:])),), source)

    def transpose(self, x: Tensor, perm: Sequence[int], source: str) -> Tensor:
        return self._add(OpKind.TRANSPOSE, source, [x], TransposeAttrs(tuple(int(p) for p in perm)))

    def output(self, x: Tensor) -> None:
        self.graph.outputs.append(x.name)

    def finish(self) -> Graph:
        self.graph.verify()
        return self.graph
