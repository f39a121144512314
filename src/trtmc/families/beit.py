"""BEiT (Bao et al., https://arxiv.org/abs/2106.08254) and BEiT v2 classifiers as timm's `beit` builds them:
a ViT with a relative position bias in every attention, q and v biases without a k bias, layer scale,
and mean pooling of the patches into a final norm.

It reads `patch_embed.proj`, `cls_token`, `blocks.<i>.{norm1, attn.qkv, attn.q_bias, attn.v_bias,
attn.relative_position_bias_table, attn.proj, gamma_1, norm2, mlp.fc1, mlp.fc2, gamma_2}`, `fc_norm` and
`head`; width, depth, patch size, MLP width and the head count (the bias table's columns) come from
their shapes, and only the norm eps from the per-architecture config.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Reduction
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import (
    embed_patches,
    layer_norm,
    linear,
    merge_heads,
    prepend_tokens,
    relative_position_index,
    split_heads,
    transformer_block,
)

_BLOCK = r"^blocks\.(\d+)\."
# The table's last three rows: what the class token sees, what sees the class token, and the class
# token on itself (timm's gen_relative_position_index).
_CLASS_ROWS = 3


@dataclass(frozen=True)
class BeitConfig:
    # timm's Beit defaults to its LayerNorm (eps 1e-6), and no BEiT served here sets another.
    norm_eps: float = 1e-6
    # The MLP uses nn.GELU, the exact erf form.
    act: Activation = Activation.GELU


@dataclass(frozen=True)
class Layout:
    patch: int
    width: int
    grid: tuple[int, int]  # patches along height and width
    heads: int
    hidden: int  # MLP width
    depth: int
    layer_scale: bool  # gamma_1 / gamma_2 multiply each branch per channel

    @property
    def tokens(self) -> int:
        return 1 + self.grid[0] * self.grid[1]  # the class token first, then the patches


def _heads(read: LayoutReader, width: int, grid: tuple[int, int]) -> int:
    """The head count: the columns of block 0's relative position bias table, whose rows must be those
    of the patch grid."""
    name = "blocks.0.attn.relative_position_bias_table"
    rows, heads = read.shape(name, rank=2)
    want = (2 * grid[0] - 1) * (2 * grid[1] - 1) + _CLASS_ROWS
    if rows != want:
        raise UnsupportedModel(
            f"{read.arch}: {name} has {rows} rows, but a {grid[0]}x{grid[1]} patch grid takes {want}; trtmc does "
            "not resize relative position bias tables to another input size"
        )
    if width % heads:
        raise CheckpointError(f"{read.arch}: width {width} does not split into the {heads} heads of {name}")
    return heads


def derive_layout(ckpt: Checkpoint, arch: BeitConfig) -> Layout:
    """Width, depth, patch, heads and MLP width from names and shapes; no weight is read."""
    read = LayoutReader(ckpt)
    width, patch, grid = read.patch_grid()
    depth = len(indexed_blocks(ckpt, _BLOCK))
    if not depth:
        raise CheckpointError(f"{read.arch}: no blocks.<i> tensors; not a BEiT checkpoint")
    layout = Layout(
        patch, width, grid, _heads(read, width, grid),
        hidden=read.shape("blocks.0.mlp.fc1.weight", rank=2)[0],
        depth=depth,
        layer_scale="blocks.0.gamma_1" in read,
    )
    read.conv("patch_embed.proj", ckpt.config.pretrained.input_size[0], bias=True)
    read.tensor("cls_token", (1, 1, width))
    table = ((2 * grid[0] - 1) * (2 * grid[1] - 1) + _CLASS_ROWS, layout.heads)
    for i in range(depth):
        p = f"blocks.{i}"
        read.layer_norm(f"{p}.norm1", width)
        read.linear(f"{p}.attn.qkv", width, 3 * width, bias=False)
        read.tensor(f"{p}.attn.q_bias", (width,))
        read.tensor(f"{p}.attn.v_bias", (width,))
        read.tensor(f"{p}.attn.relative_position_bias_table", table)
        read.linear(f"{p}.attn.proj", width, width, bias=True)
        read.layer_norm(f"{p}.norm2", width)
        read.mlp(f"{p}.mlp", width, layout.hidden)
        if layout.layer_scale:
            read.tensor(f"{p}.gamma_1", (width,))
            read.tensor(f"{p}.gamma_2", (width,))
    read.layer_norm("fc_norm", width)
    read.classifier("head", width, bias=True)
    read.finish()
    return layout


def relative_position_bias(table: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """[1, heads, tokens, tokens]: the table's entry for each pair of tokens, the class token first, as
    timm's gen_relative_position_index numbers them."""
    patches = relative_position_index(*grid)
    rows = len(table)
    index = np.empty((patches.shape[0] + 1,) * 2, np.int64)
    index[1:, 1:] = patches
    index[0, :] = rows - 3  # the class token attending to a patch
    index[:, 0] = rows - 2  # a patch attending to the class token
    index[0, 0] = rows - 1
    return np.ascontiguousarray(table[index].transpose(2, 0, 1)[None])


def _attention(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, layout: Layout) -> Tensor:
    """timm's beit Attention: the fused qkv projection with q and v biases and a zero k bias, one
    ATTENTION op with the block's relative position bias, the output projection."""
    q_bias, v_bias = ckpt.tensor(f"{prefix}.q_bias"), ckpt.tensor(f"{prefix}.v_bias")
    bias = np.concatenate([q_bias, np.zeros_like(q_bias), v_bias])
    qkv = g.linear(x, f"{prefix}.qkv", ckpt.tensor(f"{prefix}.qkv.weight"), bias)
    q, k, v = split_heads(g, qkv, layout.heads, prefix)
    table = ckpt.tensor(f"{prefix}.relative_position_bias_table")
    out = g.attention(q, k, v, prefix, scale=q.shape[3] ** -0.5, bias=relative_position_bias(table, layout.grid))
    return linear(g, merge_heads(g, out, prefix), ckpt, f"{prefix}.proj")


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, layout: Layout, arch: BeitConfig) -> Tensor:
    gammas = (f"{prefix}.gamma_1", f"{prefix}.gamma_2") if layout.layer_scale else None
    attend = partial(_attention, g, ckpt=ckpt, prefix=f"{prefix}.attn", layout=layout)
    return transformer_block(g, x, ckpt, prefix, attend, eps=arch.norm_eps, act=arch.act, gammas=gammas)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: BeitConfig) -> Tensor:
    x = prepend_tokens(g, embed_patches(g, ckpt, "patch_embed.proj", layout.patch), ckpt.tensor("cls_token"), "cls_token")
    for i in range(layout.depth):
        x = _emit_block(g, x, ckpt, f"blocks.{i}", layout, arch)
    # global_pool='avg': the mean of the patches, without the class token, then fc_norm.
    x = g.reduce(g.slice(x, 1, 1, layout.tokens, "pool.patches"), "pool", Reduction.MEAN, (1,), keepdim=False)
    x = layer_norm(g, x, ckpt, "fc_norm", arch.norm_eps)
    return linear(g, x, ckpt, "head")


FAMILY = Family(
    name="beit",
    summary="BEiT / BEiT v2: ViT blocks with per-block relative position bias, layer scale, mean pooling + fc_norm",
    architectures={
        "beit_base_patch16_224": BeitConfig(),
        "beitv2_base_patch16_224": BeitConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
