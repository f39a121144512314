"""Backends turn a precision-assigned graph into an engine, and load engines back.

The contract, typed:

- `Backend` (one module per backend, registered in `BACKENDS`): its `name`, the `devices` it builds
  for, `cannot_build_reason(device)`, `build(graph, spec, progress) -> BuiltEngine`,
  `unavailable_reason(entry) -> str | None` (why this machine cannot run a built engine; checked
  before anything loads) and `load(files, entry, graph, options=LoadOptions()) -> Engine`, one
  signature for every backend (`LoadOptions` asks for a quick start; backends it does not apply to
  ignore it).
- `Engine`: a loaded engine. It states its `device` and its `Batching` (any batch 1..max_batch, or a
  fixed set of sizes), does its one-time work in `warm_up()`, and `engine(pixels)` checks the shape,
  dtype and device it is given (ValueError naming expected and got) and returns float32 logits the
  caller owns: a later call never overwrites them.
- `EngineEntry`: what the bundle manifest records for one engine, read and written by
  `to_json` / `from_json` (which validates).

Backends never import each other; the bundle writer and the runtime reach them through
`get_backend(name)`. This module imports neither torch nor TensorRT, so the CLI can list backends
without loading them (nor numpy, once `DType` comes from a module free of it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, runtime_checkable

from ..precision import DType
from ..schema import Fields, SchemaError

if TYPE_CHECKING:
    import torch

    from ..graph import Graph

# name -> one line for `--help`, in the order the runtime prefers engines: a TensorRT plan wherever
# one can run, the uncompiled reference graph only when nothing else can.
BACKENDS: Mapping[str, str] = {
    "tensorrt": "a TensorRT plan (full TensorRT, else TensorRT-RTX, which builds on any machine); runs on NVIDIA GPUs",
    "inductor": "PyTorch Inductor: an AOTInductor package on cpu, torch.compile with stored caches on cuda",
    "reference": "the uncompiled graph run op by op in PyTorch (no compile step; for checks and tests)",
}
DEFAULT_BACKEND = "inductor"
DEVICES = ("cpu", "cuda")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EngineSpec:
    """What to build: one engine of one backend, for one device and precision."""

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
        return engine_key(self.backend, self.device, self.precision)


def engine_key(backend: str, device: str, precision: str) -> str:
    return f"{backend}-{device}-{precision}"


@dataclass(frozen=True)
class LoadOptions:
    """How the runtime asks a backend to load an engine.

    With `quick_start`, an engine that would compile when it loads (the CUDA inductor engine: Inductor
    replays the bundle's caches, then the first call at each size compiles and captures a CUDA graph:
    about 15 s on a GPU) instead answers from its graph uncompiled: the same FX graph, ops and dtypes (so
    bf16 stays bf16), no Dynamo/Inductor import, no CUDA graphs, serving any batch 1..max_batch. It
    answers at once where decoding, not the engine, bounds the run (`trtmc classify`). Engines that
    load compiled code (TensorRT plans, the CPU AOTInductor package) and the reference engine load as
    always.
    """

    quick_start: bool = False


@dataclass(frozen=True)
class Batching:
    """The batch sizes an engine serves: every size 1..max_batch (`sizes` None), or only `sizes`."""

    max_batch: int
    sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"an engine serves batches of at least 1, got max_batch {self.max_batch}")
        if self.sizes is not None and (
            not self.sizes or list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 1
            or self.sizes[-1] != self.max_batch
        ):
            raise ValueError(f"fixed batch sizes must be distinct, ascending, >= 1, ending at max_batch; got {self.sizes}")

    @classmethod
    def up_to(cls, max_batch: int) -> "Batching":
        return cls(max_batch)

    @classmethod
    def fixed(cls, sizes: tuple[int, ...] | list[int]) -> "Batching":
        ordered = tuple(sorted(set(sizes)))
        return cls(ordered[-1] if ordered else 0, ordered)

    @property
    def dynamic(self) -> bool:
        return self.sizes is None

    def accepts(self, batch: int) -> bool:
        return 1 <= batch <= self.max_batch if self.sizes is None else batch in self.sizes

    def run_size(self, batch: int) -> int:
        """The batch to run `batch` rows as (rows beyond `batch` are padding): the smallest size served."""
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"a batch of {batch} is outside this engine's {self}")
        return batch if self.sizes is None else next(s for s in self.sizes if s >= batch)

    def warm_up_sizes(self) -> tuple[int, ...]:
        """The sizes whose one-time work (compile, capture, contexts) `Engine.warm_up` does."""
        return self.sizes if self.sizes is not None else tuple(sorted({1, self.max_batch}))

    def __str__(self) -> str:
        if self.sizes is None:
            return f"any batch 1..{self.max_batch}"
        return "batch " + ", ".join(map(str, self.sizes))

    def to_json(self) -> dict[str, Any]:
        return {"max_batch": self.max_batch} if self.sizes is None else {"sizes": list(self.sizes)}

    @classmethod
    def from_json(cls, fields: Fields) -> "Batching":
        if fields.has("sizes") == fields.has("max_batch"):
            raise SchemaError(f"{fields.path} must hold either 'max_batch' (any batch 1..N) or 'sizes' (only those)")
        if fields.has("max_batch"):
            return cls.up_to(fields.integer("max_batch", minimum=1))
        sizes = fields.integers("sizes", minimum=1)
        if list(sizes) != sorted(set(sizes)):
            raise fields.wrong("sizes", "distinct batch sizes in ascending order")
        return cls.fixed(sizes)


@dataclass(frozen=True)
class EngineEntry:
    """One engine as the bundle manifest records it; its files live under `engines/<key>/`."""

    key: str
    backend: str
    device: str
    precision: str
    files: tuple[str, ...]
    batching: Batching
    record: Mapping[str, Any] = field(default_factory=dict)  # the builder's facts: versions, options, times

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "backend": self.backend,
            "device": self.device,
            "precision": self.precision,
            "files": list(self.files),
            "batching": self.batching.to_json(),
            "record": dict(self.record),
        }

    @classmethod
    def from_json(cls, data: Any, path: str = "engine") -> "EngineEntry":
        """Read and validate one manifest entry; SchemaError names the field (`engines[0].backend`)."""
        fields = Fields.of(data, path)
        entry = cls(
            key=fields.text("key"),
            backend=fields.text("backend"),
            device=fields.text("device"),
            precision=fields.text("precision"),
            files=fields.strings("files"),
            batching=Batching.from_json(fields.obj("batching")),
            record=dict(fields.obj("record").data),
        )
        expected = engine_key(entry.backend, entry.device, entry.precision)
        if entry.key != expected:
            raise SchemaError(f"{fields.where('key')} is {entry.key!r} but backend, device and precision make {expected!r}")
        return entry


@dataclass(frozen=True)
class BuiltEngine:
    """A backend's build result: the engine's files and what the manifest records about it."""

    spec: EngineSpec
    files: Mapping[str, bytes]  # member name inside the engine's folder -> bytes
    batching: Batching
    record: Mapping[str, Any] = field(default_factory=dict)  # builder, versions, options, sizes, times

    def entry(self) -> EngineEntry:
        return EngineEntry(
            key=self.spec.key,
            backend=self.spec.backend,
            device=self.spec.device,
            precision=self.spec.precision,
            files=tuple(sorted(self.files)),
            batching=self.batching,
            record=dict(self.record),
        )


@runtime_checkable
class Engine(Protocol):
    """A loaded engine: `engine(pixels)` takes NCHW pixels on `device` in the graph's input dtype,
    with a batch its `batching` serves, and returns owned float32 logits [N, classes] on `device`."""

    device: str
    batching: Batching

    def warm_up(self) -> None: ...

    def __call__(self, pixels: "torch.Tensor") -> "torch.Tensor": ...


@runtime_checkable
class Backend(Protocol):
    """A backend module (see the module docstring)."""

    name: str
    devices: tuple[str, ...]

    def cannot_build_reason(self, device: str) -> str | None: ...

    def build(self, graph: Graph, spec: EngineSpec, progress: Progress) -> BuiltEngine: ...

    def unavailable_reason(self, entry: EngineEntry) -> str | None: ...

    def load(
        self, files: Mapping[str, bytes], entry: EngineEntry, graph: Graph, options: LoadOptions = LoadOptions()
    ) -> Engine: ...


def unknown_backend_message(name: str) -> str:
    return f"unknown backend {name!r}; this trtmc has {', '.join(BACKENDS)}"


def get_backend(name: str) -> Backend:
    """The backend module registered under `name` (imported on first use)."""
    if name not in BACKENDS:
        raise ValueError(unknown_backend_message(name))
    module = importlib.import_module(f"{__name__}.{name}")
    if not isinstance(module, Backend) or module.name != name:
        raise TypeError(f"{module.__name__} does not implement the Backend protocol as {name!r}")
    return module
