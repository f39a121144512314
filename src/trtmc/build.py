"""One build: checkpoint -> family -> graph -> passes -> engines -> bundle.

`BuildRequest` is validated in full before any weight is read; the bundle is written atomically
at the end, so a failed build leaves no output file.

An fp8 or int8 build computes in fp16 with the quantize pass applied: the recipe is
trtmc.quantization's for that format, the activation scales are calibrated on the request's images
(a float32 run of the graph), and the manifest records both (`Quantization.to_json`). `build_bundle`
makes one only for a family whose committed study decision says it pays
(`families.quantized_build_refusal`); `trtmc study`, which makes those decisions, builds its variants
through `prepare_graph` and `write_build` instead, calibrating once for all of them.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from .backends import BACKENDS, DEFAULT_BACKEND, DEVICES, BuiltEngine, EngineEntry, EngineSpec, get_backend
from .bundle import engine_member, weights_to_bytes, write_bundle
from .checkpoint import Checkpoint, open_checkpoint
from .families import STUDY_DECISIONS, StudyDecision, build_graph, find_family, quantized_build_refusal
from .graph import DType, Graph
from .passes.fold_batch_norm import fold_batch_norm
from .passes.precision import PrecisionPolicy, assign_precision
from .passes.quantize import quantize
from .precision import COMPUTE_PRECISIONS, QUANTIZED_FORMATS, precision_named
from .preprocess import PreprocessSpec
from .quantization import FP8_RECIPE, INT8_RECIPE, QUANTIZABLE, CalibrationScales, QuantRecipe, calibrate_images

log = logging.getLogger(__name__)

TASK = "image_to_class_scores"
BUILD_PRECISIONS = COMPUTE_PRECISIONS + QUANTIZED_FORMATS  # what --precision accepts
# fp8 and int8 builds compute in this precision between their quantize and dequantize ops (the
# recipe the GhostNet FP8 study measured: fp16 dequantize).
QUANTIZED_COMPUTE = "fp16"
RECIPES: Mapping[str, QuantRecipe] = MappingProxyType({"fp8": FP8_RECIPE, "int8": INT8_RECIPE})


def computed_in(precision: str) -> str:
    """What a build of `precision` computes in: itself, or fp16 around the quantized ops of fp8/int8."""
    return QUANTIZED_COMPUTE if precision in QUANTIZED_FORMATS else precision


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
    calibration: tuple[Path, ...] = ()  # the images an fp8/int8 build calibrates its activation scales on

    @property
    def quantized(self) -> bool:
        return self.precision in QUANTIZED_FORMATS

    @property
    def compute_precision(self) -> str:
        return computed_in(self.precision)

    def validate(self) -> None:
        if self.precision not in BUILD_PRECISIONS:
            raise BuildError(f"--precision {self.precision!r}: choose {', '.join(BUILD_PRECISIONS)}")
        self._validate_calibration()
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

    def _validate_calibration(self) -> None:
        if self.calibration and not self.quantized:
            raise BuildError(
                f"--calibration calibrates {' and '.join(QUANTIZED_FORMATS)} builds; --precision {self.precision} "
                "does not use it: leave it out"
            )
        missing = [str(p) for p in self.calibration if not Path(p).is_file()]
        if missing:
            raise BuildError(f"--calibration: no such image file {missing[0]}")

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
            f"io {other.manifest['io_dtype']}); build both with the same --precision, --io-dtype, --fp32-layers and --calibration images"
        )
    have = {e.key for e in entries}
    borrowed = [e for e in other.engines if e.key not in have]
    for entry in borrowed:
        for filename, data in other.engine_files(entry.key).items():
            members[engine_member(entry.key, filename)] = data
    return borrowed


def _default_progress(message: str) -> None:
    log.info("%s", message)


@dataclass(frozen=True)
class Quantization:
    """What makes a build fp8 or int8: the recipe and the scales calibrated on the checkpoint's graph."""

    recipe: QuantRecipe
    scales: CalibrationScales

    @property
    def precision(self) -> str:
        return self.recipe.format

    def to_json(self, graph: Graph) -> dict:
        """The manifest's `quantization` record for the quantized `graph` it was applied to."""
        return {
            "format": self.precision,
            "compute_precision": QUANTIZED_COMPUTE,
            "recipe": self.recipe.to_json(),
            "calibration": self.scales.to_json(),
            "quantized_ops": quantized_ops(graph),
        }


def quantized_ops(graph: Graph) -> list[str]:
    """The convolutions and linear ops of a quantized `graph` that read a quantized weight (the pass
    clears their `weight`), in graph order."""
    return [n.name for n in graph.nodes if n.kind in QUANTIZABLE and n.attrs.weight is None]


@dataclass(frozen=True)
class PreparedGraph:
    """A checkpoint's float32 graph with its batch norms folded: what every precision starts from."""

    checkpoint: Checkpoint
    family: str
    graph: Graph
    preprocess: PreprocessSpec


def prepare_graph(checkpoint: Checkpoint, compute_precision: str) -> PreparedGraph:
    """The family's graph of `checkpoint` (refused before any weight is read when the family does not
    compute in `compute_precision`), batch norms folded."""
    family, graph = build_graph(checkpoint, compute_precision)
    preprocess = PreprocessSpec.from_pretrained(checkpoint.config.pretrained)
    return PreparedGraph(checkpoint, family.name, fold_batch_norm(graph), preprocess)


def calibrated(prepared: PreparedGraph, precision: str, images: Sequence[Path]) -> Quantization:
    """`precision`'s recipe with scales calibrated on `images` (preprocessed by the bundle's contract)."""
    return Quantization(RECIPES[precision], calibrate_images(prepared.graph, prepared.preprocess, images))


def build_bundle(
    request: BuildRequest,
    progress: Callable[[str], None] = _default_progress,
    *,
    decisions: tuple[StudyDecision, ...] = STUDY_DECISIONS,
) -> Path:
    """Build and write the bundle `request` asks for; an fp8/int8 request only where `decisions` (the
    committed study decisions) say that precision pays for the checkpoint's family."""
    request.validate()
    progress(f"opening {request.model}")
    checkpoint = open_checkpoint(request.model, request.revision)
    config = checkpoint.config
    family, _ = find_family(config.architecture)  # refuses unknown architectures before weights load
    if request.quantized:
        refusal = quantized_build_refusal(config.architecture, family.name, request.precision, decisions)
        if refusal:
            raise BuildError(refusal)
        if not request.calibration:
            raise BuildError(
                f"--precision {request.precision} needs --calibration DIR: a folder of images like those the model "
                "will see (a few hundred), to calibrate the activation scales on"
            )
    total = len(checkpoint.names)
    progress(f"{config.architecture}: family {family.name}; reading {total} tensors")
    marks = {round(total * q) for q in (0.25, 0.5, 0.75)}
    checkpoint.on_read = lambda n: progress(f"read {n}/{total} tensors") if n in marks else None
    prepared = prepare_graph(checkpoint, request.compute_precision)
    quantization = None
    if request.quantized:
        progress(f"calibrating {request.precision} activation scales on {len(request.calibration)} images")
        quantization = calibrated(prepared, request.precision, request.calibration)
    return write_build(request, prepared, quantization, progress)


def write_build(
    request: BuildRequest,
    prepared: PreparedGraph,
    quantization: Quantization | None = None,
    progress: Callable[[str], None] = _default_progress,
) -> Path:
    """Assign the request's precision to `prepared`'s graph (and quantize it: fp8/int8), build the
    engines and write the bundle. No study decision is consulted: `build_bundle` does that."""
    request.validate()
    wanted = request.precision if request.quantized else None
    given = quantization.precision if quantization is not None else None
    if given != wanted:
        raise BuildError(f"a {request.precision} build takes {wanted or 'no'} quantization, not {given or 'none'}")
    policy = PrecisionPolicy(
        request.compute_precision,
        io_dtype=precision_named(request.io_dtype).dtype,
        overrides=tuple((pattern, DType.F32) for pattern in request.fp32_layers),
    )
    typed = assign_precision(prepared.graph, policy)
    if quantization is not None:
        typed = quantize(typed, quantization.recipe, quantization.scales)
        if not quantized_ops(typed):
            raise BuildError(
                f"the {request.precision} recipe quantizes none of the convolution and linear ops of "
                f"{prepared.checkpoint.config.architecture} (see `choose_layers`); build --precision {QUANTIZED_COMPUTE}"
            )
    progress(f"graph: {len(typed.nodes)} ops, precision {request.precision}")

    engines: list[BuiltEngine] = []
    for spec in request.engine_specs():
        started = time.perf_counter()
        progress(f"building the {spec.backend} engine for {spec.device} ({spec.precision})")
        engines.append(get_backend(spec.backend).build(typed, spec, progress))
        progress(f"{spec.key} built in {time.perf_counter() - started:.1f} s")

    config = prepared.checkpoint.config
    source = prepared.checkpoint.source
    members: dict[str, bytes] = {
        "runtime.json": json.dumps(prepared.preprocess.to_json(), indent=1).encode(),
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
        "family": prepared.family,
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
    if quantization is not None:
        manifest["quantization"] = quantization.to_json(typed)
    progress(f"writing {request.output}")
    return write_bundle(Path(request.output), manifest, members)
