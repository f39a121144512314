"""The architecture families trtmc can build, the contract each one meets, and the one build they share.

A family module ends with `FAMILY = Family(...)`: its name, a one-line summary, the architectures it
serves (timm name -> the family's frozen ArchConfig), `derive_layout(checkpoint, arch) -> Layout`, which
reads names and shapes only, and `emit(g, checkpoint, layout, arch) -> Tensor`, which writes the graph
and returns the logits. `Family.build` runs the two; unsupported requests fail before any weight is read.
Adding a family is its module plus one line in `_MODULES`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Generic, Mapping, Protocol, TypeVar

from ..checkpoint import Checkpoint
from ..graph import Graph
from ..graph_builder import GraphBuilder, Tensor
from ..precision import COMPUTE_PRECISIONS

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
    "levit",
    "efficientformer",
    "mobilevit",
    "edgenext",
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
