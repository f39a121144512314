"""Reading a network's layout from a checkpoint's names and shapes, never from its weights.

Every family's `derive_layout` walks its numbered blocks with `indexed_blocks` and places each tensor
through one `LayoutReader`, which checks a layer against the width it reads as it goes; `finish()` then
refuses any tensor the layout did not place, so a build never drops a weight silently.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from ..checkpoint import Checkpoint, CheckpointError
from . import UnsupportedModel


def matched_indices(ckpt: Checkpoint, pattern: str) -> list[tuple[int, ...]]:
    """Sorted, distinct integer groups that `pattern` (a regex with int groups) matches in key names.

    Gaps are allowed: a Sequential's activations hold no tensors (ResNet-D's stem is conv1.0, 1, 3, 4, 6).
    """
    regex = re.compile(pattern)
    return sorted({tuple(int(v) for v in m.groups()) for m in map(regex.match, ckpt.names) if m})


def indexed_blocks(
    ckpt: Checkpoint, pattern: str, *, start: int | Sequence[int] = 0, stages: int | None = None
) -> list[tuple[int, ...]]:
    """The integer groups `pattern` matches in key names, sorted, each level numbered without gaps.

    Under every prefix the numbers run `start`, `start + 1`, ...: one `start` for all levels, or one per
    level (DPN numbers its stages from 2 and their blocks from 1). A family with a fixed number of
    `stages` (distinct first indices) refuses another count as a variant it does not serve. No match at
    all is an empty list, which each family refuses in its own words.
    """
    arch = ckpt.config.architecture
    found = matched_indices(ckpt, pattern)
    numbers: dict[tuple[int, ...], set[int]] = {}  # prefix -> the numbers that follow it
    for group in found:
        for level, number in enumerate(group):
            numbers.setdefault(group[:level], set()).add(number)
    first_level = sorted(numbers.get((), ()))
    if stages is not None and len(first_level) != stages:
        raise UnsupportedModel(
            f"{arch}: expected {stages} stages in the tensor names matching {pattern}, "
            f"the checkpoint has {len(first_level)}: {first_level}"
        )
    starts = tuple(start) if isinstance(start, Sequence) else (start,) * (len(found[0]) if found else 0)
    for prefix, inner in sorted(numbers.items()):
        first = starts[len(prefix)]
        if sorted(inner) != list(range(first, first + len(inner))):
            under = f" under {'.'.join(map(str, prefix))}" if prefix else ""
            raise CheckpointError(
                f"{arch}: the indices {sorted(inner)}{under} in the tensor names matching {pattern} "
                f"are not contiguous from {first}"
            )
    return found


class LayoutReader:
    """Reads one checkpoint's names and shapes for `derive_layout`, recording every tensor the layout places.

    Each method places a layer's tensors, checks what it can at once (a conv against the channels it
    is given) and returns the width the layout goes on with. `finish()` checks every recorded shape
    and refuses the tensors nothing placed.
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self.arch = ckpt.config.architecture
        self.expected: dict[str, tuple[int, ...]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.ckpt

    def shape(self, name: str, *, rank: int | None = None, dims: Mapping[int, int] | None = None) -> tuple[int, ...]:
        """The shape of `name`, checked against a rank and known sizes (axis -> size), not placed: for
        reading a width before the layer that owns it is placed."""
        shape = self.ckpt.shape(name)  # raises CheckpointError naming the tensor when it is missing
        wrong_rank = rank is not None and len(shape) != rank
        if wrong_rank or any(axis >= len(shape) or shape[axis] != size for axis, size in (dims or {}).items()):
            want = ", ".join(f"dim {axis} = {size}" for axis, size in sorted((dims or {}).items()))
            raise CheckpointError(
                f"{self.arch}: tensor {name!r} has shape {shape}; expected"
                f"{f' rank {rank}' if rank is not None else ''}{' with ' + want if want else ''}"
            )
        return shape

    def patch_grid(self, projection: str = "patch_embed.proj") -> tuple[int, int, tuple[int, int]]:
        """A patch embedding's width, patch size and token grid, from its projection's shape and the
        checkpoint's input size (not placed); refused unless square patches tile the input."""
        in_chans, height, width_px = self.ckpt.config.pretrained.input_size
        width, _, patch, patch_w = self.shape(f"{projection}.weight", rank=4, dims={1: in_chans})
        if patch != patch_w or height % patch or width_px % patch:
            raise UnsupportedModel(
                f"{self.arch}: {projection}.weight {(width, in_chans, patch, patch_w)} does not tile the "
                f"{height}x{width_px} input into square patches"
            )
        return width, patch, (height // patch, width_px // patch)

    def tensor(self, name: str, shape: Sequence[int]) -> None:
        """Place `name` with exactly this shape (checked by `finish`)."""
        self.expected[name] = tuple(shape)

    def conv(
        self,
        prefix: str,
        channels: int,
        *,
        norm: str | None = None,
        bias: bool | None = None,
        dims: Mapping[int, int] | None = None,
    ) -> int:
        """The conv at `prefix` reading `channels`, and the batch norm `norm` after it; its output width.

        Groups follow from the weight's input width, which must divide `channels`, so depthwise and
        grouped convs need no table. `dims` pins sizes the family knows (axis -> size: a 1x1 kernel, a
        depthwise conv's output). `bias`: True requires one, False refuses one, None places whatever
        the names hold.
        """
        name = f"{prefix}.weight"
        shape = self.shape(name, rank=4, dims=dims)
        out, per_group = shape[0], shape[1]
        if channels % per_group or out % (channels // per_group):
            raise CheckpointError(
                f"{self.arch}: tensor {name!r} has shape {shape}, which cannot be a conv reading {channels} channels"
            )
        self.tensor(name, shape)
        self._bias(prefix, out, bias)
        if norm is not None:
            self.batch_norm(norm, out)
        return out

    def batch_norm(self, prefix: str, channels: int) -> None:
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            self.tensor(f"{prefix}.{leaf}", (channels,))

    def layer_norm(self, prefix: str, width: int) -> None:
        self.tensor(f"{prefix}.weight", (width,))
        self.tensor(f"{prefix}.bias", (width,))

    def squeeze_excite(self, prefix: str, channels: int, *, reduce: str = "conv_reduce", expand: str = "conv_expand") -> int:
        """timm's squeeze-excite at `prefix`: 1x1 convs `reduce` (channels -> its own width) and
        `expand` (back), both with biases; the reduced width."""
        reduced = self.conv(f"{prefix}.{reduce}", channels, bias=True, dims={1: channels, 2: 1, 3: 1})
        self.tensor(f"{prefix}.{expand}.weight", (channels, reduced, 1, 1))
        self.tensor(f"{prefix}.{expand}.bias", (channels,))
        return reduced

    def linear(self, prefix: str, features: int, out: int | None = None, *, bias: bool | None = None) -> int:
        """The linear layer at `prefix` reading `features`; `out` where the layout knows it, else the
        weight says. `bias` as for `conv`."""
        if out is None:
            out = self.shape(f"{prefix}.weight", rank=2, dims={1: features})[0]
        self.tensor(f"{prefix}.weight", (out, features))
        self._bias(prefix, out, bias)
        return out

    def mlp(self, prefix: str, features: int, hidden: int | None = None) -> int:
        """timm's Mlp at `prefix`: `fc1` (features -> hidden, where the layout knows it, else the weight
        says) and `fc2` back, both with biases; the hidden width."""
        hidden = self.linear(f"{prefix}.fc1", features, hidden, bias=True)
        self.linear(f"{prefix}.fc2", hidden, features, bias=True)
        return hidden

    def classifier(self, prefix: str, features: int, *, bias: bool | None = None, pointwise: bool = False) -> None:
        """The final layer at `prefix`: `features` in, config.json's num_classes out; a 1x1 conv when
        `pointwise` (DPN's), else a linear."""
        classes = self.ckpt.config.num_classes
        shape = self.shape(f"{prefix}.weight")
        if shape[:1] != (classes,):
            raise CheckpointError(
                f"{self.arch}: {prefix}.weight {shape} does not classify into config.json's num_classes={classes}"
            )
        self.tensor(f"{prefix}.weight", (classes, features, 1, 1) if pointwise else (classes, features))
        self._bias(prefix, classes, bias)

    def shortcut(self, block: str, channels: int, out: int, stride: int, projection: str | None, norm: str | None) -> None:
        """The skip path of residual `block` from `channels` to `out` channels: the conv `projection`
        with its batch norm `norm`, or, where there is none, the identity, which can change neither the
        resolution nor the width."""
        if projection is not None:
            carried = self.conv(projection, channels, norm=norm)
        elif stride != 1:
            raise CheckpointError(f"{self.arch}: {block} strides by {stride} but has no projection on its shortcut")
        else:
            carried = channels
        if carried != out:
            raise CheckpointError(f"{self.arch}: {block} outputs {out} channels but its shortcut carries {carried}")

    def finish(self) -> None:
        """The checkpoint holds exactly the placed tensors, with exactly their shapes.

        A missing or mis-shaped tensor is a `CheckpointError`; a tensor the layout does not account for
        (another variant's layer scale or qk-norm, a distillation head) is `UnsupportedModel`, so a build
        never drops weights silently. Batch-norm `num_batches_tracked` counters are ignored: they do not
        take part in inference.
        """
        for name, shape in self.expected.items():
            self.shape(name, rank=len(shape), dims=dict(enumerate(shape)))
        unknown = sorted(n for n in self.ckpt.names if n not in self.expected and not n.endswith(".num_batches_tracked"))
        if unknown:
            shown = ", ".join(f"{n} {self.ckpt.shape(n)}" for n in unknown[:3])
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            raise UnsupportedModel(f"{self.arch}: the checkpoint holds tensors this layout does not use: {shown}{more}")

    def _bias(self, prefix: str, width: int, bias: bool | None) -> None:
        if bias or (bias is None and f"{prefix}.bias" in self.ckpt):
            self.tensor(f"{prefix}.bias", (width,))
