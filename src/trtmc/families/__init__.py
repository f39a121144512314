"""The architecture families trtmc can build, the contract each one meets, and the one build they share.

A family module ends with `FAMILY = Family(...)`: its name, a one-line summary, the architectures it
serves (timm name -> the family's frozen ArchConfig), `derive_layout(checkpoint, arch) -> Layout`, which
reads names and shapes only, and `emit(g, checkpoint, layout, arch) -> Tensor`, which writes the graph
and returns the logits. `Family.build` runs the two; unsupported requests fail before any weight is read.
Adding a family is its module plus one line in `_MODULES`.

Quantized builds (fp8, int8) are allowed per family by `STUDY_DECISIONS`: one row per family and
quantized precision, copied from a `trtmc study` report committed under benchmarks/studies/ (a GPU
run); `quantized_build_refusal` says why a build is refused, pointing to the report or to the
command that makes one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Generic, Mapping, Protocol, TypeVar

from ..checkpoint import Checkpoint
from ..graph import Graph
from ..graph_builder import GraphBuilder, Tensor
from ..precision import COMPUTE_PRECISIONS, QUANTIZED_FORMATS

PRECISIONS = COMPUTE_PRECISIONS

# Family modules, in the order `trtmc families` lists them.
_MODULES = (
    "efficientnet",
    "ghostnet",
    "mobilenetv3",
    "dpn",
    "resnet",
    "regnet",
    "convnext",
    "vit",
    "efficientvit",
    "efficientnetv2",
    "mixnet",
    "mnasnet",
    "fbnet",
    "lcnet",
    "hardcorenas",
    "mobilenetv4",
    "resnetv2",
    "res2net",
    "skresnet",
    "resnest",
    "nfnet",
    "swin",
    "swinv2",
    "beit",
    "densenet",
    "inception_v3",
    "xception",
    "cspnet",
    "repvgg",
    "mobileone",
    "levit",
    "efficientformer",
    "mobilevit",
    "edgenext",
    "fastvit",
)

ArchT = TypeVar("ArchT")
LayoutT = TypeVar("LayoutT")


@dataclass(frozen=True)
class Family(Generic[ArchT, LayoutT]):
    """One family: the architectures it serves and the two functions that build any of them."""

    name: str
    summary: str
    architectures: Mapping[str, ArchT]  # timm architecture name -> the family's frozen ArchConfig
    derive_layout: Callable[[Checkpoint, ArchT], LayoutT]
    emit: Callable[[GraphBuilder, Checkpoint, LayoutT, ArchT], Tensor]
    precisions: tuple[str, ...] = PRECISIONS

    def build(self, checkpoint: Checkpoint, arch: ArchT | None = None) -> Graph:
        """The float32 graph of `checkpoint`: the layout from its names and shapes, then the emitted ops.

        `arch` defaults to the config registered for the checkpoint's architecture; tests pass another
        (a different eps or gate) to show what the config decides. `finish` verifies the graph.
        """
        if arch is None:
            if checkpoint.config.architecture not in self.architectures:
                raise UnsupportedModel(f"{checkpoint.config.architecture} is not a {self.name} architecture")
            arch = self.architectures[checkpoint.config.architecture]
        layout = self.derive_layout(checkpoint, arch)
        g = GraphBuilder()
        g.output(self.emit(g, checkpoint, layout, arch))
        return g.finish()


class RegisteredFamily(Protocol):
    """A `Family` as the registry holds it, whatever its config and layout types: what the CLI, the
    build and bench read."""

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> str: ...

    @property
    def architectures(self) -> Mapping[str, object]: ...

    @property
    def precisions(self) -> tuple[str, ...]: ...

    def build(self, checkpoint: Checkpoint) -> Graph: ...


class UnsupportedModel(ValueError):
    """The checkpoint's architecture, or the requested option, is not supported."""


def all_families() -> list[RegisteredFamily]:
    return [importlib.import_module(f"{__name__}.{module}").FAMILY for module in _MODULES]


def find_family(architecture: str) -> tuple[RegisteredFamily, object]:
    """The family serving a timm architecture name, and its ArchConfig."""
    for family in all_families():
        if architecture in family.architectures:
            return family, family.architectures[architecture]
    known = sorted(a for f in all_families() for a in f.architectures)
    raise UnsupportedModel(
        f"architecture {architecture!r} is not supported; `trtmc families` lists the {len(known)} that are"
    )


def build_graph(checkpoint: Checkpoint, precision: str = "fp32") -> tuple[RegisteredFamily, Graph]:
    """Check the request against the family, then derive the layout and emit the float32 graph."""
    family, _ = find_family(checkpoint.config.architecture)
    if precision not in family.precisions:
        raise UnsupportedModel(
            f"{checkpoint.config.architecture} ({family.name}) supports precisions "
            f"{', '.join(family.precisions)}, not {precision!r}"
        )
    return family, family.build(checkpoint)


@dataclass(frozen=True)
class StudyDecision:
    """What a committed `trtmc study` decided for one family and quantized precision."""

    family: str  # a family name (`trtmc families`)
    precision: str  # a quantized format: fp8 or int8
    ships: bool  # faster than fp16 at the batch sizes users run, with >= 99% top-1 agreement
    report: str  # the report in the repository, e.g. benchmarks/studies/ghostnet_100/study.md
    summary: str  # the decision in one line, as the report gives it

    def __post_init__(self) -> None:
        if self.precision not in QUANTIZED_FORMATS:
            raise ValueError(f"a study decides on {' or '.join(QUANTIZED_FORMATS)}, not {self.precision!r}")


def _h200_inductor_study(family: str, precision: str, model: str, speedups: tuple[float, float, float],
                         agreement: float) -> StudyDecision:
    """A decision of a committed H200 inductor study: its fp8/int8 speed against fp16 at batch 1, 32
    and 128, and top-1 agreement with fp32, as its report words them. None of these ships."""
    speeds = " / ".join(f"{s:.2f}x" for s in speedups)
    return StudyDecision(
        family, precision, False, f"benchmarks/studies/{model}/study.md",
        f"{speeds} the speed of fp16 at batch 1 / 32 / 128, {agreement:.1%} top-1 agreement (H200, inductor)",
    )


# From the committed GPU study reports (benchmarks/studies/, H200, torch 2.11, random weights): no
# quantized precision pays yet, so every family refuses fp8 and int8 builds; those without a study
# say how to run one. tests/test_study_decisions.py checks each row against its report's study.json.
STUDY_DECISIONS: tuple[StudyDecision, ...] = (
    _h200_inductor_study("convnext", "fp8", "convnext_tiny", (0.88, 0.88, 0.96), 1.0),
    _h200_inductor_study("convnext", "int8", "convnext_tiny", (0.98, 0.81, 0.84), 1.0),
    _h200_inductor_study("ghostnet", "fp8", "ghostnet_100", (0.92, 0.93, 0.95), 0.818),
    _h200_inductor_study("ghostnet", "int8", "ghostnet_100", (0.99, 0.97, 0.95), 0.818),
    _h200_inductor_study("resnet", "fp8", "resnet50", (0.79, 0.81, 0.92), 0.818),
    _h200_inductor_study("resnet", "int8", "resnet50", (0.94, 0.75, 0.77), 0.545),
    _h200_inductor_study("vit", "fp8", "vit_base_patch16_224", (0.72, 0.94, 1.05), 1.0),
    _h200_inductor_study("vit", "int8", "vit_base_patch16_224", (0.84, 0.75, 0.76), 1.0),
)


def quantized_build_refusal(
    architecture: str, family: str, precision: str, decisions: tuple[StudyDecision, ...] = STUDY_DECISIONS
) -> str | None:
    """Why `trtmc build --precision fp8|int8` is refused for `family`, or None when its study says it pays."""
    decision = next((d for d in decisions if (d.family, d.precision) == (family, precision)), None)
    if decision is None:
        return (
            f"--precision {precision}: no `trtmc study` has decided yet whether {precision} pays for the {family} "
            f"family ({architecture}), so it is not built; run one on the GPU, e.g. `trtmc study MODEL --precision "
            f"fp16 --precision {precision} --calibration DIR --holdout DIR --device cuda --out DIR`, and commit its "
            "report and decision (trtmc.families.STUDY_DECISIONS)"
        )
    if not decision.ships:
        return (
            f"--precision {precision}: the study of the {family} family decided that {precision} does not pay "
            f"({decision.summary}); see {decision.report}, or build --precision fp16"
        )
    return None
