"""The baselines trtmc is compared with: timm's own model, in the same process, on the same device.

What each one runs is stated in `spec.BASELINE_SPECS`. The headline, `expert`, is what a user who
knows PyTorch writes by hand: channels_last, the entry's precision, `torch.compile` in its default
mode, and one manual CUDA graph per batch size replayed from a static input buffer. It is what trtmc
has to beat: trtmc's own CUDA engine is also a compiled graph replayed in a CUDA graph, so against
`reduce-overhead` alone a lead could be the replay mechanism rather than the compilation.

Each baseline returns float32 logits on the device that the next call does not overwrite, like
trtmc's engine, so both sides do the same work. Compilation is static per batch size
(`dynamic=False`), as trtmc compiles one engine per size.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from ..backends.inductor_mends import mend_inductor
from ..precision import PRECISIONS
from .spec import BASELINES, BASELINE_SPECS

TORCH_DTYPES = {p.name: p.torch_dtype for p in PRECISIONS.values()}
COMPILED = ("expert", "reduce-overhead", "max-autotune")
# Warm-up calls on a side stream before a manual capture: compile, then settle the allocations.
CAPTURE_WARMUPS = 3


class Float32Logits(torch.nn.Module):
    """A model whose logits are returned as float32, the engine's output contract."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixels).float()


class ManualCudaGraph:
    """`fn` replayed in one CUDA graph per batch size, as an expert writes it by hand: the first call
    at a batch size warms `fn` up on a side stream (compiling it), then captures it with a static
    input buffer; every call copies its input into that buffer, replays, and returns a copy of the
    static output."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.fn = fn
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    def _capture(self, x: torch.Tensor):
        static_in = x.clone()  # keeps x's dtype and memory format
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(CAPTURE_WARMUPS):
                self.fn(static_in)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self.fn(static_in)
        return graph, static_in, static_out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if n not in self.graphs:
            self.graphs[n] = self._capture(x)
        graph, static_in, static_out = self.graphs[n]
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()


@dataclass(frozen=True)
class Baseline:
    key: str
    label: str
    precision: str  # what its answers are judged at: the oracle's tie tolerance
    forward: Callable[[torch.Tensor], torch.Tensor]  # prepared device input -> float32 logits
    dtype: torch.dtype
    channels_last: bool
    marks_steps: bool = False  # a CUDA-graph-tree compile: each call starts a new step

    def prepare(self, pixels: torch.Tensor) -> torch.Tensor:
        """The device input in this baseline's dtype and memory format (made before timing)."""
        x = pixels.to(self.dtype)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.marks_steps:
            torch.compiler.cudagraph_mark_step_begin()
        return self.forward(x)


def _allow_a_compile_per_baseline_and_batch() -> None:
    """The interleaved rows keep every compiled baseline at every batch size alive at once, each a
    compile of the same forward code; past dynamo's default limit (8) it would silently run eager."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), 64))


def make_baseline(key: str, model: torch.nn.Module, precision: str, device: str) -> Baseline:
    """Baseline `key` of timm `model` (fp32, eval, already on `device`; left untouched)."""
    if key not in BASELINES:
        raise ValueError(f"unknown baseline {key!r}; choose from {', '.join(BASELINES)}")
    label = BASELINE_SPECS[key].label(precision)
    if key == "eager-fp32":
        return Baseline(key, label, "fp32", Float32Logits(model).eval(), torch.float32, channels_last=False)
    dtype = TORCH_DTYPES[precision]
    low = Float32Logits(copy.deepcopy(model).to(dtype).to(memory_format=torch.channels_last)).eval()
    if key == "eager-cl":
        return Baseline(key, label, precision, low, dtype, channels_last=True)
    _allow_a_compile_per_baseline_and_batch()
    mend_inductor()  # as for trtmc's own compiles: torch 2.11's Inductor failed run 41's swinv2 expert without it
    cuda = str(device).startswith("cuda")
    compiled = torch.compile(low, mode="default" if key == "expert" else key, dynamic=False)
    if key == "expert":
        forward = ManualCudaGraph(compiled) if cuda else compiled  # CUDA graphs exist only on a GPU
        return Baseline(key, label, precision, forward, dtype, channels_last=True)
    return Baseline(key, label, precision, compiled, dtype, channels_last=True, marks_steps=cuda)
