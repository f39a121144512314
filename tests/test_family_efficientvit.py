"""EfficientViT-B: attention heads from the tensors, the attention's fp32 island in fp16 builds, refusals
before weights load.

Checks every family shares: test_parity_every_architecture.py, test_refusals_every_family.py.
"""

from __future__ import annotations

import torch

from support import (
    TIE_MARGIN,
    assert_refused_before_weights_load,
    flip_margins,
    forbid_weight_reads,
    load_timm,
    photos_for,
    relative_error,
    rewritten_checkpoint,
)
from trtmc.backends.torch_lowering import GraphModule
from trtmc.checkpoint import Checkpoint, CheckpointError
from trtmc.families import build_graph
from trtmc.families.efficientvit import FAMILY, AttentionBlock, derive_layout
from trtmc.graph import DType, OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision

SMALLEST = "efficientvit_b0"


def test_layout_reads_attention_heads_from_the_aggregation_convs(timm_checkpoint, monkeypatch):
    forbid_weight_reads(monkeypatch)
    layout = derive_layout(Checkpoint(timm_checkpoint("efficientvit_b1")), FAMILY.architectures["efficientvit_b1"])
    attention = [b for b in layout.blocks if isinstance(b, AttentionBlock)]
    # b1: 3 + 4 LiteMLA blocks with 16-wide heads and one 5x5 aggregation branch.
    assert len(attention) == 7 and {(b.head_dim, b.scales) for b in attention} == {(16, 1)}
    strided = [b.prefix for b in layout.blocks if not b.residual]
    assert strided == [f"stages.{i}.blocks.0" for i in range(4)]


def _scale_q_and_k(state, factor):
    """Multiply the q and k rows of every LiteMLA qkv projection by `factor` (v rows stay)."""
    for name, weight in list(state.items()):
        if name.endswith("context_module.main.qkv.conv.weight"):
            head_dim = state[name.replace("qkv.conv.weight", "aggreg.0.1.weight")].shape[1]
            rows = torch.ones(weight.shape[0])
            rows[torch.arange(weight.shape[0]) % (3 * head_dim) < 2 * head_dim] = factor
            state[name] = weight * rows[:, None, None, None]


def test_fp16_build_keeps_attention_sums_finite_where_an_all_fp16_build_overflows(
    timm_checkpoint, tmp_path, record_property
):
    # With q and k four times larger, the normalizer sum_d q_d * sum_tokens k_d (196 tokens in stage 2)
    # passes fp16's 65504 while q, k and v themselves still fit: an all-fp16 attention returns
    # inf / inf. The default fp16 build keeps the products, the token sum and the division in fp32,
    # as timm does with autocast off.
    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "loud", lambda s: _scale_q_and_k(s, 4.0))
    photos = photos_for(folder)[:2]  # fp16 convolutions are slow on a CPU; two photos make the point
    _, graph = build_graph(Checkpoint(folder), "fp16")
    all_fp16 = PrecisionPolicy("fp16", overrides=(("*.attn.*", DType.F16),))
    with torch.no_grad():
        expected = load_timm(folder)(photos)
        default = GraphModule(assign_precision(graph, PrecisionPolicy("fp16")))(photos).float()
        forced = GraphModule(assign_precision(graph, all_fp16))(photos).float()
    record_property("default_fp16_rel_err", relative_error(default, expected))
    assert torch.isfinite(expected).all()
    assert torch.isfinite(default).all()
    assert all(m < TIE_MARGIN["fp16"] for m in flip_margins(default, expected))
    assert not torch.isfinite(forced).all()  # the test bites: without the fp32 island the logits break


def test_fp16_marks_the_attention_division_and_its_operands_fp32(timm_checkpoint):
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    typed = {n.name: n for n in assign_precision(graph, PrecisionPolicy("fp16")).nodes}
    main = "stages.2.blocks.1.context_module.main"
    for leaf in ("kv", "k_sum", "kv_sum", "out", "num", "den", "den_eps", "div"):
        node = typed[f"{main}.attn.{leaf}"]
        assert node.sensitive and node.type.dtype is DType.F32, leaf
    assert typed[f"{main}.qkv.conv"].type.dtype is DType.F16


def test_each_attention_block_takes_two_products_as_timms_does(timm_checkpoint):
    # k^T [v; 1] and q against it: the normalizer rides along with the numerator (four products ran
    # efficientvit_b1 at 0.91x timm + torch.compile on the H200).
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    blocks = {n.name.split(".attn.")[0] for n in graph.nodes if ".attn." in n.name}
    products = [n for n in graph.nodes if n.kind is OpKind.MATMUL]
    assert blocks and len(products) == 2 * len(blocks)


def test_the_second_product_is_q_against_kv_one_row_per_token_as_timms(timm_checkpoint):
    # Its transpose (d + 1 rows of tokens) ran on cuBLAS's small-N GEMV kernel at batch 128: 264 us against the
    # expert's 122 (run 31, H100).
    _, graph = build_graph(Checkpoint(timm_checkpoint(SMALLEST)), "fp16")
    main = "stages.2.blocks.1.context_module.main"
    out, kv = graph.node(f"{main}.attn.out"), graph.node(f"{main}.attn.kv_sum")
    *_, height, width = graph.node(f"{main}.qkv.conv").type.shape
    d = kv.type.shape[-2]
    assert out.type.shape[-2:] == (height * width, d + 1) and kv.type.shape[-1] == d + 1


def test_inconsistent_head_width_is_refused_before_weights_load(timm_checkpoint, tmp_path, monkeypatch):
    def regroup(state):
        name = "stages.3.blocks.1.context_module.main.aggreg.0.1.weight"
        state[name] = state[name][:, :12]  # 12-wide groups cannot split the 384 qkv channels into heads

    folder = rewritten_checkpoint(timm_checkpoint(SMALLEST), tmp_path / "bad", regroup)
    qkv = r"stages\.3\.blocks\.1\.context_module\.main\.qkv\.conv\.weight"
    assert_refused_before_weights_load(folder, monkeypatch, CheckpointError, qkv + r".*heads of 12")
