"""Batch-norm folding: a SCALE that only reads a convolution becomes part of that convolution.

Guarantees, for the graph it returns: every SCALE on channel axis 1 whose input is a CONV2D used by
nothing else is gone, and the convolution's weight and bias absorb it (w' = w * s per output
channel, b' = b * s + t, computed in float64 and stored as float32); node names, order and every
other node are unchanged, and the graph computes the same function. Run it before precision
assignment, on the float32 graph.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..graph import Conv2dAttrs, Graph, Node, OpKind
from .rewrite import graph_pass, rewrite


@graph_pass
def fold_batch_norm(graph: Graph) -> Graph:
    consumers = graph.consumers()
    by_name = {n.name: n for n in graph.nodes}
    weights = dict(graph.weights)
    replaced: dict[str, str] = {}  # folded SCALE name -> the convolution that now produces its value
    folded: dict[str, Conv2dAttrs] = {}  # convolution name -> its attributes with the norm folded in
    for node in graph.nodes:
        if node.kind is not OpKind.SCALE or node.attrs.axis != 1:
            continue
        producer = by_name[node.inputs[0]]
        if producer.kind is not OpKind.CONV2D or len(consumers[producer.name]) != 1 or producer.name in graph.outputs:
            continue
        scale = weights[node.attrs.scale].astype(np.float64)
        shift = weights[node.attrs.shift].astype(np.float64)
        conv = producer.attrs
        w = weights[conv.weight].astype(np.float64) * scale[:, None, None, None]
        b = weights[conv.bias].astype(np.float64) if conv.bias else np.zeros_like(scale)
        weights[conv.weight] = w.astype(np.float32)
        bias_key = conv.bias or f"{producer.name}.bias"
        weights[bias_key] = (b * scale + shift).astype(np.float32)
        folded[producer.name] = dataclasses.replace(conv, bias=bias_key)
        replaced[node.name] = producer.name
        del weights[node.attrs.scale], weights[node.attrs.shift]

    def edit(node: Node) -> list[Node]:
        if node.name in replaced:
            return []
        return [dataclasses.replace(node, attrs=folded[node.name])] if node.name in folded else [node]

    return rewrite(graph, edit, renames=replaced, weights=weights)
