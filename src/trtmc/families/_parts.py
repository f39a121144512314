"""What several families emit alike: padding math, batch-norm reduction, weight standardization,
conv-norm-act, SE, softmax attention over branches, linear, norms, multi-head attention, L2 normalization,
relative position indices, the pre-norm transformer block.

Each helper reads its tensors by timm module path from the checkpoint and names its nodes after
that path, so graphs map back to the checkpoint. Reading a layout is `_layout.py`'s job.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, Binary, GraphError, PoolMode, Reduction
from ..graph_builder import GraphBuilder, Tensor


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF "SAME" padding (before, after) for one spatial axis: the extra pixel goes after."""
    total = max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def conv_padding(
    x: Tensor, kernel: tuple[int, int], stride: int, *, tf_same: bool, dilation: int = 1
) -> tuple[int, int, int, int]:
    """(top, left, bottom, right): TF "SAME" for `tf_` models, else timm's symmetric default."""
    if tf_same:
        top, bottom = same_padding(x.shape[2], kernel[0], stride, dilation)
        left, right = same_padding(x.shape[3], kernel[1], stride, dilation)
        return (top, left, bottom, right)
    ph = ((stride - 1) + dilation * (kernel[0] - 1)) // 2
    pw = ((stride - 1) + dilation * (kernel[1] - 1)) // 2
    return (ph, pw, ph, pw)


def fold_norm(ckpt: Checkpoint, prefix: str, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """A batch norm's running statistics as one per-channel scale and shift, in float32."""
    gamma = ckpt.tensor(f"{prefix}.weight")
    beta = ckpt.tensor(f"{prefix}.bias")
    mean = ckpt.tensor(f"{prefix}.running_mean")
    var = ckpt.tensor(f"{prefix}.running_var")
    if not gamma.shape == beta.shape == mean.shape == var.shape:
        raise CheckpointError(f"batch norm {prefix}: parameter shapes differ")
    # Divide in float64 so a tiny variance does not lose digits before the float32 result.
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    shift = beta.astype(np.float64) - mean.astype(np.float64) * scale
    return scale.astype(np.float32), shift.astype(np.float32)


def standardize_weight(weight: np.ndarray, eps: float) -> np.ndarray:
    """A convolution weight standardized per output channel, (w - mean) / sqrt(var + eps) over its
    inputs and kernel with the biased variance: what timm's StdConv2d and ScaledStdConv2d compute from
    the stored weight on every forward (https://arxiv.org/abs/1903.10520), computed once in float64."""
    w = weight.astype(np.float64).reshape(weight.shape[0], -1)
    w = (w - w.mean(1, keepdims=True)) / np.sqrt(w.var(1, keepdims=True) + eps)
    return w.reshape(weight.shape).astype(np.float32)


def batch_norm(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, eps: float) -> Tensor:
    scale, shift = fold_norm(ckpt, prefix, eps)
    return g.scale(x, prefix, scale, shift)


def act(g: GraphBuilder, x: Tensor, fn: Activation | None, source: str) -> Tensor:
    return x if fn is None else g.activation(x, fn, source)


def conv(
    g: GraphBuilder,
    x: Tensor,
    ckpt: Checkpoint,
    prefix: str,
    *,
    stride: int = 1,
    tf_same: bool = False,
    dilation: int = 1,
    padding: Sequence[int] | None = None,
    weight: np.ndarray | None = None,
) -> Tensor:
    """The convolution stored at `prefix.weight` (and `prefix.bias` if present); `weight` replaces the
    stored one where a family re-parameterises it at build time (weight standardization).

    Groups follow from the weight shape and the input width: depthwise and grouped convolutions
    need no table.
    """
    weight = ckpt.tensor(f"{prefix}.weight") if weight is None else weight
    in_per_group = weight.shape[1]
    if x.channels % in_per_group:
        raise CheckpointError(
            f"{prefix}.weight {tuple(weight.shape)} cannot read an input of {x.channels} channels"
        )
    bias = stored_bias(ckpt, prefix)
    if padding is None:
        padding = conv_padding(x, weight.shape[2:], stride, tf_same=tf_same, dilation=dilation)
    return g.conv2d(
        x, prefix, weight, bias, stride=stride, padding=padding, dilation=dilation,
        groups=x.channels // in_per_group,
    )


def conv_norm_act(
    g: GraphBuilder,
    x: Tensor,
    ckpt: Checkpoint,
    conv_prefix: str,
    norm_prefix: str,
    fn: Activation | None,
    *,
    eps: float,
    stride: int = 1,
    tf_same: bool = False,
) -> Tensor:
    x = conv(g, x, ckpt, conv_prefix, stride=stride, tf_same=tf_same)
    x = batch_norm(g, x, ckpt, norm_prefix, eps)
    return act(g, x, fn, f"{norm_prefix}.act" if fn else norm_prefix)


def squeeze_excite(
    g: GraphBuilder,
    x: Tensor,
    ckpt: Checkpoint,
    prefix: str,
    *,
    inner: Activation,
    gate: Activation,
    reduce: str = "conv_reduce",
    expand: str = "conv_expand",
) -> Tensor:
    """x * gate(expand(inner(reduce(mean(x))))) with 1x1 convolutions, as timm's SqueezeExcite."""
    s = g.global_avg_pool(x, f"{prefix}.pool", keepdim=True)
    s = conv(g, s, ckpt, f"{prefix}.{reduce}")
    s = g.activation(s, inner, f"{prefix}.act1")
    s = conv(g, s, ckpt, f"{prefix}.{expand}")
    s = g.activation(s, gate, f"{prefix}.gate")
    return g.mul(x, s, f"{prefix}.mul")


def softmax_over_branches(g: GraphBuilder, branches: Sequence[Tensor], logits: Tensor, *, groups: int, source: str) -> Tensor:
    """sum_r branches[r] * softmax_r(logits): the attention-weighted sum of maps of C channels. `logits`
    ([1, branches * C, 1, 1]) is laid out as timm's RadixSoftmax reads it, `groups` runs of (branch,
    C / groups); SKNet's has one group. Each branch is weighed where it is, and the products added: no
    stacked copy of the branches (timm stacks them), nothing for a compiler to fuse but pointwise ops."""
    n, channels = len(branches), branches[0].channels
    if groups == 1:
        weights = g.reshape(logits, (n, channels), f"{source}.attn_split")
    else:
        weights = g.reshape(logits, (groups, n, channels // groups), f"{source}.attn_split")
        weights = g.transpose(weights, (0, 2, 1, 3), f"{source}.attn_branch_first")
    weights = g.softmax(weights, 1, f"{source}.softmax")
    total = None
    for r, branch in enumerate(branches):
        weight = g.reshape(g.slice(weights, 1, r, r + 1, f"{source}.attn_{r}"), (channels, 1, 1), f"{source}.attn_{r}")
        weighed = g.mul(branch, weight, f"{source}.weigh_{r}")
        total = weighed if total is None else g.add(total, weighed, f"{source}.sum")
    return total


def max_pool(g: GraphBuilder, x: Tensor, source: str, kernel: int, stride: int, padding: int) -> Tensor:
    return g.pool2d(x, source, PoolMode.MAX, kernel, stride, padding)


def stored_bias(ckpt: Checkpoint, prefix: str) -> np.ndarray | None:
    """The layer at `prefix`'s bias, or None where the checkpoint stores none."""
    return ckpt.tensor(f"{prefix}.bias") if f"{prefix}.bias" in ckpt else None


def linear(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str) -> Tensor:
    """The linear layer at `prefix`, with its bias if stored (a classifier's width is the layout's check)."""
    bias = stored_bias(ckpt, prefix)
    return g.linear(x, prefix, ckpt.tensor(f"{prefix}.weight"), bias)


def layer_norm(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, eps: float, *, axis: int = -1) -> Tensor:
    return g.layer_norm(x, prefix, ckpt.tensor(f"{prefix}.weight"), ckpt.tensor(f"{prefix}.bias"), eps, axis=axis)


def image_input(g: GraphBuilder, ckpt: Checkpoint) -> Tensor:
    c, h, w = ckpt.config.pretrained.input_size
    return g.input("pixels", (1, c, h, w))


def embed_patches(g: GraphBuilder, ckpt: Checkpoint, prefix: str, patch: int) -> Tensor:
    """The image as patch tokens [N, patches, width], patches row-major: timm's PatchEmbed, a patch x patch
    convolution of stride patch at `prefix`, flattened."""
    x = conv(g, image_input(g, ckpt), ckpt, prefix, stride=patch, padding=0)
    x = g.reshape(x, (x.shape[1], x.shape[2] * x.shape[3]), f"{prefix}.flatten")
    return g.transpose(x, (0, 2, 1), f"{prefix}.transpose")


def prepend_tokens(g: GraphBuilder, x: Tensor, tokens: np.ndarray, source: str) -> Tensor:
    """Tokens `tokens` [1, n, width] (a class token, registers) before the tokens of `x` [N, tokens, width].

    A concat does not broadcast a constant over the batch, so they are made batch-sized from the first
    token of `x`: x * 0 + tokens.
    """
    zeros = np.zeros(x.shape[-1], np.float32)
    first = g.scale(g.slice(x, 1, 0, 1, f"{source}.batch"), source, zeros, zeros, axis=-1)
    return g.concat([g.add(first, g.constant(source, tokens), f"{source}.add"), x], 1, f"{source}.cat")


def relative_position_index(height: int, width: int) -> np.ndarray:
    """[h*w, h*w]: for each pair of tokens (row-major) of an h x w grid, the row of a relative position
    bias table [(2h - 1) * (2w - 1), heads] holding its offset, as Swin and BEiT number them: the row
    offset times (2w - 1) plus the column offset, both made non-negative."""
    rows, cols = np.divmod(np.arange(height * width), width)
    return (rows[:, None] - rows[None, :] + height - 1) * (2 * width - 1) + (cols[:, None] - cols[None, :] + width - 1)


def l2_normalize(g: GraphBuilder, x: Tensor, eps: float, source: str) -> Tensor:
    """F.normalize(x, dim=-1): x / max(||x||, eps), as EdgeNeXt's XCA and Swin V2's cosine attention
    normalize q and k. Every step stays fp32 in fp16 builds: a sum of squares over a thousand tokens
    overflows fp16."""
    axis = len(x.shape) - 1
    squares = g.binary(x, x, Binary.MUL, f"{source}.square", sensitive=True)
    norm = g.reduce(squares, f"{source}.sum", Reduction.SUM, (axis,), keepdim=True, sensitive=True)
    norm = g.activation(norm, Activation.SQRT, f"{source}.sqrt", sensitive=True)
    floor = g.constant(f"{source}.eps", np.full((1,) * len(x.shape), eps, np.float32))
    norm = g.binary(norm, floor, Binary.MAX, f"{source}.clamp", sensitive=True)
    return g.binary(x, norm, Binary.DIV, source, sensitive=True)


def split_heads(g: GraphBuilder, qkv: Tensor, heads: int, source: str) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as [N, heads, tokens, head_dim] from a fused projection [N, tokens, 3 * heads * head_dim]
    whose features run (q | k | v, head, head_dim), the order timm's `Attention` reshapes `qkv` in."""
    _, tokens, features = qkv.shape
    if features % (3 * heads):
        raise GraphError(f"{source}: {features} qkv features do not split into q, k, v of {heads} heads")
    head_dim = features // (3 * heads)
    x = g.reshape(qkv, (tokens, 3 * heads, head_dim), f"{source}.split_heads")
    x = g.transpose(x, (0, 2, 1, 3), f"{source}.split_heads")  # [N, (q|k|v, head), tokens, head_dim]
    q, k, v = (g.slice(x, 1, i * heads, (i + 1) * heads, f"{source}.{part}") for i, part in enumerate("qkv"))
    return q, k, v


def merge_heads(g: GraphBuilder, x: Tensor, source: str) -> Tensor:
    """[N, heads, tokens, head_dim] back to tokens [N, tokens, heads * head_dim], heads outermost."""
    _, heads, tokens, head_dim = x.shape
    x = g.transpose(x, (0, 2, 1, 3), f"{source}.merge_heads")
    return g.reshape(x, (tokens, heads * head_dim), f"{source}.merge_heads")


def multi_head_attention(
    g: GraphBuilder,
    x: Tensor,
    ckpt: Checkpoint,
    prefix: str,
    heads: int,
    *,
    scale: float | None = None,
    bias: np.ndarray | None = None,
) -> Tensor:
    """timm's `Attention` at `prefix` over tokens `x` [N, tokens, width], as one ATTENTION op.

    Reads `prefix.qkv` (a linear [3 * heads * head_dim, width], bias optional, features ordered as
    `split_heads` says) and `prefix.proj` (a linear back to the output width). `heads` is the
    family's to state: no tensor records it. `scale` multiplies q k^T (timm's default, head_dim ** -0.5,
    when None); `bias` is added to the scores before the softmax and must broadcast to
    [1, heads, tokens, tokens]: a relative position bias or a window mask, already gathered into
    that shape by the family. Nothing else happens between the projections (no q/k norm, no rotary
    embedding): a family that has those calls `split_heads`, `GraphBuilder.attention` and
    `merge_heads` itself. The attention node is named `prefix`, so `--fp32-layers '*.attn'` reaches it.
    """
    q, k, v = split_heads(g, linear(g, x, ckpt, f"{prefix}.qkv"), heads, prefix)
    scale = q.shape[3] ** -0.5 if scale is None else scale
    out = g.attention(q, k, v, prefix, scale=scale, bias=bias)
    return linear(g, merge_heads(g, out, prefix), ckpt, f"{prefix}.proj")


def layer_scaled(g: GraphBuilder, y: Tensor, ckpt: Checkpoint, gamma: str | None, *, axis: int = -1) -> Tensor:
    """`y` times the per-channel layer scale `gamma` (a tensor name; None: no layer scale) along `axis`:
    the last for tokens, 1 for a map (LayerScale2d, whose gamma is stored as (C, 1, 1)).

    Kept as its own op rather than folded into the projection before it: trained gammas are small
    (DINOv2 starts them at 1e-5), and gamma * weight would push fp16 weights into the subnormal range.
    The node is named after the module (`blocks.0.ls1`) or, where the gamma is a bare parameter, after it
    (`blocks.0.gamma_1`).
    """
    if gamma is None:
        return y
    value = ckpt.tensor(gamma).reshape(-1)
    return g.scale(y, gamma.removesuffix(".gamma"), value, np.zeros_like(value), axis=axis)


def transformer_block(
    g: GraphBuilder,
    x: Tensor,
    ckpt: Checkpoint,
    prefix: str,
    attention: Callable[[Tensor], Tensor],
    *,
    eps: float,
    act: Activation,
    gammas: tuple[str, str] | None = None,
) -> Tensor:
    """timm's pre-norm transformer block at `prefix` over tokens `x` [N, ..., width]: x + ls1(attention(
    norm1(x))), then x + ls2(mlp(norm2(x))), the MLP `mlp.fc1`, `act`, `mlp.fc2`.

    `attention` maps the normalized tokens to the attention branch (a family's own: windows, biases);
    `gammas` names the two layer scales, or None where the block has none.
    """
    ls1, ls2 = gammas or (None, None)
    y = attention(layer_norm(g, x, ckpt, f"{prefix}.norm1", eps))
    x = g.add(x, layer_scaled(g, y, ckpt, ls1), f"{prefix}.residual1")
    y = linear(g, layer_norm(g, x, ckpt, f"{prefix}.norm2", eps), ckpt, f"{prefix}.mlp.fc1")
    y = linear(g, g.activation(y, act, f"{prefix}.mlp.act"), ckpt, f"{prefix}.mlp.fc2")
    return g.add(x, layer_scaled(g, y, ckpt, ls2), f"{prefix}.residual2")
