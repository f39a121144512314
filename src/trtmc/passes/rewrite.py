"""What every pass shares: `graph_pass`, which verifies a pass's result, and `rewrite`, which walks a
graph once replacing nodes and keeps every reader and output pointing at the right node."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping, Sequence

import numpy as np

from ..graph import Graph, GraphError, Node

Pass = Callable[..., Graph]


def graph_pass(fn: Pass) -> Pass:
    """Make `fn(graph, ...) -> Graph` a checked pass: its result must pass `Graph.verify()`, and a
    result that does not raises GraphError naming the pass, so a pass's bug surfaces in the pass."""

    @functools.wraps(fn)
    def checked(graph: Graph, *args, **kwargs) -> Graph:
        result = fn(graph, *args, **kwargs)
        try:
            result.verify()
        except GraphError as exc:
            raise GraphError(f"pass {fn.__name__} made an invalid graph: {exc}") from exc
        return result

    return checked


def rewrite(
    graph: Graph,
    edit: Callable[[Node], Sequence[Node]],
    *,
    renames: Mapping[str, str] | None = None,
    outputs: Callable[[str], str] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
) -> Graph:
    """A new graph made by one walk over `graph`'s nodes, in order.

    Each node, its inputs first renamed by `renames` (old name -> the name that now holds its value),
    is replaced by `edit(node)`: `[node]` keeps it, `[]` drops it (then `renames` must say what its
    readers read instead), `[..., new]` puts nodes before it. The graph's outputs are renamed the same
    way, then mapped through `outputs` (called after the walk, so it may name nodes `edit` made).
    `weights` replaces the graph's weights. The result is not verified: `graph_pass` does that.
    """
    renames = dict(renames or {})
    readers = {name for n in graph.nodes for name in n.inputs} | set(graph.outputs)

    def renamed(name: str) -> str:
        while name in renames:
            name = renames[name]
        return name

    nodes: list[Node] = []
    for node in graph.nodes:
        inputs = tuple(renamed(i) for i in node.inputs)
        if inputs != node.inputs:
            node = dataclasses.replace(node, inputs=inputs)
        emitted = list(edit(node))
        if node.name in readers and node.name not in renames and all(n.name != node.name for n in emitted):
            raise GraphError(f"rewrite dropped {node.name!r}, which is read, without naming what replaces it")
        nodes.extend(emitted)
    names = [renamed(o) for o in graph.outputs]
    return Graph(
        nodes=nodes,
        weights=dict(graph.weights if weights is None else weights),
        outputs=[outputs(o) for o in names] if outputs else names,
    )
