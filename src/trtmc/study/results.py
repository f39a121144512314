"""What a study found: one bench `Row` per variant and batch size (its subject is the variant, its
scope the engine's; it holds no oracle verdict: quality is the variant's, per batch size), one
`VariantResult` per variant, the recipe of each quantized precision, the decisions; `StudyResult`
holds them all. The runner makes them, the report only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..backends import Batching
from ..bench.results import Row
from ..quantization import CalibrationScales, QuantRecipe
from .decision import Decision
from .quality import Quality
from .request import ImageSplit, StudyRequest


@dataclass(frozen=True)
class BundleFacts:
    """One bundle a variant was built into (one per largest batch its engine had to serve)."""

    max_batch: int
    path: Path
    bundle_bytes: int
    engine_bytes: int  # the engine's files in the bundle (0 for the reference engine: it has none)
    engine_key: str
    batching: Batching  # the batch sizes its engine serves
    layers: int | None  # TensorRT network layers; None for other engines
    build_seconds: float

    def to_json(self) -> dict:
        return {
            "max_batch": self.max_batch,
            "file": self.path.name,
            "bundle_bytes": self.bundle_bytes,
            "engine_bytes": self.engine_bytes,
            "engine_key": self.engine_key,
            "batching": str(self.batching),
            "layers": self.layers,
            "build_seconds": round(self.build_seconds, 2),
        }


@dataclass(frozen=True)
class VariantResult:
    name: str  # fp32 | fp16 | bf16 | fp8 | int8
    compute: str  # what its ops compute in
    bundles: tuple[BundleFacts, ...] = ()
    quality: Mapping[int, Quality] = field(default_factory=dict)  # batch -> on the held-out images
    stress_non_finite: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # batch -> stress inputs
    kernels: Mapping[int, int] = field(default_factory=dict)  # batch -> CUDA kernels in one engine call
    error: str | None = None  # the build, load or quality run that failed

    @property
    def primary(self) -> BundleFacts | None:
        """The bundle for the largest batch size: the one whose size the report shows."""
        return max(self.bundles, key=lambda b: b.max_batch) if self.bundles else None

    def non_finite(self) -> int:
        """Held-out images and stress inputs with a non-finite logit, summed over the batch sizes."""
        return sum(q.non_finite for q in self.quality.values()) + sum(len(s) for s in self.stress_non_finite.values())

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "compute": self.compute,
            "error": self.error,
            "bundles": [b.to_json() for b in self.bundles],
            "quality": {str(b): q.to_json() for b, q in self.quality.items()},
            "stress_non_finite": {str(b): list(s) for b, s in self.stress_non_finite.items()},
            "cuda_kernels": {str(b): n for b, n in self.kernels.items()},
        }


@dataclass(frozen=True)
class RecipeFacts:
    """What a quantized precision's recipe chose on this model's graph."""

    precision: str
    recipe: QuantRecipe
    quantized: int  # convolution and linear ops quantized
    total: int  # convolution and linear ops in the graph
    kept: Mapping[str, int]  # why the others stay in the compute precision -> how many

    def to_json(self) -> dict:
        return {"precision": self.precision, "recipe": self.recipe.to_json(), "quantized": self.quantized,
                "total": self.total, "kept": dict(self.kept)}


@dataclass(frozen=True)
class StudyResult:
    request: StudyRequest
    environment: Mapping[str, Any]
    architecture: str
    family: str
    weights: str  # "checkpoint" or "random"
    source: str  # the checkpoint's id and revision
    split: ImageSplit
    reference: Quality  # timm fp32 judged against itself: its top-1 against the labels
    variants: tuple[VariantResult, ...]
    rows: tuple[Row, ...]
    recipes: tuple[RecipeFacts, ...]
    calibration: CalibrationScales | None
    decisions: tuple[Decision, ...]
    started: str
    seconds: float

    def row(self, variant: str, batch: int) -> Row | None:
        return next((r for r in self.rows if (r.subject, r.batch) == (variant, batch)), None)

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)

    def times(self, variant: str) -> dict[int, float | None]:
        """batch -> stable median ms (None where the row is not a result)."""
        return {b: (row.median_ms if (row := self.row(variant, b)) else None) for b in self.request.batch_sizes}

    def ratio(self, variant: str, baseline: str, batch: int) -> float | None:
        """baseline ms / variant ms (above 1: the variant is faster), where both are results."""
        ours, theirs = self.times(variant).get(batch), self.times(baseline).get(batch)
        return None if ours is None or theirs is None else theirs / ours
