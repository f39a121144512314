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
from ..graph import Activation, Binary, Graph
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._parts import (
    act, batch_norm, block_indices, classifier_head, conv, expect_shape, expect_tensors, image_input, norm_shapes,
)


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


class _Reader:
    """Walks the checkpoint's names and shapes, recording every tensor a spec will read."""

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt, self.names = ckpt, set(ckpt.names)
        self.arch = ckpt.config.architecture
        self.expected: dict[str, tuple[int, ...]] = {}

    def conv(self, prefix: str, width: int, *, stride: int = 1, act: bool = False) -> tuple[ConvSpec, int]:
        shape = expect_shape(self.ckpt, f"{prefix}.conv.weight", rank=4)
        out = shape[0]
        if width % shape[1]:
            raise CheckpointError(f"{self.arch}: {prefix}.conv.weight {shape} cannot read {width} channels")
        self.expected[f"{prefix}.conv.weight"] = shape
        if f"{prefix}.conv.bias" in self.names:
            self.expected[f"{prefix}.conv.bias"] = (out,)
        norm = f"{prefix}.norm.weight" in self.names
        if norm:
            self.expected.update(norm_shapes(f"{prefix}.norm", out))
        return ConvSpec(prefix, stride, norm, act), out

    def local(self, prefix: str, width: int, *, stride: int, residual: bool) -> tuple[LocalBlock, int]:
        # MBConv expands with `inverted_conv` first; DSConv starts at the depthwise conv. The stride
        # sits on the depthwise conv, and the closing `point_conv` has no activation.
        leaves = ("depth_conv", "point_conv")
        if f"{prefix}.main.inverted_conv.conv.weight" in self.names:
            leaves = ("inverted_conv",) + leaves
        convs, out = [], width
        for leaf in leaves:
            spec, out = self.conv(
                f"{prefix}.main.{leaf}", out, stride=stride if leaf == "depth_conv" else 1, act=leaf != "point_conv"
            )
            convs.append(spec)
        if residual and out != width:
            raise CheckpointError(f"{self.arch}: residual block {prefix} maps {width} channels to {out}")
        return LocalBlock(prefix, tuple(convs), residual), out

    def attention(self, prefix: str, width: int) -> AttentionBlock:
        main = f"{prefix}.main"
        qkv, qkv_width = self.conv(f"{main}.qkv", width)
        scales = len(block_indices(self.ckpt, rf"^{re.escape(main)}\.aggreg\.(\d+)\.0\.weight$"))
        if not scales:
            raise CheckpointError(f"{self.arch}: {main} has no aggreg.<k> convolutions to give its head width")
        # The grouped 1x1 of each aggregation branch has one group per (q, k, v) of a head, so the
        # per-group input width is the head width.
        head_dim = expect_shape(self.ckpt, f"{main}.aggreg.0.1.weight", rank=4)[1]
        if qkv_width % (3 * head_dim):
            raise CheckpointError(
                f"{self.arch}: {main}.qkv.conv.weight {(qkv_width, width, 1, 1)} does not split into q, k, v "
                f"heads of {head_dim} channels"
            )
        for k in range(scales):
            kernel = expect_shape(self.ckpt, f"{main}.aggreg.{k}.0.weight", rank=4)[2]
            self.expected[f"{main}.aggreg.{k}.0.weight"] = (qkv_width, 1, kernel, kernel)
            self.expected[f"{main}.aggreg.{k}.1.weight"] = (qkv_width, head_dim, 1, 1)
        proj, out = self.conv(f"{main}.proj", qkv_width // 3 * (1 + scales))
        if out != width:
            raise CheckpointError(f"{self.arch}: {main}.proj maps back to {out} channels, not {width}")
        return AttentionBlock(prefix, qkv, scales, head_dim, proj)


def derive_layout(ckpt: Checkpoint, arch: EfficientViTConfig) -> Layout:
    """Stem, stages and head from names and shapes; the stride pattern is timm's (see the comments)."""
    read = _Reader(ckpt)
    stem, width = read.conv("stem.in_conv", ckpt.config.pretrained.input_size[0], stride=2, act=True)
    blocks: list[LocalBlock | AttentionBlock] = []
    for (j,) in block_indices(ckpt, r"^stem\.res(\d+)\."):
        block, width = read.local(f"stem.res{j}", width, stride=1, residual=True)
        blocks.append(block)
    indices = block_indices(ckpt, r"^stages\.(\d+)\.blocks\.(\d+)\.")
    if not indices:
        raise CheckpointError(f"{read.arch}: no stages.<i>.blocks.<j> tensors; not an EfficientViT checkpoint")
    stages = sorted({s for s, _ in indices})
    if stages != list(range(len(stages))):
        raise CheckpointError(f"{read.arch}: stage indices {stages} in stages.<i>.blocks.<j> are not 0, 1, 2, ...")
    for stage in stages:
        block_ids = [b for s, b in indices if s == stage]
        if block_ids != list(range(len(block_ids))):
            raise CheckpointError(f"{read.arch}: block indices {block_ids} of stages.{stage} are not 0, 1, 2, ...")
        for j in block_ids:
            prefix = f"stages.{stage}.blocks.{j}"
            if f"{prefix}.context_module.main.qkv.conv.weight" in read.names:
                blocks.append(read.attention(f"{prefix}.context_module", width))
                block, width = read.local(f"{prefix}.local_module", width, stride=1, residual=True)
            else:
                # timm opens every stage with a stride-2 block that changes width and has no shortcut.
                block, width = read.local(prefix, width, stride=2 if j == 0 else 1, residual=j > 0)
            blocks.append(block)
    head, width = read.conv("head.in_conv", width, act=True)
    hidden = expect_shape(ckpt, "head.classifier.0.weight", rank=2, dims={1: width})[0]
    classes = ckpt.config.num_classes
    read.expected.update({
        "head.classifier.0.weight": (hidden, width),
        "head.classifier.1.weight": (hidden,),
        "head.classifier.1.bias": (hidden,),
        "head.classifier.4.weight": (classes, hidden),
        "head.classifier.4.bias": (classes,),
    })
    expect_tensors(ckpt, read.expected)
    return Layout(stem, tuple(blocks), head)


def _conv_norm_act(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, spec: ConvSpec, arch: EfficientViTConfig) -> Tensor:
    x = conv(g, x, ckpt, f"{spec.prefix}.conv", stride=spec.stride)
    if spec.norm:
        x = batch_norm(g, x, ckpt, f"{spec.prefix}.norm", arch.bn_eps)
    return act(g, x, arch.act if spec.act else None, f"{spec.prefix}.act")


def _lite_mla(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: AttentionBlock, arch: EfficientViTConfig) -> Tensor:
    """ReLU linear attention, computed transposed: timm's (tokens, head_dim) operands as (head_dim, tokens).

    timm pads v with a column of ones so that one product yields both q (k^T v) and its normalizer
    q (k^T 1). A concat does not broadcast a constant over the batch, so here the two come from
    separate products: q (k^T v), and q against the token sum of k.
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
    vk = g.matmul(v, k, f"{main}.attn.vk", transpose_b=True, sensitive=True)  # (k^T v)^T: [1, groups, d, d]
    num = g.matmul(vk, q, f"{main}.attn.num", sensitive=True)  # [1, groups, d, tokens]
    # The token sum of k as a product with a row of ones: unlike a reduce, a matmul can be marked
    # sensitive, and its result comes out as the row the next product needs: [1, groups, 1, d].
    ones = g.constant(f"{main}.attn.ones", np.ones((1, 1, 1, height * width), np.float32))
    k_sum = g.matmul(ones, k, f"{main}.attn.k_sum", transpose_b=True, sensitive=True)
    den = g.matmul(k_sum, q, f"{main}.attn.den", sensitive=True)  # [1, groups, 1, tokens]
    eps = g.constant(f"{main}.attn.eps", np.full((1, 1, 1, 1), arch.attn_eps, np.float32))
    den = g.binary(den, eps, Binary.ADD, f"{main}.attn.den_eps", sensitive=True)
    out = g.binary(num, den, Binary.DIV, f"{main}.attn.div", sensitive=True)
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
    x = g.linear(x, "head.classifier.0", ckpt.tensor("head.classifier.0.weight"))
    weight, bias = ckpt.tensor("head.classifier.1.weight"), ckpt.tensor("head.classifier.1.bias")
    x = g.layer_norm(x, "head.classifier.1", weight, bias, arch.ln_eps)
    x = g.activation(x, arch.act, "head.classifier.2")
    return classifier_head(g, x, ckpt, "head.classifier.4")


def build(ckpt: Checkpoint, arch: EfficientViTConfig) -> Graph:
    layout = derive_layout(ckpt, arch)
    g = GraphBuilder()
    g.output(emit(g, ckpt, layout, arch))
    return g.finish()


FAMILY = Family(
    name="efficientvit",
    summary="EfficientViT-B (MIT): MBConv stages, then ReLU linear attention (LiteMLA) with multi-scale tokens",
    architectures={
        "efficientvit_b0": EfficientViTConfig(),
        "efficientvit_b1": EfficientViTConfig(),
        "efficientvit_b2": EfficientViTConfig(),
    },
    build=build,
)
