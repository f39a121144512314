"""The architecture families trtmc can build, and the one table that maps timm names to them.

A family module exposes `FAMILY = Family(...)`: its name, a one-line summary, the architectures it
serves (each with its typed `ArchConfig`), and `build(checkpoint, arch_config) -> Graph`, which
derives the layout from the checkpoint's tensors and emits the graph. Unsupported requests fail
here, before any weight is read.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..checkpoint import Checkpoint
from ..graph import Graph
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
)


@dataclass(frozen=True)
class Family:
    name: str
    summary: str
    architectures: Mapping[str, Any]  # timm architecture name -> the family's frozen ArchConfig
    build: Callable[[Checkpoint, Any], Graph]
    precisions: tuple[str, ...] = PRECISIONS


class UnsupportedModel(ValueError):
    """The checkpoint's architecture, or the requested option, is not supported."""


def all_families() -> list[Family]:
    return [importlib.import_module(f"{__name__}.{module}").FAMILY for module in _MODULES]


def find_family(architecture: str) -> tuple[Family, Any]:
    """The family serving a timm architecture name, and its ArchConfig."""
    for family in all_families():
        if architecture in family.architectures:
            return family, family.architectures[architecture]
    known = sorted(a for f in all_families() for a in f.architectures)
    raise UnsupportedModel(
        f"architecture {architecture!r} is not supported; `trtmc families` lists the {len(known)} that are"
    )


def build_graph(checkpoint: Checkpoint, precision: str = "fp32") -> tuple[Family, Graph]:
    """Check the request against the family, then derive the layout and emit the float32 graph."""
    family, arch = find_family(checkpoint.config.architecture)
    if precision not in family.precisions:
        raise UnsupportedModel(
            f"{checkpoint.config.architecture} ({family.name}) supports precisions "
            f"{', '.join(family.precisions)}, not {precision!r}"
        )
    graph = family.build(checkpoint, arch)
    graph.verify()
    return family, graph
