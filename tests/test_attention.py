"""The ATTENTION op: parity with timm's Attention module and a float64 reference, its bias, its type
rule, and the precision rule that lets it run in fp16 and bf16.

TensorRT builds of it: test_attention_tensorrt.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from support import DispatchedOps, relative_error
from trtmc.backends.torch_lowering import GraphModule, to_fx
from trtmc.checkpoint import Checkpoint
from trtmc.graph import DType, Graph, GraphError, OpKind
from trtmc.graph_builder import GraphBuilder
from trtmc.families._parts import multi_head_attention
from trtmc.passes.precision import PrecisionPolicy, assign_precision

HEADS, TOKENS, HEAD_DIM = 4, 50, 16
# fp16 rounds q, k, v, the probabilities and the output once each, by up to 2^-11 relative; scores
# of a few units carry their operands' rounding into the probabilities a few times over. The
# bound: 16 such roundings of the largest output (7.8e-3). Measured: 5.4e-4 without a bias,
# 1.2e-3 with one.
FP16_BOUND = 16 * 2.0**-11


def qkv_graph(bias: np.ndarray | None = None, *, scale: float = HEAD_DIM**-0.5, value_dim: int = HEAD_DIM) -> Graph:
    """One input [N, 3 * heads, tokens, head_dim] holding q, k, v head by head, and their attention."""
    g = GraphBuilder()
    x = g.input("qkv", (1, 2 * HEADS + HEADS * value_dim // HEAD_DIM, TOKENS, HEAD_DIM))
    q, k = g.slice(x, 1, 0, HEADS, "q"), g.slice(x, 1, HEADS, 2 * HEADS, "k")
    v = g.reshape(g.slice(x, 1, 2 * HEADS, x.shape[1], "v"), (HEADS, TOKENS, value_dim), "v")
    g.output(g.attention(q, k, v, "attn", scale=scale, bias=bias))
    return g.finish()


def reference(x: torch.Tensor, bias: np.ndarray | None = None, scale: float = HEAD_DIM**-0.5) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v in float64."""
    x = x.double()
    q, k, v = x[:, :HEADS], x[:, HEADS : 2 * HEADS], x[:, 2 * HEADS :]
    v = v.reshape(x.shape[0], HEADS, TOKENS, -1)
    scores = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + torch.from_numpy(bias).double()
    return torch.softmax(scores, -1) @ v


def random_qkv(batch: int = 3, value_dim: int = HEAD_DIM, seed: int = 0, spread: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2 * HEADS + HEADS * value_dim // HEAD_DIM, TOKENS, HEAD_DIM, generator=gen) * spread


def run(graph: Graph, precision: str, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return GraphModule(assign_precision(graph, PrecisionPolicy(precision)))(x).float()


def test_multi_head_attention_matches_timms_attention_module(tmp_path):
    from safetensors.torch import save_file
    from timm.models.vision_transformer import Attention

    width = HEADS * HEAD_DIM
    torch.manual_seed(0)
    module = Attention(width, num_heads=HEADS, qkv_bias=True).eval()
    module.fused_attn = False  # timm's own matmul-softmax-matmul: the formula written out
    save_file({f"attn.{k}": v.contiguous() for k, v in module.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "attention_probe"}))

    g = GraphBuilder()
    tokens = g.input("tokens", (1, TOKENS, width))
    g.output(multi_head_attention(g, tokens, Checkpoint(tmp_path), "attn", HEADS))
    graph = g.finish()
    assert [n.kind for n in graph.nodes].count(OpKind.ATTENTION) == 1
    assert graph.node("attn").attrs.scale == HEAD_DIM**-0.5

    x = torch.randn(3, TOKENS, width, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = module(x)
        assert relative_error(run(graph, "fp32", x), expected) < 1e-6
        assert relative_error(run(graph, "fp16", x), expected) < FP16_BOUND


@pytest.mark.parametrize("bias_heads", [None, 1, HEADS])
def test_attention_adds_its_bias_to_the_scaled_scores_before_the_softmax(bias_heads):
    bias = None
    if bias_heads is not None:
        bias = np.random.default_rng(2).standard_normal((1, bias_heads, TOKENS, TOKENS)).astype(np.float32) * 3
    graph = qkv_graph(bias, scale=0.3)
    x = random_qkv()
    expected = reference(x, bias, scale=0.3)
    assert relative_error(run(graph, "fp32", x), expected) < 1e-6
    assert relative_error(run(graph, "fp16", x), expected) < FP16_BOUND
    if bias is not None:  # the test bites: the bias moves the result far past those bounds
        assert relative_error(run(graph, "fp32", x), reference(x, None, scale=0.3)) > 0.1


def test_a_bias_of_unaligned_width_is_traced_as_an_aligned_view_of_a_padded_parameter():
    # 50 tokens: rows of 50 would start off the 8-element alignment attention kernels read in place.
    bias = np.random.default_rng(3).standard_normal((1, HEADS, TOKENS, TOKENS)).astype(np.float32)
    graph = assign_precision(qkv_graph(bias), PrecisionPolicy("fp32"))
    module = to_fx(graph)
    (stored,) = [t for t in module.parameters() if t.dim() == 4]
    assert stored.shape == (1, HEADS, TOKENS, 56) and stored.is_contiguous()
    assert torch.equal(stored[..., :TOKENS], torch.from_numpy(bias)) and not stored[..., TOKENS:].any()
    # The view is an op of the traced graph, so moving the module moves the padded tensor and keeps it.
    (attention,) = [n for n in module.graph.nodes if n.target is torch.nn.functional.scaled_dot_product_attention]
    mask = attention.kwargs["attn_mask"]
    assert mask.op == "call_function" and mask.args[0].op == "get_attr"
    x = random_qkv()
    with torch.no_grad():
        assert relative_error(module(x), reference(x, bias)) < 1e-6


def test_attention_takes_a_value_width_other_than_the_key_width():
    graph = qkv_graph(value_dim=2 * HEAD_DIM)
    assert graph.node("attn").type.shape == (1, HEADS, TOKENS, 2 * HEAD_DIM)
    x = random_qkv(value_dim=2 * HEAD_DIM)
    assert relative_error(run(graph, "fp32", x), reference(x)) < 1e-6


def test_fp16_attention_stays_finite_where_unfused_fp16_scores_overflow():
    # The scaled scores reach ~1e5 here, past fp16's 65504, while q, k and v fit in fp16. The kernel
    # forms the scores in fp32; timm's unfused path (q * scale, q @ k^T, softmax, @ v) in fp16 gives
    # inf, then NaN.
    x = random_qkv(batch=2, spread=150.0)
    fused = run(qkv_graph(), "fp16", x)
    assert relative_error(fused, reference(x.half())) < FP16_BOUND  # exact but for fp16's input rounding

    g = GraphBuilder()
    qkv = g.input("qkv", (1, 3 * HEADS, TOKENS, HEAD_DIM))
    q, k, v = (g.slice(qkv, 1, i * HEADS, (i + 1) * HEADS, n) for i, n in enumerate("qkv"))
    q = g.scale(q, "q_scale", np.full(HEAD_DIM, HEAD_DIM**-0.5), np.zeros(HEAD_DIM), axis=3)
    scores = g.softmax(g.matmul(q, k, "scores", transpose_b=True), -1, "softmax", sensitive=False)
    g.output(g.matmul(scores, v, "mix"))
    assert not torch.isfinite(run(g.finish(), "fp16", x)).all()


@pytest.mark.parametrize("precision, low", [("fp16", DType.F16), ("bf16", DType.BF16)])
def test_attention_runs_in_the_build_precision_while_an_unfused_softmax_stays_fp32(precision, low):
    g = GraphBuilder()
    qkv = g.input("qkv", (1, 3 * HEADS, TOKENS, HEAD_DIM))
    q, k, v = (g.slice(qkv, 1, i * HEADS, (i + 1) * HEADS, n) for i, n in enumerate("qkv"))
    out = g.attention(q, k, v, "blocks.0.attn", scale=0.25, bias=np.zeros((1, 1, TOKENS, TOKENS)))
    g.output(g.softmax(out, -1, "blocks.0.softmax"))
    graph = g.finish()
    typed = {n.name: n for n in assign_precision(graph, PrecisionPolicy(precision)).nodes}
    assert typed["blocks.0.attn"].type.dtype is low
    assert typed["blocks.0.softmax"].type.dtype is DType.F32
    # Marked sensitive by some family, it still runs in the build's precision: the kernel is the fp32 island.
    marked = dataclasses.replace(graph.node("blocks.0.attn"), sensitive=True)
    assert PrecisionPolicy(precision).dtype_for(marked) is low
    # An override still wins.
    forced = assign_precision(graph, PrecisionPolicy(precision, overrides=(("*.attn", DType.F32),)))
    assert forced.node("blocks.0.attn").type.dtype is DType.F32


def test_attention_with_a_bias_prints_its_scale_and_survives_a_json_round_trip():
    graph = assign_precision(qkv_graph(np.ones((1, HEADS, TOKENS, TOKENS)), scale=0.25), PrecisionPolicy("fp16"))
    assert "= attention(%q, %k, %v#2, scale=0.25)" in str(graph)
    again = Graph.from_json(json.loads(graph.dumps()), graph.weights)
    assert str(again) == str(graph) and again.node("attn").attrs == graph.node("attn").attrs


@pytest.mark.parametrize(
    "shapes, bias, match",
    [
        (((4, 50, 16), (4, 50, 16), (4, 50, 16)), (2, 4, 50, 50), r"bias \(2, 4, 50, 50\) does not broadcast"),
        (((4, 50, 16), (4, 50, 16), (4, 50, 16)), (1, 4, 50, 49), r"bias \(1, 4, 50, 49\) does not broadcast"),
        (((4, 50, 16), (2, 50, 16), (2, 50, 16)), None, r"same batch and heads"),
        (((4, 50, 16), (4, 50, 8), (4, 50, 16)), None, r"q and k as wide"),
        (((4, 50, 16), (4, 50, 16), (4, 40, 16)), None, r"k and v as long"),
    ],
)
def test_attention_refuses_operands_and_biases_that_do_not_fit(shapes, bias, match):
    g = GraphBuilder()
    q, k, v = (g.input(name, (1, *shape)) for name, shape in zip("qkv", shapes))
    with pytest.raises(GraphError, match=match):
        g.attention(q, k, v, "attn", scale=0.25, bias=None if bias is None else np.zeros(bias))


def test_attention_over_rows_strided_in_memory_hands_the_kernel_row_major_rows():
    # q, k, v [N, heads, rows, row_length] read across the transposed input, as edgenext's cross-covariance
    # attention reads its qkv projection: torch's fused kernels refuse rows of stride 2 * HEADS * TOKENS
    # and its math path runs fp16 products in fp32.
    g = GraphBuilder()
    x = g.transpose(g.input("qkv", (1, 3 * HEADS * HEAD_DIM, TOKENS)), (0, 2, 1), "rows")  # [N, tokens, ...]
    x = g.reshape(g.transpose(x, (0, 2, 1), "columns"), (3 * HEADS, HEAD_DIM, TOKENS), "heads")
    q, k, v = (g.slice(x, 1, i * HEADS, (i + 1) * HEADS, part) for i, part in enumerate("qkv"))
    g.output(g.attention(q, k, v, "attn", scale=1.0))
    graph = assign_precision(g.finish(), PrecisionPolicy("fp32"))
    pixels = torch.randn(2, TOKENS, 3 * HEADS * HEAD_DIM).transpose(1, 2)  # the input itself strided
    with torch.no_grad(), DispatchedOps() as ops:
        out = to_fx(graph)(pixels)
    assert [strides[:3] for strides in ops.named("scaled_dot_product")] == [(1, 1, 1)]
    q, k, v = pixels.double().reshape(2, 3, HEADS, HEAD_DIM, TOKENS).unbind(1)
    expected = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    assert relative_error(out, expected) < 1e-5  # fp32 over unscaled scores of a few units
