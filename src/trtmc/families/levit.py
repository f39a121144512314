"""LeViT (Graham et al., https://arxiv.org/abs/2104.01136) as timm builds it in linear mode: a strided conv
stem, then attention + MLP blocks on tokens whose every linear carries a batch norm.

It reads `stem.conv<i>.{linear, bn}`, `stages.<i>.downsample.{attn_downsample.{attention_biases, kv, q.ln,
proj.ln}, mlp.{ln1, ln2}}`, `stages.<i>.blocks.<j>.{attn.{attention_biases, qkv, proj.ln}, mlp.{ln1, ln2}}`
(each a `.linear` and its `.bn`) and the two classifiers `head` and `head_dist` (`.bn`, `.linear`); heads,
key and value widths and the token grid come from the shapes. EfficientFormer and EdgeNeXt share its helpers:
the attention biases' layout and gather, the per-head split, tokens to map and back, the averaged heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError
from ..graph import Activation, GraphError, Reduction
from ..graph_builder import GraphBuilder, Tensor
from . import Family, UnsupportedModel
from ._layout import LayoutReader, indexed_blocks
from ._parts import conv_norm_act, fold_norm, image_input, max_pool, merge_heads


@dataclass(frozen=True)
class LevitConfig:
    """What the tensors of a timm LeViT do not say."""

    # Levit's act_layer='hard_swish' for every model up to levit_384; the s8 and wider experiments use SiLU.
    act: Activation = Activation.HARD_SWISH
    # ConvNorm, LinearNorm and NormLinear use torch's BatchNorm defaults.
    eps: float = 1e-5
    # Every stem conv is a 3x3 ConvNorm with stride 2, so Stem16's four halve the image 16 times.
    stem_conv_stride: int = 2
    # A stage's AttentionDownsample keeps every second query token along each axis (`subsample`, stride 2).
    subsample_stride: int = 2


@dataclass(frozen=True)
class AttentionSpec:
    prefix: str  # ...attn or ...attn_downsample
    heads: int  # the rows of `attention_biases`
    key_dim: int
    value_dim: int  # LeViT's values are wider than its keys: attn_ratio 2 in blocks, 4 when subsampling
    resolution: int  # the keys' token grid is resolution x resolution
    stride: int  # queries on every stride-th token of that grid: 1, or the subsampling stride

    @property
    def query_resolution(self) -> int:
        return (self.resolution - 1) // self.stride + 1


@dataclass(frozen=True)
class BlockSpec:
    prefix: str  # stages.<i>.blocks.<j> or stages.<i>.downsample
    attention: AttentionSpec
    hidden: int  # MLP width

    @property
    def residual(self) -> bool:
        """A block adds its attention to its input; a downsample's attention changes the token count."""
        return self.attention.stride == 1


@dataclass(frozen=True)
class Layout:
    stem: tuple[str, ...]  # stem.conv1 ... ; a ConvNorm each, the activation between them
    resolution: int  # tokens per side after the stem
    blocks: tuple[BlockSpec, ...]


def relative_position_bias(biases: np.ndarray, resolution: int, stride: int = 1) -> np.ndarray:
    """LeViT's attention biases [heads, resolution ** 2] gathered into the [1, heads, queries, keys] the
    attention adds to its scores: key and query positions on a resolution x resolution grid (the queries
    on every `stride`-th row and column) look up the bias at |dy| * resolution + |dx|, as timm's
    `attention_bias_idxs`. Gathered once here, so the graph holds a constant instead of a gather."""
    grid = np.arange(resolution)
    keys = np.stack(np.meshgrid(grid, grid, indexing="ij")).reshape(2, -1)
    queries = np.stack(np.meshgrid(grid[::stride], grid[::stride], indexing="ij")).reshape(2, -1)
    offset = np.abs(queries[:, :, None] - keys[:, None, :])
    return biases[:, offset[0] * resolution + offset[1]][None]


def split_heads_by_part(
    g: GraphBuilder, x: Tensor, heads: int, parts: Sequence[tuple[str, int]], source: str
) -> tuple[Tensor, ...]:
    """Projected tokens [N, tokens, heads * sum(widths)] as one [N, heads, tokens, width] tensor per part
    (name, width). LeViT and EfficientFormer order the features (head, part): timm views them as
    [N, tokens, heads, -1] and splits the last axis, unlike ViT's (part, head) in `_parts.split_heads`."""
    _, tokens, features = x.shape
    per_head = sum(width for _, width in parts)
    if features != heads * per_head:
        raise GraphError(f"{source}: {features} features do not split into {heads} heads of {per_head}")
    x = g.reshape(x, (tokens, heads, per_head), f"{source}.split_heads")
    x = g.transpose(x, (0, 2, 1, 3), f"{source}.split_heads")
    if len(parts) == 1:
        return (x,)
    starts = np.cumsum([0] + [width for _, width in parts])
    bounds = zip(starts, starts[1:])
    return tuple(g.slice(x, 3, start, stop, f"{source}.{name}") for (name, _), (start, stop) in zip(parts, bounds))


def to_tokens(g: GraphBuilder, x: Tensor, source: str) -> Tensor:
    """The map [N, C, H, W] as tokens [N, H * W, C], row-major as timm's `x.flatten(2).transpose(1, 2)`."""
    x = g.reshape(x, (x.channels, x.shape[2] * x.shape[3]), source)
    return g.transpose(x, (0, 2, 1), source)


def to_map(g: GraphBuilder, x: Tensor, height: int, width: int, source: str) -> Tensor:
    """Tokens [N, height * width, C] back to the map [N, C, height, width]: `to_tokens` undone."""
    x = g.transpose(x, (0, 2, 1), source)
    return g.reshape(x, (x.shape[1], height, width), source)


def averaged_classifier(
    g: GraphBuilder, x: Tensor, heads: Sequence[tuple[np.ndarray, np.ndarray]], source: str
) -> Tensor:
    """timm's distilled models return the mean of their class and distillation heads at inference. Both
    are linear in x, so one linear with the mean weight and bias is the same map, exact up to rounding."""
    weight = np.mean([w.astype(np.float64) for w, _ in heads], axis=0)
    bias = np.mean([b.astype(np.float64) for _, b in heads], axis=0)
    return g.linear(x, source, weight, bias)


def _linear_norm(read: LayoutReader, prefix: str, features: int, out: int | None = None) -> int:
    """timm's LinearNorm at `prefix`: `.linear` (no bias) reading `features`, then `.bn`; its width
    (`out` where the layout knows it)."""
    out = read.linear(f"{prefix}.linear", features, out, bias=False)
    read.batch_norm(f"{prefix}.bn", out)
    return out


def attention_bias_heads(read: LayoutReader, prefix: str, resolution: int) -> int:
    """Place `prefix.attention_biases` [heads, keys], whose keys must tile the resolution x resolution
    token grid; the head count, which no other tensor states."""
    heads, keys = read.shape(f"{prefix}.attention_biases", rank=2)
    if keys != resolution**2:
        raise UnsupportedModel(
            f"{read.arch}: {prefix}.attention_biases {(heads, keys)} has {keys} positions, but the input makes "
            f"a {resolution}x{resolution} token grid here; trtmc does not resample attention biases"
        )
    read.tensor(f"{prefix}.attention_biases", (heads, keys))
    return heads


def _value_dim(read: LayoutReader, prefix: str, heads: int) -> int:
    """The value width per head, from the projection back out of the heads."""
    merged = read.shape(f"{prefix}.proj.ln.linear.weight", rank=2)[1]
    if merged % heads:
        raise CheckpointError(
            f"{read.arch}: {prefix}.proj.ln.linear.weight reads {merged} features, not {heads} heads' values"
        )
    return merged // heads


def _attention(read: LayoutReader, prefix: str, width: int, resolution: int) -> tuple[AttentionSpec, int]:
    """A block's attention: `qkv` projects to (q, k, v) per head, `proj` back; the spec and its output width."""
    heads = attention_bias_heads(read, prefix, resolution)
    value_dim = _value_dim(read, prefix, heads)
    per_head, rest = divmod(_linear_norm(read, f"{prefix}.qkv", width), heads)
    key_dim, odd = divmod(per_head - value_dim, 2)
    if rest or odd or key_dim <= 0:
        raise CheckpointError(
            f"{read.arch}: {prefix}.qkv.linear.weight does not split into {heads} heads of q and k alike "
            f"plus {value_dim}-wide values"
        )
    out = _linear_norm(read, f"{prefix}.proj.ln", heads * value_dim)
    if out != width:
        raise CheckpointError(f"{read.arch}: {prefix}.proj maps {width} channels to {out}, not back")
    return AttentionSpec(prefix, heads, key_dim, value_dim, resolution, 1), out


def _subsampling_attention(
    read: LayoutReader, prefix: str, width: int, resolution: int, stride: int
) -> tuple[AttentionSpec, int]:
    """A stage's AttentionDownsample: `kv` from every token, `q.ln` from the subsampled ones, `proj` to
    the stage's width; the spec and that width."""
    heads = attention_bias_heads(read, prefix, resolution)
    value_dim = _value_dim(read, prefix, heads)
    key_width = _linear_norm(read, f"{prefix}.q.ln", width)
    kv_width = _linear_norm(read, f"{prefix}.kv", width)
    if key_width % heads or kv_width != key_width + heads * value_dim:
        raise CheckpointError(
            f"{read.arch}: {prefix}.q.ln ({key_width}) and {prefix}.kv ({kv_width}) do not split into {heads} "
            f"heads of keys plus {value_dim}-wide values"
        )
    out = _linear_norm(read, f"{prefix}.proj.ln", heads * value_dim)
    return AttentionSpec(prefix, heads, key_width // heads, value_dim, resolution, stride), out


def _block(read: LayoutReader, prefix: str, attention: AttentionSpec, width: int) -> BlockSpec:
    hidden = _linear_norm(read, f"{prefix}.mlp.ln1", width)
    _linear_norm(read, f"{prefix}.mlp.ln2", hidden, width)
    return BlockSpec(prefix, attention, hidden)


def _stem(read: LayoutReader, arch: LevitConfig) -> tuple[tuple[str, ...], int, int]:
    """The stem's ConvNorms, their output width, and the token grid's side."""
    channels, height, width_px = read.ckpt.config.pretrained.input_size
    convs = indexed_blocks(read.ckpt, r"^stem\.conv(\d+)\.", start=1)
    if not convs:
        raise CheckpointError(f"{read.arch}: no stem.conv<i> tensors; not a LeViT checkpoint")
    for (i,) in convs:
        channels = read.conv(f"stem.conv{i}.linear", channels, bias=False, norm=f"stem.conv{i}.bn")
    stride = arch.stem_conv_stride ** len(convs)
    if height != width_px or height % stride:
        raise UnsupportedModel(
            f"{read.arch}: a {height}x{width_px} input does not make a square grid of {stride}x{stride} patches"
        )
    return tuple(f"stem.conv{i}" for (i,) in convs), channels, height // stride


def derive_layout(ckpt: Checkpoint, arch: LevitConfig) -> Layout:
    """Stem, stages and blocks from names, heads and widths from shapes; the strides from `arch`."""
    read = LayoutReader(ckpt)
    stem, width, resolution = _stem(read, arch)
    blocks, grid = [], resolution
    indices = indexed_blocks(ckpt, r"^stages\.(\d+)\.blocks\.(\d+)\.")
    if not indices:
        raise CheckpointError(f"{read.arch}: no stages.<i>.blocks.<j> tensors; not a LeViT checkpoint")
    for stage in sorted({s for s, _ in indices}):
        prefix = f"stages.{stage}.downsample"
        if f"{prefix}.attn_downsample.attention_biases" in read:
            spec, width = _subsampling_attention(read, f"{prefix}.attn_downsample", width, grid, arch.subsample_stride)
            blocks.append(_block(read, prefix, spec, width))
            grid = spec.query_resolution
        for _, j in (i for i in indices if i[0] == stage):
            spec, width = _attention(read, f"stages.{stage}.blocks.{j}.attn", width, grid)
            blocks.append(_block(read, f"stages.{stage}.blocks.{j}", spec, width))
    for head in ("head", "head_dist"):
        read.batch_norm(f"{head}.bn", width)
        read.classifier(f"{head}.linear", width, bias=True)
    read.finish()
    return Layout(stem, resolution, tuple(blocks))


def _linear_norm_op(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, prefix: str, eps: float) -> Tensor:
    """LinearNorm as one linear: the batch norm after a bias-free linear folds into it at build time (as
    timm's own `fuse()` does), s * (W x) + t = (s W) x + t, exact up to rounding."""
    scale, shift = fold_norm(ckpt, f"{prefix}.bn", eps)
    return g.linear(x, prefix, ckpt.tensor(f"{prefix}.linear.weight") * scale[:, None], shift)


def _norm_linear(ckpt: Checkpoint, prefix: str, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """NormLinear's weight and bias with its batch norm (before the linear) folded in:
    W (s x + t) + b = (W s) x + (W t + b)."""
    scale, shift = fold_norm(ckpt, f"{prefix}.bn", eps)
    weight, bias = ckpt.tensor(f"{prefix}.linear.weight").astype(np.float64), ckpt.tensor(f"{prefix}.linear.bias")
    return weight * scale[None, :], weight @ shift + bias


def _subsample(g: GraphBuilder, x: Tensor, resolution: int, stride: int, source: str) -> Tensor:
    """timm's `x.view(B, r, r, C)[:, ::stride, ::stride]` on tokens [N, r * r, C]: on the map [N, C, r, r]
    a max pool with a 1x1 window and this stride picks exactly those tokens (an odd r keeps its last row)."""
    y = max_pool(g, to_map(g, x, resolution, resolution, source), source, 1, stride, 0)
    return to_tokens(g, y, source)


def _emit_attention(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, spec: AttentionSpec, arch: LevitConfig) -> Tensor:
    p, d, e = spec.prefix, spec.key_dim, spec.value_dim
    if spec.stride == 1:
        qkv = _linear_norm_op(g, x, ckpt, f"{p}.qkv", arch.eps)
        q, k, v = split_heads_by_part(g, qkv, spec.heads, (("q", d), ("k", d), ("v", e)), p)
    else:
        kv = _linear_norm_op(g, x, ckpt, f"{p}.kv", arch.eps)
        k, v = split_heads_by_part(g, kv, spec.heads, (("k", d), ("v", e)), p)
        queries = _subsample(g, x, spec.resolution, spec.stride, f"{p}.q.down")
        queries = _linear_norm_op(g, queries, ckpt, f"{p}.q.ln", arch.eps)
        (q,) = split_heads_by_part(g, queries, spec.heads, (("q", d),), p)
    bias = relative_position_bias(ckpt.tensor(f"{p}.attention_biases"), spec.resolution, spec.stride)
    y = merge_heads(g, g.attention(q, k, v, p, scale=d**-0.5, bias=bias), p)
    y = g.activation(y, arch.act, f"{p}.proj.act")
    return _linear_norm_op(g, y, ckpt, f"{p}.proj.ln", arch.eps)


def _emit_block(g: GraphBuilder, x: Tensor, ckpt: Checkpoint, block: BlockSpec, arch: LevitConfig) -> Tensor:
    p = block.prefix
    y = _emit_attention(g, x, ckpt, block.attention, arch)
    x = g.add(x, y, f"{p}.attn.add") if block.residual else y
    y = _linear_norm_op(g, x, ckpt, f"{p}.mlp.ln1", arch.eps)
    y = g.activation(y, arch.act, f"{p}.mlp.act")
    y = _linear_norm_op(g, y, ckpt, f"{p}.mlp.ln2", arch.eps)
    return g.add(x, y, f"{p}.mlp.add")


def emit(g: GraphBuilder, ckpt: Checkpoint, layout: Layout, arch: LevitConfig) -> Tensor:
    x = image_input(g, ckpt)
    for i, p in enumerate(layout.stem):
        fn = arch.act if i < len(layout.stem) - 1 else None  # Stem16 ends on conv4's norm
        x = conv_norm_act(g, x, ckpt, f"{p}.linear", f"{p}.bn", fn, eps=arch.eps, stride=arch.stem_conv_stride)
    x = to_tokens(g, x, "stem.flatten")
    for block in layout.blocks:
        x = _emit_block(g, x, ckpt, block, arch)
    x = g.reduce(x, "head.global_pool", Reduction.MEAN, (1,), keepdim=False)
    heads = [_norm_linear(ckpt, head, arch.eps) for head in ("head", "head_dist")]
    return averaged_classifier(g, x, heads, "head")


FAMILY = Family(
    name="levit",
    summary="LeViT: conv stem, attention with learned position biases and subsampling attention, BN-linear MLPs",
    architectures={
        "levit_128s": LevitConfig(),
        "levit_128": LevitConfig(),
    },
    derive_layout=derive_layout,
    emit=emit,
)
