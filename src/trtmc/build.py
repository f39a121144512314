"""One build: checkpoint -> family -> graph -> passes -> engines -> bundle.

`BuildRequest` is validated in full before any weight is read; the bundle is written atomically
at the end, so a failed build leaves no output file.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .backends import BACKENDS, DEFAULT_BACKEND, DEVICES, BuiltEngine, EngineEntry, EngineSpec, get_backend
from .bundle import engine_member, weights_to_bytes, write_bundle
from .checkpoint import open_checkpoint
from .families import find_family, build_graph
from .graph import DType
from .passes.fold_batch_norm import fold_batch_norm
from .passes.precision import PrecisionPolicy, assign_precision
from .precision import COMPUTE_PRECISIONS, precision_named
from .preprocess import PreprocessSpec

log = logging.getLogger(__name__)

TASK = "image_to_class_scores"


class BuildError(ValueError):
    """The build request is invalid; the message names the option and the fix."""


@dataclass(frozen=True)
class BuildRequest:
    model: str  # Hugging Face id or local folder
    output: Path
    precision: str = "fp32"
    device: str = "cpu"
    backends: tuple[str, ...] = (DEFAULT_BACKEND,)
    revision: str | None = None
    io_dtype: str = "fp32"
    max_batch: int = 1
    opt_level: int = 3
    workspace: int | None = None
    timing_cache: Path | None = None
    fp32_layers: tuple[str, ...] = field(default=())  # node-name globs kept in fp32
    add_engines_from: Path | None = None  # a bundle of the same checkpoint whose engines join this one

    def validate(self) -> None:
        if self.precision not in COMPUTE_PRECISIONS:
            raise BuildError(f"--precision {self.precision!r}: choose {', '.join(COMPUTE_PRECISIONS)}")
        if self.io_dtype not in COMPUTE_PRECISIONS:
            raise BuildError(f"--io-dtype {self.io_dtype!r}: choose {', '.join(COMPUTE_PRECISIONS)}")
        if self.device not in DEVICES:
            raise BuildError(f"--device {self.device!r}: choose {' or '.join(DEVICES)}")
        if not self.backends:
            raise BuildError(f"at least one --backend is needed ({', '.join(BACKENDS)})")
        for backend in self.backends:
            if backend not in BACKENDS:
                raise BuildError(f"--backend {backend!r}: choose {', '.join(BACKENDS)}")
        if len(set(self.backends)) != len(self.backends):
            raise BuildError(f"--backend lists a backend twice: {', '.join(self.backends)}")
        if self.max_batch < 1:
            raise BuildError(f"--max-batch must be at least 1, got {self.max_batch}")
        if not 0 <= self.opt_level <= 5:
            raise BuildError(f"--opt-level must be 0..5, got {self.opt_level}")
        if self.workspace is not None and self.workspace <= 0:
            raise BuildError(f"--workspace must be a positive number of bytes, got {self.workspace}")
        output = Path(self.output)
        if output.is_dir():
            raise BuildError(f"-o {output}: is a folder; give a file name such as model.bundle")
        if not output.parent.is_dir():
            raise BuildError(f"-o {output}: folder {output.parent} does not exist")
        if self.add_engines_from is not None and not Path(self.add_engines_from).is_file():
            raise BuildError(f"--add-engines-from {self.add_engines_from}: no such bundle")
        for spec in self.engine_specs():
            reason = get_backend(spec.backend).cannot_build_reason(spec.device)
            if reason:
                raise BuildError(f"--backend {spec.backend} --device {spec.device}: {reason}")

    def engine_specs(self) -> list[EngineSpec]:
        """One spec per backend, for `device` where the backend builds for it, else for the one
        device it builds for (a TensorRT plan always targets cuda)."""
        specs = []
        for name in self.backends:
            devices = get_backend(name).devices
            specs.append(
                EngineSpec(
                    backend=name,
                    device=self.device if self.device in devices else devices[0],
                    precision=self.precision,
                    io_dtype=precision_named(self.io_dtype).dtype,
                    max_batch=self.max_batch,
                    opt_level=self.opt_level,
                    workspace=self.workspace,
                    timing_cache=self.timing_cache,
                )
            )
        return specs


def _borrow_engines(path: Path, members: dict[str, bytes], entries: list[EngineEntry], sha256: str) -> list[EngineEntry]:
    """Engines of another bundle built from the same checkpoint into the same graph (e.g. a TensorRT
    plan built on another machine), added to `members`; engines this build made take precedence."""
    from .bundle import read_bundle

    other = read_bundle(path)
    if other.manifest["source"]["sha256"] != sha256:
        raise BuildError(f"--add-engines-from {path}: built from a different checkpoint (weights sha256 differs)")
    if other.members["graph.json"] != members["graph.json"]:
        raise BuildError(
            f"--add-engines-from {path}: its graph differs from this build's (precision {other.manifest['precision']}, "
            f"io {other.manifest['io_dtype']}); build both with the same --precision, --io-dtype and --fp32-layers"
        )
    have = {e.key for e in entries}
    borrowed = [e for e in other.engines if e.key not in have]
    for entry in borrowed:
        for filename, data in other.engine_files(entry.key).items():
            members[engine_member(entry.key, filename)] = data
    return borrowed


def _default_progress(message: str) -> None:
    log.info("%s", message)


def build_bundle(request: BuildRequest, progress: Callable[[str], None] = _default_progress) -> Path:
    request.validate()
    progress(f"opening {request.model}")
    checkpoint = open_checkpoint(request.model, request.revision)
    config = checkpoint.config
    family, _ = find_family(config.architecture)  # refuses unknown architectures before weights load
    total = len(checkpoint.names)
    progress(f"{config.architecture}: family {family.name}; reading {total} tensors")
    marks = {round(total * q) for q in (0.25, 0.5, 0.75)}
    checkpoint.on_read = lambda n: progress(f"read {n}/{total} tensors") if n in marks else None
    _, graph = build_graph(checkpoint, request.precision)
    policy = PrecisionPolicy(
        request.precision,
        io_dtype=precision_named(request.io_dtype).dtype,
        overrides=tuple((pattern, DType.F32) for pattern in request.fp32_layers),
    )
    typed = assign_precision(fold_batch_norm(graph), policy)
    progress(f"graph: {len(typed.nodes)} ops, precision {request.precision}")

    engines: list[BuiltEngine] = []
    for spec in request.engine_specs():
        started = time.perf_counter()
        progress(f"building the {spec.backend} engine for {spec.device} ({spec.precision})")
        engines.append(get_backend(spec.backend).build(typed, spec, progress))
        progress(f"{spec.key} built in {time.perf_counter() - started:.1f} s")

    source = checkpoint.source
    preprocess = PreprocessSpec.from_pretrained(config.pretrained)
    members: dict[str, bytes] = {
        "runtime.json": json.dumps(preprocess.to_json(), indent=1).encode(),
        "labels.json": json.dumps(
            {
                "names": list(config.label_names),
                "descriptions": dict(config.label_descriptions),
                "vocabulary_id": config.vocabulary_id,
            }
        ).encode(),
        "graph.json": typed.dumps().encode(),
        "weights.safetensors": weights_to_bytes(typed.weights),
    }
    entries = []
    for engine in engines:
        for filename, data in engine.files.items():
            members[engine_member(engine.spec.key, filename)] = data
        entries.append(engine.entry())
    if request.add_engines_from is not None:
        entries += _borrow_engines(Path(request.add_engines_from), members, entries, source.sha256)
    manifest = {
        "family": family.name,
        "architecture": config.architecture,
        "task": TASK,
        "num_classes": config.num_classes,
        "source": {"id": source.id, "revision": source.revision, "sha256": source.sha256},
        "precision": request.precision,
        "io_dtype": request.io_dtype,
        "fp32_layers": list(request.fp32_layers),
        "graph": {"ops": len(typed.nodes), "op_counts": typed.op_counts()},
        "engines": [entry.to_json() for entry in entries],
    }
    progress(f"writing {request.output}")
    return write_bundle(Path(request.output), manifest, members)
