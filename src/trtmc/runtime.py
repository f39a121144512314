"""Loading a bundle and running the engine that can run here.

Engines are tried in the order the backends are registered (a TensorRT plan first, the uncompiled
reference graph last), or only the one asked for. Loading is part of choosing: an engine this
machine cannot run (its backend's `unavailable_reason`) and one that fails to load are both passed
over with one warning line saying why, and the next one is tried; asking for an engine by name
makes either an error naming the fix. `Runtime.logits` feeds the chosen engine host pixels in
chunks its `Batching` serves (padded up to a served size) and returns float32 host logits.
`LoadOptions` go to every backend's `load`: `quick_start` makes the CUDA inductor engine answer from
its graph uncompiled instead of compiling first (what `trtmc classify` does by default).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from .backends import (
    BACKENDS,
    DEFAULT_BACKEND,
    Batching,
    Engine,
    EngineEntry,
    LoadOptions,
    get_backend,
    unknown_backend_message,
)
from .backends.torch_lowering import TORCH_DTYPES
from .bundle import Bundle, BundleError, read_bundle
from .graph import Graph
from .preprocess import PreprocessSpec

log = logging.getLogger(__name__)


class EngineUnavailable(RuntimeError):
    """No engine in the bundle can run on this machine (or the one asked for cannot)."""


def _preference(entry: EngineEntry) -> int:
    return list(BACKENDS).index(entry.backend) if entry.backend in BACKENDS else len(BACKENDS)


def _candidates(bundle: Bundle, wanted: str | None) -> list[EngineEntry]:
    engines = sorted(bundle.engines, key=_preference)
    if not engines:
        raise EngineUnavailable(
            f"{bundle.path}: the bundle holds no engine; rebuild with `trtmc build ... --backend {DEFAULT_BACKEND}`"
        )
    if wanted is None:
        return engines
    matches = [e for e in engines if wanted in (e.key, e.backend)]
    if not matches:
        have = ", ".join(e.key for e in engines)
        backend = wanted.split("-")[0]
        fix = (
            f"add one with `trtmc build ... --backend {backend}`"
            if backend in BACKENDS
            else f"--engine takes a backend ({', '.join(BACKENDS)}) or an engine key"
        )
        raise EngineUnavailable(f"{bundle.path}: no {wanted!r} engine in this bundle (it has: {have}); {fix}")
    return matches


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _load(bundle: Bundle, entry: EngineEntry, graph: Graph, options: LoadOptions) -> tuple[Engine | None, str | None]:
    """The loaded engine, or None and why it cannot run here."""
    if entry.backend not in BACKENDS:
        return None, unknown_backend_message(entry.backend) + " (a newer trtmc may run it)"
    backend = get_backend(entry.backend)
    reason = backend.unavailable_reason(entry)
    if reason is not None:
        return None, reason
    try:
        return backend.load(bundle.engine_files(entry.key), entry, graph, options), None
    except Exception as exc:  # native loaders raise anything (RuntimeError, OSError, ...): it did not load
        log.info("loading engine %s failed", entry.key, exc_info=True)  # the traceback, for -v
        return None, f"it failed to load ({_first_line(exc)})"


def open_engine(
    bundle: Bundle, wanted: str | None = None, options: LoadOptions = LoadOptions()
) -> tuple[EngineEntry, Engine, list[str]]:
    """The first engine that can run here, loaded, and one line for each engine passed over."""
    graph = bundle.graph()
    skipped: list[str] = []
    for entry in _candidates(bundle, wanted):
        engine, reason = _load(bundle, entry, graph, options)
        if engine is not None:
            return entry, engine, skipped
        line = f"engine {entry.key} cannot run here: {reason}"
        if wanted is not None:
            raise EngineUnavailable(f"{bundle.path}: {line}")
        skipped.append(line)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    raise EngineUnavailable(
        f"{bundle.path}: no engine in this bundle can run on this machine ({'; '.join(skipped)}); "
        f"rebuild the bundle here, e.g. `trtmc build MODEL -o OUT --device {device}`"
    )


class Runtime:
    """A loaded bundle: its preprocessing contract, labels and one engine."""

    def __init__(self, bundle: Bundle, engine: str | None = None, options: LoadOptions = LoadOptions()) -> None:
        self.bundle = bundle
        self.choice, self.engine, self.skipped = open_engine(bundle, engine, options)
        for line in self.skipped:
            log.warning("%s; using %s instead", line, self.choice.key)
        self.preprocess: PreprocessSpec = bundle.preprocess
        self.label_names: tuple[str, ...] = tuple(bundle.labels["names"])
        self.label_descriptions: dict[str, str] = dict(bundle.labels["descriptions"])
        # What the label names are ("imagenet-1k"), recorded at build time; "" when unknown.
        self.vocabulary_id: str = bundle.labels.get("vocabulary_id", "")
        self.graph: Graph = bundle.graph()
        self.device: str = self.engine.device
        self._input_dtype = TORCH_DTYPES[self.graph.inputs[0].type.dtype]

    @classmethod
    def open(
        cls,
        path: str | Path,
        engine: str | None = None,
        expect_sha256: str | None = None,
        options: LoadOptions = LoadOptions(),
    ) -> "Runtime":
        """Read and check the bundle at `path` (refused before anything loads when its manifest
        digest is not `expect_sha256`), then load the first engine that runs here, or `engine`, as
        `options` ask."""
        return cls(read_bundle(Path(path), expect_sha256), engine, options)

    @property
    def batching(self) -> Batching:
        return self.engine.batching

    # The three below describe `batching` for callers written before it; new code reads `batching`.
    @property
    def dynamic_batch(self) -> bool:
        return self.batching.dynamic

    @property
    def batch_sizes(self) -> list[int]:
        return list(self.batching.sizes or self.batching.warm_up_sizes())

    @property
    def max_batch(self) -> int:
        return self.batching.max_batch

    @property
    def num_classes(self) -> int:
        return int(self.graph.node(self.graph.outputs[0]).type.shape[-1])

    def logits(self, pixels: torch.Tensor) -> np.ndarray:
        """Preprocessed NCHW float32 pixels (on the host or the engine's device) -> float32 logits
        [N, classes] on the host."""
        if pixels.dim() != 4 or pixels.shape[0] == 0:
            raise ValueError(f"expected a non-empty NCHW batch of pixels, got shape {tuple(pixels.shape)}")
        batching = self.batching
        outputs = []
        for start in range(0, pixels.shape[0], batching.max_batch):
            chunk = pixels[start : start + batching.max_batch].to(self.device, self._input_dtype)
            n = chunk.shape[0]
            size = batching.run_size(n)
            if size != n:  # pad to a batch size the engine serves; the padding rows are dropped
                pad = torch.zeros((size - n, *chunk.shape[1:]), device=chunk.device, dtype=chunk.dtype)
                chunk = torch.cat([chunk, pad])
            outputs.append(self.engine(chunk)[:n].cpu())
        return torch.cat(outputs).numpy()


__all__ = ["Runtime", "EngineUnavailable", "BundleError", "LoadOptions", "open_engine", "BACKENDS"]
