"""Backends turn a precision-assigned graph into an engine, and load engines back.

A backend module (`inductor`, `tensorrt`) provides:

- `build(graph, spec: EngineSpec, progress) -> BuiltEngine`: the engine's files and the record the
  bundle manifest keeps for it;
- `unavailable_reason(record: dict, device: str) -> str | None`: why this machine cannot run an
  engine built for `device` with that record (None when it can), checked before anything loads;
- `load(files: dict[str, bytes], record: dict, graph: Graph, device: str) -> Engine`.

Backends never import each other; the bundle writer and the runtime reach them through
`backend_module(name)`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Protocol

from ..graph import DType

BACKENDS = ("tensorrt", "inductor")
DEVICES = ("cpu", "cuda")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EngineSpec:
    backend: str
    device: str
    precision: str
    io_dtype: DType = DType.F32
    max_batch: int = 1
    opt_level: int = 3  # TensorRT builder optimization level 0..5
    workspace: int | None = None  # bytes; None lets the builder decide
    timing_cache: Path | None = None

    @property
    def key(self) -> str:
        return f"{self.backend}-{self.device}-{self.precision}"


@dataclass(frozen=True)
class BuiltEngine:
    spec: EngineSpec
    files: dict[str, bytes]  # member name inside the engine's folder -> bytes
    record: dict[str, Any] = field(default_factory=dict)  # builder, versions, options, sizes, times


class Engine(Protocol):
    """A loaded engine: device-resident float input in, float32 logits out."""

    device: str

    def __call__(self, pixels: Any) -> Any: ...


def backend_module(name: str) -> ModuleType:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__name__}.{name}")
