"""Post-training quantization: the convolutions and linear ops a `QuantRecipe` selects store their
input and weight in FP8 E4M3 or INT8, between explicit quantize and dequantize ops.

Guarantees, for the graph it returns:
- each selected op (`choose_layers`) reads its input through QUANTIZE -> DEQUANTIZE with one static
  scale per tensor (calibrated max |x| / the format's largest value), shared by the selected ops that
  read the same tensor, and its weight as a quantized constant -> DEQUANTIZE (per output channel on
  axis 0, or per tensor, amax / largest of the stored kernel, batch norm already folded into it); its
  `weight` attribute is None and its bias stays in the compute precision (the layout is `trtmc.ops`'s);
- the dequantizes give the dtype the precision pass gave the op that reads them, so every other
  node, dtype and cast is unchanged, and the unselected ops keep the compute precision;
- the float weights of the quantized ops leave the graph; the quantized ones are float32 arrays
  holding values on the format's grid (exact in that format), with their scales beside them.

Run it after `fold_batch_norm` and `assign_precision`: it refuses a selected convolution that a batch
norm still follows, a graph that is already quantized, and override patterns that match no op.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import statistics
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..graph import ConstantAttrs, DType, Graph, GraphError, Node, OpKind, QuantAttrs, TensorType
from ..precision import Precision
from ..quantization import QUANTIZABLE, CalibrationScales, QuantRecipe
from .precision import require_matches
from .rewrite import graph_pass, rewrite

_PASSTHROUGH = (OpKind.CAST, OpKind.RESHAPE)  # between the classifier and the logits


@dataclass(frozen=True)
class LayerChoice:
    """Whether a quantizable op is quantized, and the rule that decided it (for reports)."""

    name: str
    kind: OpKind
    quantize: bool
    reason: str


def _classifiers(graph: Graph) -> set[str]:
    """The quantizable ops whose output is a graph output, through casts and reshapes only."""
    by_name = {n.name: n for n in graph.nodes}
    found = set()
    for name in graph.outputs:
        node = by_name[name]
        while node.kind in _PASSTHROUGH:
            node = by_name[node.inputs[0]]
        if node.kind in QUANTIZABLE:
            found.add(node.name)
    return found


def _positions(node: Node, graph_nodes: dict[str, Node]) -> int:
    """How many positions per image the op applies its weight at: H*W for a convolution's input,
    the product of the middle axes ([N, tokens, C]: tokens) for a linear op's."""
    shape = graph_nodes[node.inputs[0]].type.shape
    middle = shape[2:] if node.kind is OpKind.CONV2D else shape[1:-1]
    return int(np.prod(middle, dtype=np.int64))


def _structural_reason(node: Node, recipe: QuantRecipe, nodes: dict[str, Node], classifiers: set[str]) -> str | None:
    """Why the recipe keeps `node` in the compute precision by its structure; None if it does not."""
    if node.kind is OpKind.CONV2D:
        channels = nodes[node.inputs[0]].type.shape[1]
        if channels <= recipe.stem_channels:
            return f"stem ({channels} input channels)"
        if recipe.keep_grouped and node.attrs.groups > 1:
            return f"grouped (groups={node.attrs.groups})"
    if recipe.keep_single_position and _positions(node, nodes) == 1:
        return "one position per image (a 1x1 map or a pooled vector)"
    if recipe.keep_classifier and node.name in classifiers:
        return "classifier"
    return None


def _override(name: str, recipe: QuantRecipe):
    return next((o for o in recipe.overrides if fnmatch.fnmatchcase(name, o.pattern)), None)


def _kernel_amax(graph: Graph, node: Node) -> float:
    return float(np.abs(graph.weights[node.attrs.weight]).max())


def _outliers(graph: Graph, candidates: list[Node], recipe: QuantRecipe, scales: CalibrationScales) -> dict[str, str]:
    """Ops whose activation or weight scale exceeds `outlier_ratio` times the median of that kind of
    scale over the candidates (scales of one format differ from amaxes by one factor: amaxes compare)."""
    kinds: dict[str, Callable[[Node], float]] = {
        "activation": lambda n: scales.amax(n.name),
        "weight": lambda n: _kernel_amax(graph, n),
    }
    found: dict[str, str] = {}
    for kind, amax in kinds.items():
        values = {n.name: amax(n) for n in candidates}
        median = statistics.median(values.values()) if values else 0.0
        for name, value in values.items():
            if median > 0 and value > recipe.outlier_ratio * median and name not in found:
                found[name] = f"outlier: {kind} scale {value / median:.1f}x the median"
    return found


def choose_layers(graph: Graph, recipe: QuantRecipe, scales: CalibrationScales) -> tuple[LayerChoice, ...]:
    """The recipe's decision for every convolution and linear op of `graph`, in graph order."""
    _require_unquantized(graph)
    nodes = {n.name: n for n in graph.nodes}
    ops = [n for n in graph.nodes if n.kind in QUANTIZABLE]
    patterns = [o.pattern for o in recipe.overrides]
    require_matches(patterns, [n.name for n in ops], "convolution or linear op", "fix the recipe's override")
    classifiers = _classifiers(graph)
    reasons: dict[str, str | None] = {}
    for node in ops:
        override = _override(node.name, recipe)
        if scales.amax(node.name) == 0.0:
            reasons[node.name] = "input was 0 on every calibration image: no scale"
        elif override is not None:
            reasons[node.name] = None if override.quantize else f"override {override.pattern!r}"
        else:
            reasons[node.name] = _structural_reason(node, recipe, nodes, classifiers)
    candidates = [n for n in ops if reasons[n.name] is None]
    forced = {n.name for n in candidates if _override(n.name, recipe) is not None}
    for name, why in _outliers(graph, candidates, recipe, scales).items():
        if name not in forced:
            reasons[name] = why
    return tuple(
        LayerChoice(n.name, n.kind, reasons[n.name] is None, reasons[n.name] or "quantized") for n in ops
    )


# ---- the rewrite ---------------------------------------------------------------------------------


def quantize_weight(weight: np.ndarray, fmt: Precision, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values on `fmt`'s grid as float32, float32 scales of shape [out] or [1]) for a float kernel:
    scale = amax / largest per output channel (axis 0) or per tensor."""
    import torch

    weight = np.asarray(weight, dtype=np.float32)
    magnitude = np.abs(weight).reshape(weight.shape[0] if per_channel else 1, -1).max(axis=1)
    scale = (magnitude.astype(np.float64) / fmt.largest).astype(np.float32)
    scale[scale == 0] = 1.0  # an all-zero channel is stored exactly with any scale
    view = scale.reshape((-1,) + (1,) * (weight.ndim - 1)) if per_channel else scale
    values = fmt.to_grid(torch.from_numpy(weight / view)).float().numpy()
    return values, scale


def _require_unquantized(graph: Graph) -> None:
    for node in graph.nodes:
        if node.kind in (OpKind.QUANTIZE, OpKind.DEQUANTIZE):
            raise GraphError(
                f"the graph is already quantized ({node.kind.value} {node.name!r}): quantize once, the "
                "precision-assigned float graph"
            )


def _require_folded(graph: Graph, chosen: set[str]) -> None:
    for node in graph.nodes:
        if node.kind is OpKind.SCALE and node.inputs[0] in chosen and node.attrs.axis == 1:
            raise GraphError(
                f"convolution {node.inputs[0]!r} is followed by batch norm {node.name!r}: its weight scales must "
                "be those of the folded kernel; run fold_batch_norm before quantize"
            )


@dataclass
class _Inserter:
    """Makes the quantize/dequantize nodes and weights for the chosen ops, with unique names."""

    graph: Graph
    fmt: Precision
    scales: CalibrationScales
    per_channel: bool
    weights: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    taken: set[str] = dataclasses.field(default_factory=set)
    shared: dict[tuple[str, DType, float], str] = dataclasses.field(default_factory=dict)

    def unique(self, name: str) -> str:
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    def node(self, op: Node, suffix: str, kind: OpKind, inputs: tuple[str, ...], attrs, type_: TensorType) -> Node:
        """A node for `op`'s quantization, named and sourced after it."""
        return Node(self.unique(f"{op.name}.{suffix}"), kind, inputs, attrs, type_, op.source)

    def input_pair(self, op: Node, x: Node) -> tuple[list[Node], str]:
        """QUANTIZE -> DEQUANTIZE of `op`'s input, and the dequantize's name (no new nodes when an
        earlier op made the same pair: same tensor, dtype and scale)."""
        scale = np.float32(self.scales.activation_scale(op.name, self.fmt))
        key = (x.name, op.type.dtype, float(scale))
        if key in self.shared:
            return [], self.shared[key]
        scale_key = f"{op.name}.input_scale"
        self.weights[scale_key] = np.array([scale], dtype=np.float32)
        attrs = QuantAttrs(scale_key, None, self.fmt.dtype)
        q = self.node(op, "input.q", OpKind.QUANTIZE, (x.name,), attrs, TensorType(x.type.shape, self.fmt.dtype))
        dq = self.node(op, "input.dq", OpKind.DEQUANTIZE, (q.name,), attrs, TensorType(x.type.shape, op.type.dtype))
        self.shared[key] = dq.name
        return [q, dq], dq.name

    def weight_pair(self, op: Node) -> list[Node]:
        """The quantized kernel as a constant, and its DEQUANTIZE in `op`'s dtype."""
        values, scale = quantize_weight(self.weights.pop(op.attrs.weight), self.fmt, self.per_channel)
        values_key, scale_key = f"{op.name}.weight_q", f"{op.name}.weight_scale"
        self.weights[values_key], self.weights[scale_key] = values, scale
        shape = tuple(values.shape)
        stored = self.node(op, "weight.q", OpKind.CONSTANT, (), ConstantAttrs(values_key), TensorType(shape, self.fmt.dtype))
        attrs = QuantAttrs(scale_key, 0 if self.per_channel else None, self.fmt.dtype)
        dq = self.node(op, "weight.dq", OpKind.DEQUANTIZE, (stored.name,), attrs, TensorType(shape, op.type.dtype))
        return [stored, dq]

    def replace(self, op: Node) -> list[Node]:
        """The nodes that take `op`'s place: its input and weight paths, then `op` reading them."""
        emitted, x_dq = self.input_pair(op, self.graph.node(op.inputs[0]))
        emitted += self.weight_pair(op)
        attrs = dataclasses.replace(op.attrs, weight=None)
        return emitted + [dataclasses.replace(op, inputs=(x_dq, emitted[-1].name), attrs=attrs)]


@graph_pass
def quantize(graph: Graph, recipe: QuantRecipe, scales: CalibrationScales) -> Graph:
    """Return a new graph with the recipe's ops quantized (see the module docstring)."""
    chosen = {c.name for c in choose_layers(graph, recipe, scales) if c.quantize}
    _require_folded(graph, chosen)
    inserter = _Inserter(
        graph, recipe.precision, scales, recipe.per_channel_weights,
        weights=dict(graph.weights), taken={n.name for n in graph.nodes},
    )
    replaced = {n.name: inserter.replace(n) for n in graph.nodes if n.name in chosen}
    return rewrite(graph, lambda node: replaced.get(node.name, [node]), weights=inserter.weights)
