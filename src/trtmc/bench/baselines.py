"""The baselines trtmc is compared with: timm's own model, in the same process, on the same device.

- `eager-fp32`: timm eager, fp32, contiguous input (what `timm.create_model(...).eval()` gives);
- `eager-cl`: timm eager in the entry's precision, model and input channels_last;
- `reduce-overhead`: `torch.compile(mode="reduce-overhead")` of that channels_last model (Inductor
  plus CUDA graphs: what a user reaches for);
- `max-autotune`: `torch.compile(mode="max-autotune")`, opt-in (its compile takes minutes).

Each returns float32 logits on the device, like trtmc's engine, so both sides do the same work.
Compilation is static per batch size (`dynamic=False`), as trtmc compiles one engine per size.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from ..precision import PRECISIONS
from .spec import BASELINES

TORCH_DTYPES = {p.name: p.torch_dtype for p in PRECISIONS.values()}
COMPILE_MODES = {"reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune"}


def describe(key: str, precision: str) -> str:
    """The human label of a baseline, as tables and plots show it."""
    return {
        "eager-fp32": "timm eager fp32",
        "eager-cl": f"timm eager {precision} CL",
        "reduce-overhead": f"compile reduce-overhead {precision} CL",
        "max-autotune": f"compile max-autotune {precision} CL",
    }[key]


class Float32Logits(torch.nn.Module):
    """A model whose logits are returned as float32, the engine's output contract."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixels).float()


@dataclass
class Baseline:
    key: str
    label: str
    run: Callable[[torch.Tensor], torch.Tensor]  # prepared device input -> float32 logits
    dtype: torch.dtype
    channels_last: bool
    marks_steps: bool = False  # a CUDA-graph-tree compile: each call starts a new step

    def prepare(self, pixels: torch.Tensor) -> torch.Tensor:
        """The device input in this baseline's dtype and memory format, allocated once before timing."""
        x = pixels.to(self.dtype)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x.contiguous()

    def call(self, x: torch.Tensor) -> torch.Tensor:
        if self.marks_steps:
            torch.compiler.cudagraph_mark_step_begin()
        return self.run(x)


def make_baseline(key: str, model: torch.nn.Module, precision: str, device: str) -> Baseline:
    """Baseline `key` of timm `model` (fp32, eval, already on `device`; left untouched)."""
    if key not in BASELINES:
        raise ValueError(f"unknown baseline {key!r}; choose from {', '.join(BASELINES)}")
    label = describe(key, precision)
    if key == "eager-fp32":
        return Baseline(key, label, Float32Logits(model).eval(), torch.float32, channels_last=False)
    dtype = TORCH_DTYPES[precision]
    low = copy.deepcopy(model).to(dtype).to(memory_format=torch.channels_last).eval()
    if key == "eager-cl":
        return Baseline(key, label, Float32Logits(low).eval(), dtype, channels_last=True)
    torch.compiler.reset()  # one compiled baseline at a time: no cache entries shared between modes
    compiled = torch.compile(Float32Logits(low).eval(), mode=COMPILE_MODES[key], dynamic=False)
    return Baseline(key, label, compiled, dtype, channels_last=True, marks_steps=str(device).startswith("cuda"))
