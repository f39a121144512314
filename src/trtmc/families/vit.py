"""Vision Transformer (Dosovitskiy et al., https://arxiv.org/abs/2010.11929) and DeiT as timm builds them.

It reads `patch_embed.proj`, `cls_token`, `pos_embed`, `blocks.<i>.{norm1, attn.qkv, attn.proj, norm2,
mlp.fc1, mlp.fc2}`, `norm` and `head`; width, depth, patch size and MLP width come from their shapes,
and only the head count, which no tensor records, comes from the per-architecture config.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv, image_input, layer_norm, linear, multi_head_attention

_BLOCK = r"^blocks\.(\d+)\."


@dataclass(frozen=True)
class ViTConfig:
    # The fused qkv weight is [3 * width, width] whatever the head count, so it has to be stated:
    # timm registers ViT-Ti with 3 heads, ViT-S and DeiT-S with 6, ViT-B with 12 (all 64 wide).
    num_heads: int
    # timm's ViT LayerNorm is LayerNorm(eps=1e-6), not torch's 1e-5.
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
    qkv_bias: bool

    @property
    def tokens(self) -> int:
        return 1 + self.grid[0] * self.grid[1]  # the class token first, then the patches

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


def derive_layout(ckpt: Checkpoint, arch: ViTConfig) -> Layout:
    """Width, depth, patch and MLP width from names and shapes; the head count from `arch`."""
    read = LayoutReader(ckpt)
    in_chans, height, width_px = ckpt.config.pretrained.input_size
    width, _, patch, patch_w = read.shape("patch_embed.proj.weight", rank=4, dims={1: in_chans})
    if patch != patch_w or height % patch or width_px % patch:
        raise UnsupportedModel(
            f"{read.arch}: patch_embed.proj.weight {(width, in_chans, patch, patch_w)} does not tile the "
            f"{height}x{width_px} input into square patches"
        )
    if width % arch.num_heads:
        raise CheckpointError(
            f"{read.arch}: width {width} (patch_embed.proj.weight) does not split into {arch.num_heads} heads"
        )
    grid = (height // patch, width_px // patch)
    positions = read.shape("pos_embed", rank=3)[1]
    if positions != 1 + grid[0] * grid[1]:
        raise UnsupportedModel(
            f"{read.arch}: pos_embed {ckpt.shape('pos_embed')} has {positions} positions but a {height}x{width_px} input "
            f"makes {grid[0] * grid[1]} patches plus the class token; trtmc does not resample position embeddings"
        )
    depth = len(indexed_blocks(ckpt, _BLOCK))
    if not depth:
        raise CheckpointError(f"{read.arch}: no blocks.<i> tensors; not a Vision Transformer checkpoint")
    hidden = read.shape("blocks.0.mlp.fc1.weight", rank=2)[0]
    layout = Layout(patch, width, grid, arch.num_heads, hidden, depth, "blocks.0.attn.qkv.bias" in read)

    read.tensor("patch_embed.proj.weight", (width, in_chans, patch, patch))
    read.tensor("patch_embed.proj.bias", (width,))
    read.tensor("cls_token", (1, 1, width))
    read.tensor("pos_embed", (1, layout.tokens, width))
    for i in range(depth):
        p = f"blocks.{i}"
        read.layer_norm(f"{p}.norm1", width)
        read.linear(f"{p}.attn.qkv", width, 3 * width, bias=layout.qkv_bias)
        read.linear(f"{p}.attn.proj", width, width, bias=True)
        read.layer_norm(f"{p}.norm2", width)
        read.linear(f"{p}.mlp.fc1", width, hidden, bias=True)
        read.linear(f"{p}.mlp.fc2", hidden, width, bias=True)
    read.layer_norm("norm", width)
    read.classifier("head", width, bias=True)
    read.finish()
    return layout


def _embed(g: GraphBuilder, ckpt: Checkpoint, layout: Layout) -> Tensor:
    x = image_input(g, ckpt)
    x = conv(g, x, ckpt, "patch_embed.proj", stride=layout.patch, padding=0)
    x = g.reshape(x, (layout.width, layout.tokens - 1), "patch_embed.flatten")
    x = g.transpose(x, (0, 2, 1), "patch_embed.transpose")  # [1, patches, width]
    # A concat does not broadcast a constant over the batch, so the class token is made batch-sized
    # from the first patch: a scale with weight 0 and shift cls_token is x * 0 + cls_token.
    first = g.slice(x, 1, 0, 1, "patch_embed.first")
    token = ckpt.tensor("cls_token").reshape(-1)
    cls = g.scale(first, "cls_token", np.zeros_like(token), token, axis=-1)
    x = g.concat([cls, x], 1, "cls_token.cat")
    return g.add(x, g.constant("pos_embed", ckpt.tensor("pos_embed")), "pos_embed.add")


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, layout: Layout, arch: ViTConfig) -> Tensor:
    y = layer_norm(g, x, ckpt, f"{prefix}.norm1", arch.norm_eps)
    x = g.add(x, multi_head_attention(g, y, ckpt, f"{prefix}.attn", layout.heads), f"{prefix}.residual1")
    y = layer_norm(g, x, ckpt, f"{prefix}.norm2", arch.norm_eps)
    y = linear(g, y, ckpt, f"{prefix}.mlp.fc1")
    y = g.activation(y, arch.act, f"{prefix}.mlp.act")
    y = linear(g, y, ckpt, f"{prefix}.mlp.fc2")
    return g.add(x, y, f"{prefix}.residual2")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ViTConfig) -> Tensor:
    x = _embed(g, ckpt, layout)
    for i in range(layout.depth):
        x = _emit_block(g, x, ckpt, f"blocks.{i}", layout, arch)
    # The final norm is per token and only the class token is classified, so take it first and
    # normalize one token instead of all of them.
    x = g.slice(x, 1, 0, 1, "pool")
    x = g.reshape(x, (layout.width,), "pool.flatten")
    x = layer_norm(g, x, ckpt, "norm", arch.norm_eps)
    return linear(g, x, ckpt, "head")


FAMILY = Family(
    name="vit",
    summary="Vision Transformer / DeiT: patch embedding, class token, pre-norm attention + GELU MLP blocks",
    architectures={
        "vit_tiny_patch16_224": ViTConfig(num_heads=3),
        "vit_small_patch16_224": ViTConfig(num_heads=6),
        "vit_base_patch16_224": ViTConfig(num_heads=12),
        "deit_small_patch16_224": ViTConfig(num_heads=6),
    },
    derive_layout=derive_layout,
    emit=emit,
)
