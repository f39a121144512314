"""Loading a bundle and running the engine that can run here.

Engines are tried in the order the bundle lists them (or only the one asked for). One that cannot
run on this machine is skipped with one clear line saying why; asking for it by name is an error
naming the fix. The chosen engine gets device-resident float input and returns float32 logits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .backends import BACKENDS, backend_module
from .bundle import Bundle, BundleError, read_bundle
from .graph import Graph
from .preprocess import PreprocessSpec

log = logging.getLogger(__name__)


class EngineUnavailable(RuntimeError):
    """No engine in the bundle can run on this machine (or the one asked for cannot)."""


@dataclass(frozen=True)
class EngineChoice:
    key: str
    backend: str
    device: str
    record: dict[str, Any]


def choose_engine(bundle: Bundle, wanted: str | None = None) -> tuple[EngineChoice, list[str]]:
    """The first engine that can run here, and one line for each engine passed over."""
    # TensorRT first: trtmc prefers a plan wherever one can run.
    engines = sorted(bundle.engines, key=lambda e: BACKENDS.index(e["backend"]) if e["backend"] in BACKENDS else 99)
    if wanted is not None:
        matches = [e for e in engines if wanted in (e["key"], e["backend"])]
        if not matches:
            have = ", ".join(e["key"] for e in engines) or "none"
            raise EngineUnavailable(
                f"{bundle.path}: no {wanted!r} engine in this bundle (it has: {have}); "
                f"rebuild with `trtmc build ... --backend {wanted.split('-')[0]}`"
            )
        engines = matches
    skipped: list[str] = []
    for entry in engines:
        reason = backend_module(entry["backend"]).unavailable_reason(entry["record"], entry["device"])
        if reason is None:
            return EngineChoice(entry["key"], entry["backend"], entry["device"], entry["record"]), skipped
        line = f"engine {entry['key']} cannot run here: {reason}"
        if wanted is not None:
            raise EngineUnavailable(f"{bundle.path}: {line}")
        skipped.append(line)
    if not bundle.engines:
        raise EngineUnavailable(
            f"{bundle.path}: the bundle holds no engine; rebuild with `trtmc build ... --backend inductor`"
        )
    raise EngineUnavailable(
        f"{bundle.path}: no engine in this bundle can run on this machine:\n  "
        + "\n  ".join(skipped)
        + "\nRebuild the bundle on this machine (e.g. `trtmc build MODEL -o OUT --device "
        + ("cuda" if torch.cuda.is_available() else "cpu")
        + "`)."
    )


class Runtime:
    """A loaded bundle: its preprocessing contract, labels and one engine."""

    def __init__(self, bundle: Bundle, engine: str | None = None) -> None:
        self.bundle = bundle
        self.choice, skipped = choose_engine(bundle, engine)
        for line in skipped:
            log.warning("%s; using %s instead", line, self.choice.key)
        self.skipped = skipped
        self.preprocess: PreprocessSpec = bundle.preprocess
        labels = bundle.labels
        self.label_names: tuple[str, ...] = tuple(labels.get("names", []))
        self.label_descriptions: dict[str, str] = dict(labels.get("descriptions", {}))
        self.graph: Graph = bundle.graph()
        module = backend_module(self.choice.backend)
        self.engine = module.load(bundle.engine_files(self.choice.key), self.choice.record, self.graph, self.choice.device)
        self.device = self.choice.device
        # Engines serve either any batch up to `max_batch` (dynamic) or a fixed set of batch sizes.
        self.dynamic_batch = bool(getattr(self.engine, "dynamic_batch", False))
        self.batch_sizes = sorted(getattr(self.engine, "batch_sizes", None) or self.choice.record.get("batch_sizes", [1]))
        self.max_batch = int(getattr(self.engine, "max_batch", max(self.batch_sizes)))

    @classmethod
    def open(cls, path: str | Path, engine: str | None = None) -> "Runtime":
        return cls(read_bundle(Path(path)), engine)

    @property
    def num_classes(self) -> int:
        return int(self.graph.node(self.graph.outputs[0]).type.shape[-1])

    def _run_chunk(self, pixels: torch.Tensor) -> torch.Tensor:
        n = pixels.shape[0]
        if self.dynamic_batch:
            return self.engine(pixels)
        size = next(s for s in self.batch_sizes if s >= n)
        if size != n:  # pad to a compiled batch size; the padding rows are dropped
            pad = torch.zeros((size - n,) + tuple(pixels.shape[1:]), device=pixels.device, dtype=pixels.dtype)
            pixels = torch.cat([pixels, pad])
        return self.engine(pixels)[:n]

    def logits(self, pixels: torch.Tensor) -> np.ndarray:
        """Preprocessed NCHW float32 host pixels -> float32 logits [N, classes] on the host."""
        from .backends.torch_lowering import TORCH_DTYPES

        dtype = TORCH_DTYPES[self.graph.inputs[0].type.dtype]
        outputs = []
        for start in range(0, pixels.shape[0], self.max_batch):
            chunk = pixels[start : start + self.max_batch].to(self.device, dtype)
            outputs.append(self._run_chunk(chunk).float().cpu())
        return torch.cat(outputs).numpy()


__all__ = ["Runtime", "EngineUnavailable", "BundleError", "choose_engine", "BACKENDS"]
