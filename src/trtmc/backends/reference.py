"""The reference backend: the bundle's graph run op by op in PyTorch, uncompiled.

It stores no files (the graph and weights are already in the bundle), builds in no time and runs
wherever PyTorch does, so it is what checks and tests compare compiled engines against and what
harness tests run instead of compiling. On the CPU, fp16/bf16 convolutions compute in fp32 from the
half values and round once, as GPU kernels do (CPUs run native half convolutions many times slower).
"""

from __future__ import annotations

import time
from typing import Mapping

import torch

from ..graph import Graph
from . import Batching, BuiltEngine, Engine, EngineEntry, EngineSpec, LoadOptions, Progress
from .engine_io import EngineBase, PixelSpec, device_missing_reason
from .torch_lowering import GraphModule

name = "reference"
devices = ("cpu", "cuda")


def cannot_build_reason(device: str) -> str | None:
    return None  # nothing is compiled: the engine is made when it loads


def build(graph: Graph, spec: EngineSpec, progress: Progress) -> BuiltEngine:
    started = time.perf_counter()
    graph.verify()
    progress("the reference engine runs the bundle's graph as it is: nothing to compile")
    record = {
        "builder": name,
        "builder_version": torch.__version__,
        "options": {"max_batch": spec.max_batch, "io_dtype": spec.io_dtype.value},
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    return BuiltEngine(spec=spec, files={}, batching=Batching.up_to(spec.max_batch), record=record)


def unavailable_reason(entry: EngineEntry) -> str | None:
    return device_missing_reason(entry.device)


def load(
    files: Mapping[str, bytes], entry: EngineEntry, graph: Graph, options: LoadOptions = LoadOptions()
) -> Engine:
    # `options` is ignored: the graph already runs uncompiled, so a quick start changes nothing.
    if files:
        raise ValueError(f"the reference engine {entry.key} stores no files, but the bundle has {sorted(files)}")
    return ReferenceEngine(graph, entry.device, entry.batching)


class ReferenceEngine(EngineBase):
    """`GraphModule(graph)` on `device`, serving any batch 1..max_batch."""

    def __init__(self, graph: Graph, device: str, batching: Batching) -> None:
        super().__init__(PixelSpec.of(graph, device), batching)
        self._module = GraphModule(graph, half_convolutions_in_fp32=device == "cpu").eval().to(device)

    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self._module(pixels)
