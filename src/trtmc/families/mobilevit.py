"""MobileViT (Mehta and Rastegari, https://arxiv.org/abs/2110.02178) as timm builds it on ByobNet: inverted
residual blocks, and MobileViT blocks that unfold a feature map into patches, run ViT blocks across the
patches at each patch position, and fold it back.

It reads `stem.{conv, bn}`, the inverted residuals `stages.<i>.<j>.conv{1_1x1, 2_kxk, 3_1x1}.{conv, bn}`,
the MobileViT blocks `stages.<i>.<j>.{conv_kxk, conv_1x1, transformer.<t>.{norm1, attn.qkv, attn.proj,
norm2, mlp.fc1, mlp.fc2}, norm, conv_proj, conv_fusion}`, `final_conv.{conv, bn}` and `head.fc`; widths,
depths and MLP widths come from the shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv, conv_norm_act, image_input, layer_norm, linear, stored_bias

_BLOCK = r"^stages\.(\d+)\.(\d+)\."


@dataclass(frozen=True)
class MobileViTConfig:
    """What the tensors of a timm MobileViT do not say."""

    # ByoModelCfg(act_layer='silu') everywhere, the transformer MLPs included; norm_layer batchnorm (eps
    # 1e-5); MobileVitBlock's transformer_norm_layer is nn.LayerNorm (eps 1e-5).
    act: Activation = Activation.SILU
    bn_eps: float = 1e-5
    ln_eps: float = 1e-5
    # The first block of each stage strides (the cfgs' s=1, 2, 2, 2, 2); the stem conv halves too.
    stem_stride: int = 2
    stage_strides: tuple[int, ...] = (1, 2, 2, 2, 2)
    # MobileVitBlock's num_heads default, which no model overrides; its fused qkv holds all heads alike.
    heads: int = 4
    # 2x2 patches in every MobileViT model timm registers.
    patch: int = 2


@dataclass(frozen=True)
class InvertedResidual:
    """timm's BottleneckBlock with bottle_in and linear_out: 1x1, depthwise kxk, 1x1 without activation;
    a residual sum only where the block keeps width and resolution (downsample='': no projection)."""

    prefix: str
    stride: int
    residual: bool


@dataclass(frozen=True)
class MobileViTBlock:
    """conv_kxk, conv_1x1 to the transformer width, ViT blocks over the unfolded patches, norm, fold,
    conv_proj back, then conv_fusion of the block's input and that."""

    prefix: str
    depth: int  # transformer blocks


@dataclass(frozen=True)
class Layout:
    blocks: tuple[InvertedResidual | MobileViTBlock, ...]


_POINTWISE = {2: 1, 3: 1}  # a 1x1 kernel


def _conv_norm_act(read: LayoutReader, prefix: str, channels: int, dims: Mapping[int, int] | None = None) -> int:
    """timm's ConvNormAct at `prefix`: `.conv` (no bias; `dims` as for `LayoutReader.conv`), `.bn`; its width."""
    return read.conv(f"{prefix}.conv", channels, bias=False, norm=f"{prefix}.bn", dims=dims)


def _inverted_residual(read: LayoutReader, prefix: str, channels: int, stride: int) -> tuple[InvertedResidual, int]:
    mid = _conv_norm_act(read, f"{prefix}.conv1_1x1", channels, _POINTWISE)
    _conv_norm_act(read, f"{prefix}.conv2_kxk", mid, {0: mid, 1: 1})  # depthwise (group size 1)
    out = _conv_norm_act(read, f"{prefix}.conv3_1x1", mid, _POINTWISE)
    return InvertedResidual(prefix, stride, stride == 1 and out == channels), out


def _transformer_block(read: LayoutReader, prefix: str, width: int, heads: int) -> None:
    """timm's ViT Block: norm1, attn (fused qkv over `heads`, proj), norm2, mlp (fc1, fc2); no layer scale."""
    if width % heads:
        raise CheckpointError(f"{read.arch}: {prefix} is {width} wide, which does not split into {heads} heads")
    read.layer_norm(f"{prefix}.norm1", width)
    read.linear(f"{prefix}.attn.qkv", width, 3 * width, bias=True)
    read.linear(f"{prefix}.attn.proj", width, width, bias=True)
    read.layer_norm(f"{prefix}.norm2", width)
    hidden = read.linear(f"{prefix}.mlp.fc1", width, bias=True)
    read.linear(f"{prefix}.mlp.fc2", hidden, width, bias=True)


def _mobilevit_block(
    read: LayoutReader, prefix: str, channels: int, arch: MobileViTConfig
) -> tuple[MobileViTBlock, int]:
    _conv_norm_act(read, f"{prefix}.conv_kxk", channels, {0: channels})
    width = read.conv(f"{prefix}.conv_1x1", channels, bias=False, dims={2: 1, 3: 1})
    depth = len(indexed_blocks(read.ckpt, rf"^{re.escape(prefix)}\.transformer\.(\d+)\."))
    if not depth:
        raise CheckpointError(f"{read.arch}: {prefix} has no transformer.<t> blocks")
    for t in range(depth):
        _transformer_block(read, f"{prefix}.transformer.{t}", width, arch.heads)
    read.layer_norm(f"{prefix}.norm", width)
    out = _conv_norm_act(read, f"{prefix}.conv_proj", width, _POINTWISE)
    _conv_norm_act(read, f"{prefix}.conv_fusion", channels + out, {0: out})
    return MobileViTBlock(prefix, depth), out


def derive_layout(ckpt: Checkpoint, arch: MobileViTConfig) -> Layout:
    """Blocks and their kinds from names, widths and depths from shapes; strides and heads from `arch`."""
    read = LayoutReader(ckpt)
    _, height, width_px = ckpt.config.pretrained.input_size
    channels = _conv_norm_act(read, "stem", ckpt.config.pretrained.input_size[0])
    size = (height // arch.stem_stride, width_px // arch.stem_stride)
    blocks: list[InvertedResidual | MobileViTBlock] = []
    for stage, j in indexed_blocks(ckpt, _BLOCK, stages=len(arch.stage_strides)):
        prefix = f"stages.{stage}.{j}"
        stride = arch.stage_strides[stage] if j == 0 else 1
        if f"{prefix}.conv1_1x1.conv.weight" in read:
            block, channels = _inverted_residual(read, prefix, channels, stride)
            size = (size[0] // stride, size[1] // stride)
        elif stride == 1:
            if size[0] % arch.patch or size[1] % arch.patch:
                raise UnsupportedModel(
                    f"{read.arch}: {prefix} would unfold a {size[0]}x{size[1]} map into {arch.patch}x{arch.patch} "
                    "patches; timm resizes such a map first, which trtmc does not"
                )
            block, channels = _mobilevit_block(read, prefix, channels, arch)
        else:
            raise UnsupportedModel(f"{read.arch}: {prefix} opens a strided stage with a MobileViT block")
        blocks.append(block)
    channels = _conv_norm_act(read, "final_conv", channels, _POINTWISE)
    read.classifier("head.fc", channels, bias=True)
    read.finish()
    return Layout(tuple(blocks))


def _unfold(g: GraphBuilder, x: Tensor, patch: int, source: str) -> Tensor:
    """The map [N, C, H, W] as tokens [N, T, P, C]: the T patches in row-major order, and in each the P =
    patch * patch positions. timm folds P into the batch ([N * P, T, C]); here it is an axis of its own, inside
    T so that the attention's heads and its output are views of this layout (`_attention`)."""
    _, c, h, w = x.shape
    x = g.reshape(x, (c, h // patch, patch, w // patch, patch), source)
    x = g.transpose(x, (0, 2, 4, 3, 5, 1), source)  # [N, nh, nw, ph, pw, C]
    return g.reshape(x, ((h // patch) * (w // patch), patch * patch, c), source)


def _fold(g: GraphBuilder, x: Tensor, patch: int, size: tuple[int, int], source: str) -> Tensor:
    """`_unfold`'s inverse: tokens [N, T, P, C] back to the map [N, C, H, W]."""
    _, _, _, c = x.shape
    nh, nw = size[0] // patch, size[1] // patch
    x = g.reshape(x, (nh, nw, patch, patch, c), source)
    x = g.transpose(x, (0, 5, 1, 3, 2, 4), source)  # [N, C, nh, ph, nw, pw]
    return g.reshape(x, (c, size[0], size[1]), source)


# Attention kernels read heads a multiple of 8 wide: flash attention pads q, k and v of other widths in three
# kernels of their own per attention, and the efficient and cuDNN kernels refuse them (mobilevit_s's 36- and
# 60-wide heads, tools/sdpa_backend_probe.py on the H100).
HEAD_ALIGNMENT = 8


def _zero_padded(t: np.ndarray, axis: int, size: int) -> np.ndarray:
    """`t` with zeros appended along `axis` up to `size`."""
    widths = [(0, 0)] * t.ndim
    widths[axis] = (0, size - t.shape[axis])
    return np.pad(t, widths)


def _padded_qkv(ckpt: Checkpoint, prefix: str, heads: int, padded: int) -> tuple[np.ndarray, np.ndarray | None]:
    """`prefix.qkv`'s weight and bias with their output features reordered from timm's (q|k|v, head, head_dim)
    to (head, q|k|v, head_dim), each head's q, k and v padded with zero features to `padded` wide."""

    def by_head(t: np.ndarray) -> np.ndarray:
        t = _zero_padded(t.reshape(3, heads, -1, *t.shape[1:]), 2, padded)
        return np.ascontiguousarray(t.swapaxes(0, 1).reshape(-1, *t.shape[3:]))

    bias = stored_bias(ckpt, prefix)
    return by_head(ckpt.tensor(f"{prefix}.weight")), None if bias is None else by_head(bias)


def _padded_proj(ckpt: Checkpoint, prefix: str, heads: int, padded: int) -> tuple[np.ndarray, np.ndarray | None]:
    """`prefix.proj`'s weight reading heads `padded` wide (zero weights for the padding) and its bias."""
    weight = ckpt.tensor(f"{prefix}.weight")
    weight = _zero_padded(weight.reshape(weight.shape[0], heads, -1), 2, padded).reshape(weight.shape[0], -1)
    return weight, stored_bias(ckpt, prefix)


def _attention(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, heads: int) -> Tensor:
    """timm's Attention (fused `qkv`, `proj`) over tokens [N, T, P, C] for each patch position at once: the
    positions join the heads axis of one ATTENTION op. With `qkv`'s features head-major, each (position,
    head) group's q, k and v lie side by side, so the groups and the attention's [N, T, groups, head_dim]
    output are views of the token layout: no layout copy on either side, as in timm (where P is in the batch).
    Heads are padded to `HEAD_ALIGNMENT` in the weights: zero features add nothing to q k^T, and the zero
    columns of v meet zero columns of `proj`."""
    _, tokens, positions, width = x.shape
    head_dim, groups = width // heads, positions * heads
    padded = -(-head_dim // HEAD_ALIGNMENT) * HEAD_ALIGNMENT
    qkv = g.linear(x, f"{prefix}.qkv", *_padded_qkv(ckpt, f"{prefix}.qkv", heads, padded))
    qkv = g.reshape(qkv, (tokens, groups, 3 * padded), f"{prefix}.split_heads")
    qkv = g.transpose(qkv, (0, 2, 1, 3), f"{prefix}.split_heads")  # [N, (P, heads), T, q|k|v padded]
    q, k, v = (g.slice(qkv, 3, i * padded, (i + 1) * padded, f"{prefix}.{part}") for i, part in enumerate("qkv"))
    y = g.attention(q, k, v, prefix, scale=head_dim**-0.5)
    y = g.transpose(y, (0, 2, 1, 3), f"{prefix}.merge_heads")  # [N, T, (P, heads), padded]
    y = g.reshape(y, (tokens, positions, heads * padded), f"{prefix}.merge_heads")
    return g.linear(y, f"{prefix}.proj", *_padded_proj(ckpt, f"{prefix}.proj", heads, padded))


def _emit_transformer_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, arch: MobileViTConfig) -> Tensor:
    y = layer_norm(g, x, ckpt, f"{prefix}.norm1", arch.ln_eps)
    x = g.add(x, _attention(g, y, ckpt, f"{prefix}.attn", arch.heads), f"{prefix}.add1")
    y = layer_norm(g, x, ckpt, f"{prefix}.norm2", arch.ln_eps)
    y = g.activation(linear(g, y, ckpt, f"{prefix}.mlp.fc1"), arch.act, f"{prefix}.mlp.act")
    return g.add(x, linear(g, y, ckpt, f"{prefix}.mlp.fc2"), f"{prefix}.add2")


def _conv_block(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, fn: Activation | None, eps: float, stride: int = 1
) -> Tensor:
    """timm's ConvNormAct at `prefix` (`.conv`, `.bn`, then `fn`)."""
    return conv_norm_act(g, x, ckpt, f"{prefix}.conv", f"{prefix}.bn", fn, eps=eps, stride=stride)


def _emit_mobilevit_block(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: MobileViTBlock, arch: MobileViTConfig
) -> Tensor:
    p, size = block.prefix, x.shape[2:]
    y = _conv_block(g, x, ckpt, f"{p}.conv_kxk", arch.act, arch.bn_eps)
    y = _unfold(g, conv(g, y, ckpt, f"{p}.conv_1x1"), arch.patch, f"{p}.unfold")
    for t in range(block.depth):
        y = _emit_transformer_block(g, y, ckpt, f"{p}.transformer.{t}", arch)
    y = _fold(g, layer_norm(g, y, ckpt, f"{p}.norm", arch.ln_eps), arch.patch, size, f"{p}.fold")
    y = _conv_block(g, y, ckpt, f"{p}.conv_proj", arch.act, arch.bn_eps)
    return _conv_block(g, g.concat([x, y], 1, f"{p}.cat"), ckpt, f"{p}.conv_fusion", arch.act, arch.bn_eps)


def _emit_inverted_residual(
    g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: InvertedResidual, arch: MobileViTConfig
) -> Tensor:
    p = block.prefix
    y = _conv_block(g, x, ckpt, f"{p}.conv1_1x1", arch.act, arch.bn_eps)
    y = _conv_block(g, y, ckpt, f"{p}.conv2_kxk", arch.act, arch.bn_eps, block.stride)
    y = _conv_block(g, y, ckpt, f"{p}.conv3_1x1", None, arch.bn_eps)
    return g.add(y, x, f"{p}.add") if block.residual else y


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: MobileViTConfig) -> Tensor:
    x = _conv_block(g, image_input(g, ckpt), ckpt, "stem", arch.act, arch.bn_eps, arch.stem_stride)
    for block in layout.blocks:
        if isinstance(block, MobileViTBlock):
            x = _emit_mobilevit_block(g, x, ckpt, block, arch)
        else:
            x = _emit_inverted_residual(g, x, ckpt, block, arch)
    x = _conv_block(g, x, ckpt, "final_conv", arch.act, arch.bn_eps)
    return linear(g, g.global_avg_pool(x, "head.global_pool"), ckpt, "head.fc")


FAMILY = Family(
    name="mobilevit",
    summary="MobileViT: inverted residuals, and ViT blocks across unfolded 2x2 patches fused back into the map",
    architectures={
        "mobilevit_xxs": MobileViTConfig(),
        "mobilevit_xs": MobileViTConfig(),
        "mobilevit_s": MobileViTConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
