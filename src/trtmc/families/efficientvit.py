"""EfficientViT-B from MIT (Cai et al., https://arxiv.org/abs/2205.14756) as timm's `efficientvit_mit` builds it.

It reads `stem.{in_conv, res<j>}`, `stages.<i>.blocks.<j>` (MBConv / DSConv `main.*`, or `context_module`
LiteMLA + `local_module` MBConv) and `head.{in_conv, classifier.{0,1,4}}`; widths, head width, the
attention's head count and its multi-scale kernels come from the shapes, conv biases and norms from the names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Binary, Reduction
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import act, batch_norm, conv, image_input, layer_norm, linear


@dataclass(frozen=True)
class EfficientViTConfig:
    # timm passes nn.BatchNorm2d itself, so every batch norm keeps torch's eps=1e-5.
    bn_eps: float = 1e-5
    # ClassifierHead's nn.LayerNorm(eps=norm_eps) with norm_eps=1e-5.
    ln_eps: float = 1e-5
    # LiteMLA divides by (sum + eps) with eps=1e-5.
    attn_eps: float = 1e-5
    # EfficientVit's act_layer defaults to nn.Hardswish and the B variants keep it.
    act: Activation = Activation.HARD_SWISH
    # LiteMLA's kernel_func: a ReLU on q and k makes the attention linear.
    kernel: Activation = Activation.RELU


@dataclass(frozen=True)
class ConvSpec:
    """timm's ConvNormAct at `prefix`: `.conv` (with a bias if stored), `.norm` if stored, then the act."""

    prefix: str
    stride: int
    norm: bool
    act: bool


@dataclass(frozen=True)
class LocalBlock:
    """A DSConv or MBConv: a chain of ConvNormAct, with a residual sum around it unless it strides."""

    prefix: str  # the ResidualBlock; the chain sits under `<prefix>.main`
    convs: tuple[ConvSpec, ...]
    residual: bool


@dataclass(frozen=True)
class AttentionBlock:
    """LiteMLA, always inside a residual sum."""

    prefix: str  # <block>.context_module; the attention sits under `<prefix>.main`
    qkv: ConvSpec
    scales: int  # multi-scale aggregation branches (`aggreg.<k>`): one 5x5 for the B variants
    head_dim: int
    proj: ConvSpec
    residual: bool = True


@dataclass(frozen=True)
class Layout:
    stem: ConvSpec
    blocks: tuple[LocalBlock | AttentionBlock, ...]  # stem residual blocks, then every stage's
    head: ConvSpec


def _conv(read: LayoutReader, prefix: str, width: int, *, stride: int = 1, act: bool = False) -> tuple[ConvSpec, int]:
    norm = f"{prefix}.norm.weight" in read
    out = read.conv(f"{prefix}.conv", width, norm=f"{prefix}.norm" if norm else None)
    return ConvSpec(prefix, stride, norm, act), out


def _local(read: LayoutReader, prefix: str, width: int, *, stride: int, residual: bool) -> tuple[LocalBlock, int]:
    # MBConv expands with `inverted_conv` first; DSConv starts at the depthwise conv. The stride
    # sits on the depthwise conv, and the closing `point_conv` has no activation.
    leaves = ("depth_conv", "point_conv")
    if f"{prefix}.main.inverted_conv.conv.weight" in read:
        leaves = ("inverted_conv",) + leaves
    convs, out = [], width
    for leaf in leaves:
        spec, out = _conv(
            read, f"{prefix}.main.{leaf}", out, stride=stride if leaf == "depth_conv" else 1, act=leaf != "point_conv"
        )
        convs.append(spec)
    if residual and out != width:
        raise CheckpointError(f"{read.arch}: residual block {prefix} maps {width} channels to {out}")
    return LocalBlock(prefix, tuple(convs), residual), out


def _attention(read: LayoutReader, prefix: str, width: int) -> AttentionBlock:
    main = f"{prefix}.main"
    qkv, qkv_width = _conv(read, f"{main}.qkv", width)
    scales = len(indexed_blocks(read.ckpt, rf"^{re.escape(main)}\.aggreg\.(\d+)\.0\.weight$"))
    if not scales:
        raise CheckpointError(f"{read.arch}: {main} has no aggreg.<k> convolutions to give its head width")
    # The grouped 1x1 of each aggregation branch has one group per (q, k, v) of a head, so the
    # per-group input width is the head width.
    head_dim = read.shape(f"{main}.aggreg.0.1.weight", rank=4)[1]
    if qkv_width % (3 * head_dim):
        raise CheckpointError(
            f"{read.arch}: {main}.qkv.conv.weight {(qkv_width, width, 1, 1)} does not split into q, k, v "
            f"heads of {head_dim} channels"
        )
    for k in range(scales):
        kernel = read.shape(f"{main}.aggreg.{k}.0.weight", rank=4)[2]
        read.tensor(f"{main}.aggreg.{k}.0.weight", (qkv_width, 1, kernel, kernel))
        read.tensor(f"{main}.aggreg.{k}.1.weight", (qkv_width, head_dim, 1, 1))
    proj, out = _conv(read, f"{main}.proj", qkv_width // 3 * (1 + scales))
    if out != width:
        raise CheckpointError(f"{read.arch}: {main}.proj maps back to {out} channels, not {width}")
    return AttentionBlock(prefix, qkv, scales, head_dim, proj)


def derive_layout(ckpt: Checkpoint, arch: EfficientViTConfig) -> Layout:
    """Stem, stages and head from names and shapes; the stride pattern is timm's (see the comments)."""
    read = LayoutReader(ckpt)
    stem, width = _conv(read, "stem.in_conv", ckpt.config.pretrained.input_size[0], stride=2, act=True)
    blocks: list[LocalBlock | AttentionBlock] = []
    for (j,) in indexed_blocks(ckpt, r"^stem\.res(\d+)\."):
        block, width = _local(read, f"stem.res{j}", width, stride=1, residual=True)
        blocks.append(block)
    indices = indexed_blocks(ckpt, r"^stages\.(\d+)\.blocks\.(\d+)\.")
    if not indices:
        raise CheckpointError(f"{read.arch}: no stages.<i>.blocks.<j> tensors; not an EfficientViT checkpoint")
    for stage, j in indices:
        prefix = f"stages.{stage}.blocks.{j}"
        if f"{prefix}.context_module.main.qkv.conv.weight" in read:
            blocks.append(_attention(read, f"{prefix}.context_module", width))
            block, width = _local(read, f"{prefix}.local_module", width, stride=1, residual=True)
        else:
            # timm opens every stage with a stride-2 block that changes width and has no shortcut.
            block, width = _local(read, prefix, width, stride=2 if j == 0 else 1, residual=j > 0)
        blocks.append(block)
    head, width = _conv(read, "head.in_conv", width, act=True)
    hidden = read.linear("head.classifier.0", width, bias=False)
    read.layer_norm("head.classifier.1", hidden)
    read.classifier("head.classifier.4", hidden, bias=True)
    read.finish()
    return Layout(stem, tuple(blocks), head)


def _conv_norm_act(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, spec: ConvSpec, arch: EfficientViTConfig) -> Tensor:
    x = conv(g, x, ckpt, f"{spec.prefix}.conv", stride=spec.stride)
    if spec.norm:
        x = batch_norm(g, x, ckpt, f"{spec.prefix}.norm", arch.bn_eps)
    return act(g, x, arch.act if spec.act else None, f"{spec.prefix}.act")


def _lite_mla(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: AttentionBlock, arch: EfficientViTConfig) -> Tensor:
    """ReLU linear attention: timm's (tokens, head_dim) operands arrive as (head_dim, tokens) from the convolutions.

    timm pads v with a row of ones so that one product, k^T [v, 1], yields both k^T v and the token sum of k,
    and a second, q against it, both the numerator and the normalizer. A concat does not broadcast a
    constant over the batch, so here the sum of k is a reduce and is stacked beside k^T v: two products
    per block, as timm's (four, as this was before, ran efficientvit_b1 at 0.91x the expert at batch 1 on
    the H200; run 8). The second product is timm's q [kv] (tokens x (d + 1)), not its transpose (kv^T q: d + 1
    rows of tokens): cuBLAS ran that one on a small-N GEMV kernel, 264 us of the engine's 4.30 ms at batch 128
    where the expert's 4.15 ms spent 122 (run 31, H100, tools/miss_profile.py).

    There is no softmax, so this is not the graph's ATTENTION op (softmax attention, whose fused
    kernels keep their statistics in fp32): its products stay separate ops, marked sensitive.
    """
    main, d = f"{block.prefix}.main", block.head_dim
    _, _, height, width = x.shape
    qkv = _conv_norm_act(g, x, ckpt, block.qkv, arch)
    branches = [qkv]
    for k in range(block.scales):
        y = conv(g, qkv, ckpt, f"{main}.aggreg.{k}.0")
        branches.append(conv(g, y, ckpt, f"{main}.aggreg.{k}.1"))
    qkv = g.concat(branches, 1, f"{main}.aggreg")
    groups = qkv.channels // (3 * d)  # heads x (1 + scales)
    qkv = g.reshape(qkv, (groups, 3 * d, height * width), f"{main}.split_heads")  # [1, groups, (q, k, v), tokens]
    q = g.activation(g.slice(qkv, 2, 0, d, f"{main}.q"), arch.kernel, f"{main}.kernel_func")
    k = g.activation(g.slice(qkv, 2, d, 2 * d, f"{main}.k"), arch.kernel, f"{main}.kernel_func")
    v = g.slice(qkv, 2, 2 * d, 3 * d, f"{main}.v")
    # Everything from here to the division runs in fp32 under fp16 (timm disables autocast for it):
    # token sums of ReLU products overflow fp16, and the ratio of two such sums is meaningless then.
    kv = g.matmul(k, v, f"{main}.attn.kv", transpose_b=True, sensitive=True)  # k^T v: [1, groups, d, d]
    k_sum = g.reduce(k, f"{main}.attn.k_sum", Reduction.SUM, (3,), keepdim=True, sensitive=True)  # [1, groups, d, 1]
    kv = g.concat([kv, k_sum], 3, f"{main}.attn.kv_sum", sensitive=True)  # k^T [v, 1]: [1, groups, d, d + 1]
    q = g.transpose(q, (0, 1, 3, 2), f"{main}.attn.q_tokens")  # [1, groups, tokens, d]
    out = g.matmul(q, kv, f"{main}.attn.out", sensitive=True)  # [1, groups, tokens, d + 1]
    num = g.slice(out, 3, 0, d, f"{main}.attn.num", sensitive=True)
    den = g.slice(out, 3, d, d + 1, f"{main}.attn.den", sensitive=True)  # [1, groups, tokens, 1]
    eps = g.constant(f"{main}.attn.eps", np.full((1, 1, 1, 1), arch.attn_eps, np.float32))
    den = g.binary(den, eps, Binary.ADD, f"{main}.attn.den_eps", sensitive=True)
    out = g.binary(num, den, Binary.DIV, f"{main}.attn.div", sensitive=True)
    out = g.transpose(out, (0, 1, 3, 2), f"{main}.attn.channels")  # [1, groups, d, tokens]
    out = g.reshape(out, (groups * d, height, width), f"{main}.merge_heads")
    return _conv_norm_act(g, out, ckpt, block.proj, arch)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: EfficientViTConfig) -> Tensor:
    x = _conv_norm_act(g, image_input(g, ckpt), ckpt, layout.stem, arch)
    for block in layout.blocks:
        if isinstance(block, AttentionBlock):
            y = _lite_mla(g, x, ckpt, block, arch)
        else:
            y = x
            for spec in block.convs:
                y = _conv_norm_act(g, y, ckpt, spec, arch)
        x = g.add(y, x, f"{block.prefix}.add") if block.residual else y
    x = _conv_norm_act(g, x, ckpt, layout.head, arch)
    x = g.global_avg_pool(x, "head.global_pool")
    x = linear(g, x, ckpt, "head.classifier.0")
    x = layer_norm(g, x, ckpt, "head.classifier.1", arch.ln_eps)
    x = g.activation(x, arch.act, "head.classifier.2")
    return linear(g, x, ckpt, "head.classifier.4")


FAMILY = Family(
    name="efficientvit",
    summary="EfficientViT-B (MIT): MBConv stages, then ReLU linear attention (LiteMLA) with multi-scale tokens",
    architectures={
        "efficientvit_b0": EfficientViTConfig(),
        "efficientvit_b1": EfficientViTConfig(),
        "efficientvit_b2": EfficientViTConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
