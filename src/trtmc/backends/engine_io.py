"""What every engine does at its boundary, written once.

`EngineBase` is that boundary: an engine subclasses it and implements only `_forward`. Its
`PixelSpec.check` refuses pixels of the wrong rank, shape, dtype, device or batch before any
compiled code reads them (a compiled CPU kernel given the wrong height reads outside its buffer and
answers NaN instead of failing). `owned_logits` turns whatever an engine's kernels wrote into a
float32 tensor the caller owns, so engines that replay into static buffers (CUDA graphs, TensorRT
slots) never hand out memory the next call overwrites. `WarnOnce` keeps a per-engine problem to one
warning line however many batch sizes hit it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..graph import Graph
from . import Batching
from .torch_lowering import TORCH_DTYPES


@dataclass(frozen=True)
class PixelSpec:
    """The pixels an engine takes: (N, C, H, W) in `dtype` on `device`, N as its batching allows."""

    chw: tuple[int, ...]
    dtype: torch.dtype
    device: str

    @classmethod
    def of(cls, graph: Graph, device: str) -> "PixelSpec":
        node = graph.inputs[0]
        return cls(tuple(node.type.shape[1:]), TORCH_DTYPES[node.type.dtype], device)

    def describe(self, batching: Batching) -> str:
        dims = ", ".join(map(str, self.chw))
        return f"(N, {dims}) {str(self.dtype).removeprefix('torch.')} on {self.device} with N {batching}"

    def check(self, pixels: torch.Tensor, batching: Batching) -> None:
        if not isinstance(pixels, torch.Tensor):
            raise ValueError(f"expected a torch.Tensor of pixels {self.describe(batching)}, got {type(pixels).__name__}")
        got = f"{tuple(pixels.shape)} {str(pixels.dtype).removeprefix('torch.')} on {pixels.device.type}"
        shape_ok = pixels.dim() == len(self.chw) + 1 and tuple(pixels.shape[1:]) == self.chw
        if (
            not shape_ok
            or pixels.dtype != self.dtype
            or pixels.device.type != self.device
            or not batching.accepts(int(pixels.shape[0]))
        ):
            raise ValueError(f"expected pixels {self.describe(batching)}, got {got}")

    def zeros(self, batch: int) -> torch.Tensor:
        return torch.zeros((batch, *self.chw), dtype=self.dtype, device=self.device)


def owned_logits(output: torch.Tensor) -> torch.Tensor:
    """`output` as a new float32 tensor sharing no memory with it (one copy, cast included)."""
    return output.to(dtype=torch.float32, copy=True)


def device_missing_reason(device: str) -> str | None:
    """Why this machine has no `device` for an engine to run on (None when it has)."""
    if device == "cuda" and not torch.cuda.is_available():
        return "this engine runs on a CUDA GPU and this machine has none (rebuild with --device cpu)"
    if device not in ("cpu", "cuda"):
        return f"this engine runs on {device!r}, which this trtmc cannot drive"
    return None


class EngineBase:
    """The `Engine` protocol around `_forward`: pixels checked on the way in, owned float32 logits
    on the way out, and `warm_up` as one call at each warm-up size (the first call at a size is
    where engines compile, capture or create contexts)."""

    def __init__(self, pixels: PixelSpec, batching: Batching) -> None:
        self._pixels = pixels
        self._batching = batching

    @property
    def device(self) -> str:
        return self._pixels.device

    @property
    def batching(self) -> Batching:
        return self._batching

    def warm_up(self) -> None:
        for batch in self._batching.warm_up_sizes():
            self(self._pixels.zeros(batch))

    # Engines that copy the pixels into buffers of their own take any strides; the others get them
    # contiguous: compiled kernels index contiguous NCHW and would read a channels-last view (what
    # normalizing NHWC bytes gives) as other pixels.
    copies_input = False

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        # Compiled code trusts its input's shape: the check keeps a wrong one from reading out of bounds.
        self._pixels.check(pixels, self._batching)
        if not self.copies_input:
            pixels = pixels.contiguous()
        with torch.no_grad():
            return owned_logits(self._forward(pixels))

    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """The logits for checked pixels, on the engine's device; may be a buffer the next call overwrites."""
        raise NotImplementedError


class WarnOnce:
    """Logs its first message at WARNING and later ones at DEBUG: one line per engine, not per batch size."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._warned = False

    def __call__(self, message: str, *args: object) -> None:
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        self._logger.log(level, message, *args)
