"""The ATTENTION op in TensorRT: real TensorRT-RTX networks and plans built on the CPU (nothing mocked).

A plan cannot run without a GPU here, so these check what the network says: one attention layer per
attention op, in the build's precision, its bias as the layer's mask, and the fp32 fallback where the
layer cannot take the op.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtmc.backends import EngineSpec
from trtmc.backends import tensorrt as backend
from trtmc.checkpoint import Checkpoint
from trtmc.families import build_graph
from trtmc.graph import DType
from trtmc.graph_builder import GraphBuilder
from trtmc.passes.precision import PrecisionPolicy, assign_precision

needs_builder = pytest.mark.skipif(backend.trt is None, reason="neither tensorrt nor tensorrt_rtx imports")

DTYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


def attention_graph(*, value_dim: int = 16, bias: bool = True):
    """Tokens [N, 20, 32] projected to q, k, v of 2 heads, their attention, merged back to tokens."""
    r = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.input("tokens", (1, 20, 32))
    heads = []
    for name, width in (("q", 16), ("k", 16), ("v", value_dim)):
        y = g.linear(x, f"attn.{name}", r.standard_normal((2 * width, 32)))
        heads.append(g.transpose(g.reshape(y, (20, 2, width), f"attn.{name}"), (0, 2, 1, 3), f"attn.{name}"))
    out = g.attention(*heads, "attn", scale=0.25, bias=r.standard_normal((1, 2, 20, 20)) if bias else None)
    g.output(g.reshape(g.transpose(out, (0, 2, 1, 3), "attn.merge"), (20, 2 * value_dim), "attn.merge"))
    return g.finish()


def network_of(graph, precision: str):
    return backend.define_network(assign_precision(graph, PrecisionPolicy(precision)), EngineSpec("tensorrt", "cuda", precision))


@needs_builder
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_vit_plan_runs_each_blocks_attention_as_one_attention_layer_in_the_build_precision(precision, timm_checkpoint):
    arch = "vit_tiny_patch16_224"
    _, graph = build_graph(Checkpoint(timm_checkpoint(arch)), precision)
    typed = assign_precision(graph, PrecisionPolicy(precision))
    depth = sum(1 for n in typed.nodes if n.name.endswith(".attn"))
    assert depth == 12

    layers = backend.define_network(typed, EngineSpec("tensorrt", "cuda", precision)).layers()
    attention = [layer for layer in layers if layer["type"] == "ATTENTION_INPUT"]
    assert [a["name"] for a in attention] == [f"[attention]-blocks.{i}.attn_AttentionInput" for i in range(depth)]
    assert all(a["inputs"] == [DTYPE[precision]] * 3 for a in attention)  # q, k, v, no mask
    assert not [layer["name"] for layer in layers if layer["type"] == "SOFTMAX"]

    built = backend.build(typed, EngineSpec("tensorrt", "cuda", precision))
    assert built.record["plan_bytes"] == len(built.files["engine.plan"]) > 0
    assert built.record["layer_precisions"]["ATTENTION_INPUT"] == {DTYPE[precision]: depth}


@needs_builder
def test_attention_bias_becomes_the_layers_mask_and_the_scale_multiplies_q_first():
    layers = {layer["name"]: layer for layer in network_of(attention_graph(), "fp16").layers()}
    assert layers["[attention]-attn_AttentionInput"]["inputs"] == ["f16"] * 4  # q, k, v, mask
    assert layers["[attention]-attn/bias"]["outputs"] == ["f16"]
    assert layers["[attention]-attn/scale_q"]["type"] == "ELEMENTWISE"


@needs_builder
def test_a_value_wider_than_the_key_runs_unfused_in_fp32_and_builds_a_plan():
    # TensorRT's attention layer wants k and v of one shape (LeViT's values are wider than its keys).
    graph = assign_precision(attention_graph(value_dim=24), PrecisionPolicy("fp16"))
    definition = backend.define_network(graph, EngineSpec("tensorrt", "cuda", "fp16"))
    precisions = definition.precisions()
    assert "ATTENTION_INPUT" not in precisions
    assert precisions["SOFTMAX"] == {"f32": 1}
    assert precisions["MATRIX_MULTIPLY"] == {"f16": 3, "f32": 2}  # the three projections, then the attention
    assert graph.node("attn").type.dtype is DType.F16  # the node keeps its type: the fp32 is inside its lowering

    built = backend.build(graph, EngineSpec("tensorrt", "cuda", "fp16"))
    assert len(built.files["engine.plan"]) > 0
