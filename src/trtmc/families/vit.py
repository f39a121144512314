"""Vision Transformer (Dosovitskiy et al., https://arxiv.org/abs/2010.11929) as timm builds it, with the
variants that are options of it: DeiT, DeiT III (layer scale), DINOv2 (with or without register tokens)
and CLIP's image tower (a norm before the blocks).

It reads `patch_embed.proj`, `cls_token`, `reg_token`, `pos_embed`, `norm_pre`, `blocks.<i>.{norm1,
attn.qkv, attn.proj, ls1, norm2, mlp.fc1, mlp.fc2, ls2}`, `norm` and `head`; width, depth, patch size,
MLP width, register tokens, layer scale and the pre-norm come from their names and shapes, and what no
tensor records (the head count, the norm eps, which tokens the position embeddings cover) from the
per-architecture config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family
from ._layout import LayoutReader, indexed_blocks
from ._parts import embed_patches, layer_norm, linear, multi_head_attention, prepend_tokens, transformer_block

_BLOCK = r"^blocks\.(\d+)\."


@dataclass(frozen=True)
class ViTConfig:
    # The fused qkv weight is [3 * width, width] whatever the head count, so it has to be stated:
    # timm registers ViT-Ti with 3 heads, ViT-S and DeiT-S with 6, ViT-B with 12 (all 64 wide).
    num_heads: int
    # timm's ViT LayerNorm is LayerNorm(eps=1e-6), not torch's 1e-5; its CLIP towers pass 1e-5.
    norm_eps: float = 1e-6
    # The MLP uses nn.GELU, the exact erf form.
    act: Activation = Activation.GELU
    # timm's no_embed_class (DeiT III, DINOv2 with registers): the position embeddings cover the patches
    # only and the class and register tokens are prepended after they are added. Otherwise they cover
    # the class token too. A pos_embed of a resampled size cannot tell the two apart.
    no_embed_class: bool = False


@dataclass(frozen=True)
class Layout:
    patch: int
    width: int
    grid: tuple[int, int]  # patches along height and width at the checkpoint's input size
    trained_grid: tuple[int, int]  # the grid pos_embed holds; resampled to `grid` where they differ
    heads: int
    hidden: int  # MLP width
    depth: int
    qkv_bias: bool
    registers: int  # DINOv2's register tokens, after the class token
    layer_scale: bool  # ls1 / ls2 multiply each branch per channel (DeiT III, DINOv2)
    pre_norm: bool  # CLIP: norm_pre after the embeddings, and a patch projection without bias

    @property
    def prefix(self) -> int:
        return 1 + self.registers  # the class token, then the registers

    @property
    def tokens(self) -> int:
        return self.prefix + self.grid[0] * self.grid[1]

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


def _patch_grid(read: LayoutReader, arch: ViTConfig) -> tuple[int, int, tuple[int, int]]:
    """Width, patch size and patch grid from the patch projection and the checkpoint's input size."""
    width, patch, grid = read.patch_grid()
    if width % arch.num_heads:
        raise CheckpointError(
            f"{read.arch}: width {width} (patch_embed.proj.weight) does not split into {arch.num_heads} heads"
        )
    return width, patch, grid


def _trained_grid(read: LayoutReader, width: int, embedded: int, grid: tuple[int, int]) -> tuple[int, int]:
    """The patch grid pos_embed was trained at: the input's when the counts agree, else the square grid
    its patch positions (after the `embedded` prefix positions) make, as timm assumes when it resamples."""
    shape = read.shape("pos_embed", rank=3, dims={0: 1, 2: width})
    patches = shape[1] - embedded
    if patches == grid[0] * grid[1]:
        return grid
    side = math.isqrt(max(patches, 0))
    if patches <= 0 or side * side != patches:
        raise CheckpointError(
            f"{read.arch}: pos_embed {shape} holds {patches} patch positions after {embedded} prefix "
            f"position(s): neither the {grid[0]}x{grid[1]} input grid nor a square grid to resample"
        )
    return (side, side)


def derive_layout(ckpt: Checkpoint, arch: ViTConfig) -> Layout:
    """Width, depth, patch, MLP width, registers, layer scale and pre-norm from names and shapes; the
    head count and the position embeddings' coverage from `arch`."""
    read = LayoutReader(ckpt)
    width, patch, grid = _patch_grid(read, arch)
    registers = read.shape("reg_token", rank=3, dims={0: 1, 2: width})[1] if "reg_token" in read else 0
    trained_grid = _trained_grid(read, width, 0 if arch.no_embed_class else 1 + registers, grid)
    depth = len(indexed_blocks(ckpt, _BLOCK))
    if not depth:
        raise CheckpointError(f"{read.arch}: no blocks.<i> tensors; not a Vision Transformer checkpoint")
    layout = Layout(
        patch, width, grid, trained_grid, arch.num_heads,
        hidden=read.shape("blocks.0.mlp.fc1.weight", rank=2)[0],
        depth=depth,
        qkv_bias="blocks.0.attn.qkv.bias" in read,
        registers=registers,
        layer_scale="blocks.0.ls1.gamma" in read,
        pre_norm="norm_pre.weight" in read,
    )

    read.conv("patch_embed.proj", ckpt.config.pretrained.input_size[0], bias=not layout.pre_norm)
    read.tensor("cls_token", (1, 1, width))
    if registers:
        read.tensor("reg_token", (1, registers, width))
    embedded = 0 if arch.no_embed_class else layout.prefix
    read.tensor("pos_embed", (1, embedded + trained_grid[0] * trained_grid[1], width))
    if layout.pre_norm:
        read.layer_norm("norm_pre", width)
    for i in range(depth):
        _place_block(read, f"blocks.{i}", layout)
    read.layer_norm("norm", width)
    read.classifier("head", width, bias=True)
    read.finish()
    return layout


def _place_block(read: LayoutReader, p: str, layout: Layout) -> None:
    width = layout.width
    read.layer_norm(f"{p}.norm1", width)
    read.linear(f"{p}.attn.qkv", width, 3 * width, bias=layout.qkv_bias)
    read.linear(f"{p}.attn.proj", width, width, bias=True)
    read.layer_norm(f"{p}.norm2", width)
    read.mlp(f"{p}.mlp", width, layout.hidden)
    if layout.layer_scale:
        read.tensor(f"{p}.ls1.gamma", (width,))
        read.tensor(f"{p}.ls2.gamma", (width,))


def resampled_positions(positions: np.ndarray, trained: tuple[int, int], grid: tuple[int, int]) -> np.ndarray:
    """Patch position embeddings [1, h * w, width] trained on grid `trained`, at `grid`: what timm's
    resample_abs_pos_embed gives when it loads a checkpoint into a model of another input size
    (bicubic, antialiased, in float32, the patches row-major)."""
    if trained == grid:
        return positions
    import torch
    import torch.nn.functional as F

    width = positions.shape[-1]
    image = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.float32)).reshape(1, *trained, width)
    image = F.interpolate(image.permute(0, 3, 1, 2), size=grid, mode="bicubic", antialias=True)
    return image.permute(0, 2, 3, 1).reshape(1, -1, width).numpy()


def _embed(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ViTConfig) -> Tensor:
    x = embed_patches(g, ckpt, "patch_embed.proj", layout.patch)
    positions = ckpt.tensor("pos_embed")
    embedded = 0 if arch.no_embed_class else layout.prefix
    patch_positions = resampled_positions(positions[:, embedded:], layout.trained_grid, layout.grid)
    x = g.add(x, g.constant("pos_embed", patch_positions), "pos_embed.add")
    # The class and register tokens with their own position embeddings (where they have any) are one
    # constant, summed in float32 as timm sums them.
    tokens = np.concatenate([ckpt.tensor("cls_token")] + ([ckpt.tensor("reg_token")] if layout.registers else []), axis=1)
    if embedded:
        tokens = tokens + positions[:, :embedded]
    x = prepend_tokens(g, x, tokens, "cls_token")
    return layer_norm(g, x, ckpt, "norm_pre", arch.norm_eps) if layout.pre_norm else x


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, layout: Layout, arch: ViTConfig) -> Tensor:
    gammas = (f"{prefix}.ls1.gamma", f"{prefix}.ls2.gamma") if layout.layer_scale else None
    attend = partial(multi_head_attention, g, ckpt=ckpt, prefix=f"{prefix}.attn", heads=layout.heads)
    return transformer_block(g, x, ckpt, prefix, attend, eps=arch.norm_eps, act=arch.act, gammas=gammas)


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: ViTConfig) -> Tensor:
    x = _embed(g, ckpt, layout, arch)
    for i in range(layout.depth):
        x = _emit_block(g, x, ckpt, f"blocks.{i}", layout, arch)
    # The final norm is per token and only the class token is classified, so take it first and
    # normalize one token instead of all of them.
    x = g.slice(x, 1, 0, 1, "pool")
    x = g.reshape(x, (layout.width,), "pool.flatten")
    x = layer_norm(g, x, ckpt, "norm", arch.norm_eps)
    return linear(g, x, ckpt, "head")


# timm's CLIP towers: pre_norm=True with LayerNorm(eps=1e-5); the MLP keeps nn.GELU (the quickgelu
# variants, x * sigmoid(1.702 x), are other architectures).
_CLIP_EPS = 1e-5

FAMILY = Family(
    name="vit",
    summary="Vision Transformer / DeiT / DeiT III / DINOv2 / CLIP: patch embedding, class (and register) "
    "tokens, pre-norm attention + GELU MLP blocks, optional layer scale",
    architectures={
        "vit_tiny_patch16_224": ViTConfig(num_heads=3),
        "vit_small_patch16_224": ViTConfig(num_heads=6),
        "vit_base_patch16_224": ViTConfig(num_heads=12),
        "deit_small_patch16_224": ViTConfig(num_heads=6),
        "deit3_small_patch16_224": ViTConfig(num_heads=6, no_embed_class=True),
        "vit_small_patch14_dinov2": ViTConfig(num_heads=6),
        "vit_small_patch14_reg4_dinov2": ViTConfig(num_heads=6, no_embed_class=True),
        "vit_xsmall_patch16_clip_224": ViTConfig(num_heads=4, norm_eps=_CLIP_EPS),
        "vit_base_patch16_clip_224": ViTConfig(num_heads=12, norm_eps=_CLIP_EPS),
    },
    derive_layout=derive_layout,
    emit=emit,
)
