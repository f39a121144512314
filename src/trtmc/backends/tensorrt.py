"""The TensorRT backend: a precision-assigned graph becomes a strongly typed network and a plan.

Uses the `tensorrt` module when it imports, else `tensorrt_rtx` (see `tensorrt_lowering`). Where the
two differ:

- TensorRT-RTX builds on a CPU-only machine and targets compute capabilities chosen in the builder
  config (`set_compute_capability`; by default 8.0, 8.6, 8.9 and 12.x, never 9.0); the full TensorRT
  builds on a GPU, for that GPU.
- Both take a strongly typed network here, so neither gets precision flags; TensorRT-RTX has no
  FP16/BF16/INT8 builder flags and no INT8/FP8 calibrators at all (FP8 comes as explicit Q/DQ).
- TensorRT-RTX rejects some full-TensorRT getters (`hardware_compatibility_level` logs an internal
  error), so the builder config is only ever written, never read back.
- TensorRT-RTX keeps timing-cache calls as no-ops (since 1.2), so `EngineSpec.timing_cache` only
  matters with the full TensorRT.
- At run time TensorRT-RTX compiles its kernels just in time and captures CUDA graphs itself
  (`IRuntimeConfig.cuda_graph_strategy`); with the full TensorRT we capture the execute call with torch.

Backend interface: `cannot_build_reason`, `build`, `unavailable_reason`, `load` (see
`backends/__init__.py`); tests and `trtmc inspect` also use `define_network` and
`network_precisions`. What the builder and the engine (`tensorrt_engine`) share lives in
`tensorrt_common`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import update_file_atomically
from ..graph import DType, Graph, OpKind
from . import Batching, BuiltEngine, Engine, EngineEntry, EngineSpec, LoadOptions, Progress
from .tensorrt_common import (
    RTX_DEFAULT_TARGETS,
    TRT_MODULE,
    TensorRTBuildError,
    TensorRTLoadError,
    capturing_logger,
    dtype_name,
    gpu,
    plan_unavailable_reason,
    trt,
    version,
)
from .tensorrt_engine import TensorRTEngine
from .tensorrt_lowering import INPUT_NAME, OUTPUT_NAME, TRT_LOWERINGS, Lowerer, UnsupportedNode, trt_dtype

_log = logging.getLogger(__name__)

name = "tensorrt"
devices = ("cuda",)  # plans run on NVIDIA GPUs; TensorRT-RTX builds them on any machine

PLAN_FILE = "engine.plan"


# ---- progress: TensorRT calls back into Python -----------------------------------------------------

_MONITORS: dict[str, type] = {}


def _progress_monitor(module, progress: Progress) -> Any:
    """Reports the builder's top-level phases through `progress`."""
    key = module.__name__
    if key not in _MONITORS:

        class Monitor(module.IProgressMonitor):
            def __init__(self, progress: Progress) -> None:
                module.IProgressMonitor.__init__(self)
                self.progress = progress

            def phase_start(self, phase_name, parent_phase, num_steps) -> None:
                if parent_phase is None:
                    try:
                        self.progress(f"TensorRT: {phase_name}")
                    except Exception:  # a callback must not raise into TensorRT
                        _log.exception("progress callback failed")

            def step_complete(self, phase_name, step) -> bool:
                return True

            def phase_finish(self, phase_name) -> None:
                pass

        _MONITORS[key] = Monitor
    return _MONITORS[key](progress)


def cannot_build_reason(device: str) -> str | None:
    if trt is None:
        return (
            "neither the tensorrt nor the tensorrt_rtx Python module imports here; "
            "`pip install tensorrt-rtx-cu13` builds plans on any machine, CPU-only included"
        )
    return None


def _require_builder() -> None:
    reason = cannot_build_reason("cuda")
    if reason:
        raise TensorRTBuildError(reason)


# ---- the network definition ----------------------------------------------------------------------


@dataclass
class NetworkDefinition:
    """A strongly typed network, ready for the builder; `keepalive` holds the arrays it points into."""

    builder: Any
    network: Any
    logger: Any
    errors_from: int = 0  # where this network's messages start in logger.errors
    keepalive: list = field(default_factory=list)
    input_shape: tuple[int, ...] = ()  # (C, H, W): the batch is dimension 0, free at run time
    io_dtype: DType = DType.F32

    def layers(self) -> list[dict]:
        return describe_layers(self.network)

    def precisions(self) -> dict[str, dict[str, int]]:
        return network_precisions(self.network)


def define_network(graph: Graph, spec: EngineSpec) -> NetworkDefinition:
    """Lower every node of a precision-assigned graph; raises TensorRTBuildError naming the node
    TensorRT rejects, with TensorRT's messages."""
    _require_builder()
    graph.verify()
    missing = sorted({n.kind.value for n in graph.nodes if n.kind not in TRT_LOWERINGS})
    if missing:
        raise UnsupportedNode(f"no TensorRT lowering for {', '.join(missing)}")
    inputs = graph.inputs
    if len(inputs) != 1 or len(graph.outputs) != 1:
        raise UnsupportedNode(
            f"a TensorRT engine takes one input and gives one output; the graph has {len(inputs)} inputs "
            f"and {len(graph.outputs)} outputs"
        )
    for role, node in (("input", inputs[0]), ("output", graph.node(graph.outputs[0]))):
        if node.type.dtype is not spec.io_dtype:
            raise ValueError(
                f"the graph's {role} {node.name!r} is {node.type.dtype.value} but the engine spec asks for "
                f"io_dtype {spec.io_dtype.value}; assign precision with the same io_dtype"
            )

    logger = capturing_logger(trt)
    start = len(logger.errors)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    lowerer = Lowerer(network, graph)
    tensors: dict[str, Any] = {}
    for node in graph.nodes:
        lowerer.node = node
        seen = len(logger.errors)
        where = f"{node.kind.value} node {node.name!r} (from {node.source!r}, {node.type})"
        try:
            out = TRT_LOWERINGS[node.kind](lowerer, node, [tensors[i] for i in node.inputs])
            # Reading the shape runs TensorRT's shape inference now, so its complaint names this node.
            shape, dtype = tuple(out.shape), out.dtype
        except UnsupportedNode as exc:
            raise TensorRTBuildError(f"cannot lower {where}: {exc}", logger.since(seen)) from exc
        except (RuntimeError, TypeError, ValueError, AttributeError) as exc:
            raise TensorRTBuildError(f"TensorRT rejected {where}: {exc}", logger.since(seen)) from exc
        if len(logger.errors) > seen:
            raise TensorRTBuildError(f"TensorRT rejected {where}", logger.since(seen))
        if shape[1:] != node.type.shape[1:] or dtype != trt_dtype(node.type.dtype):
            raise TensorRTBuildError(
                f"the TensorRT lowering of {where} gives {dtype_name(dtype)}{list(shape)}: "
                "it does not mean what the graph says"
            )
        if node.kind is not OpKind.INPUT and node.name not in (INPUT_NAME, OUTPUT_NAME):
            out.name = node.name
        tensors[node.name] = out

    output = tensors[graph.outputs[0]]
    output.name = OUTPUT_NAME
    network.mark_output(output)
    if len(logger.errors) > start:
        raise TensorRTBuildError("TensorRT rejected the network's output", logger.since(start))
    return NetworkDefinition(
        builder=builder,
        network=network,
        logger=logger,
        errors_from=start,
        keepalive=lowerer.keepalive,
        input_shape=tuple(inputs[0].type.shape[1:]),
        io_dtype=spec.io_dtype,
    )


def describe_layers(network) -> list[dict]:
    """Per layer of a network definition: name, type, input/output dtypes, and the kernel dtype of
    convolutions (their weights are not tensors, so they are read from the layer)."""
    layers = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        tensors_in = [layer.get_input(j) for j in range(layer.num_inputs)]
        info = {
            "name": layer.name,
            "type": layer.type.name,
            "inputs": [dtype_name(t.dtype) for t in tensors_in if t is not None],
            "outputs": [dtype_name(layer.get_output(j).dtype) for j in range(layer.num_outputs)],
        }
        if layer.type == trt.LayerType.CONVOLUTION:
            layer.__class__ = trt.IConvolutionLayer  # get_layer returns the base class
            info["weights"] = dtype_name(layer.kernel.dtype)
        layers.append(info)
    return layers


def _precision(info: dict) -> str:
    if info["type"] == "CAST":
        return f"{info['inputs'][0]}->{info['outputs'][0]}"
    if info["type"] == "SHAPE":  # reads only dimensions: its precision is that of the shape it gives
        return info["outputs"][0]
    return (info["inputs"] or info["outputs"])[0]


def network_precisions(network) -> dict[str, dict[str, int]]:
    """Layer counts per kind and precision, e.g. {"CONVOLUTION": {"bf16": 53}, "CAST": {"f32->bf16": 1}}.

    A layer's precision is the dtype it reads (its first input; a constant's output); a cast shows
    both ends, and a shape layer the integer type it gives.
    """
    counts: dict[str, Counter] = {}
    for info in describe_layers(network):
        counts.setdefault(info["type"], Counter())[_precision(info)] += 1
    return {kind: dict(sorted(c.items())) for kind, c in sorted(counts.items())}


# ---- the timing cache: one file shared by concurrent builds --------------------------------------


class _TimingCache:
    """Loads the cache file into the builder config; `save` merges the updated cache back into the
    file (entries another build saved meanwhile are kept)."""

    def __init__(self, config, path: Path) -> None:
        self.config, self.path = config, Path(path)
        data = self.path.read_bytes() if self.path.exists() else b""
        self.cache = self._parse(data)
        self.loaded = bool(data) and self.cache is not None
        if self.cache is None or not config.set_timing_cache(self.cache, False):
            _log.warning("timing cache %s does not fit this builder; starting an empty one", self.path)
            self.cache, self.loaded = self._parse(b""), False
            config.set_timing_cache(self.cache, False)

    def _parse(self, data: bytes):
        try:
            return self.config.create_timing_cache(data)
        except Exception as exc:  # a truncated or foreign file: rebuild the cache rather than fail the build
            _log.warning("ignoring unreadable timing cache %s: %s", self.path, exc)
            return None

    def _merged(self, current: bytes | None) -> bytes:
        theirs = self._parse(current) if current else None
        if theirs is not None:
            self.cache.combine(theirs, False)
        return bytes(memoryview(self.cache.serialize()))

    def save(self) -> None:
        update_file_atomically(self.path, self._merged)


# ---- build -----------------------------------------------------------------------------------------


def _quiet(message: str) -> None:
    pass


def build(graph: Graph, spec: EngineSpec, progress: Progress | None = None) -> BuiltEngine:
    """Build a plan for `graph` (precision already assigned) as `spec` asks; see the module docstring."""
    progress = progress or _quiet
    if spec.backend != name:
        raise ValueError(f"the tensorrt backend cannot build a {spec.backend!r} engine")
    if spec.device != "cuda":
        raise ValueError(f"TensorRT engines run on cuda, not {spec.device!r}")
    if not 0 <= spec.opt_level <= 5:
        raise ValueError(f"TensorRT optimization level must be 0..5, got {spec.opt_level}")
    if spec.max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {spec.max_batch}")
    definition = define_network(graph, spec)
    builder, network = definition.builder, definition.network
    progress(f"TensorRT network: {network.num_layers} layers ({TRT_MODULE} {version(trt)})")

    config = builder.create_builder_config()
    config.builder_optimization_level = spec.opt_level
    if spec.workspace:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(spec.workspace))
    shapes = {
        "min": (1, *definition.input_shape),
        "opt": (spec.max_batch, *definition.input_shape),
        "max": (spec.max_batch, *definition.input_shape),
    }
    profile = builder.create_optimization_profile()
    profile.set_shape(INPUT_NAME, shapes["min"], shapes["opt"], shapes["max"])
    config.add_optimization_profile(profile)
    monitor = _progress_monitor(trt, progress)
    config.progress_monitor = monitor
    # TensorRT-RTX (from 1.2) keeps timing-cache calls as no-ops, and reading a cache file back on a
    # CPU-only machine logs CUDA errors, so only the full TensorRT gets one.
    use_cache = spec.timing_cache is not None and TRT_MODULE == "tensorrt"
    cache = _TimingCache(config, spec.timing_cache) if use_cache else None

    started = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - started
    if plan is None:
        errors = definition.logger.since(definition.errors_from)
        raise TensorRTBuildError(f"{TRT_MODULE} {version(trt)} could not build the plan for {spec.key}", errors)
    data = bytes(memoryview(plan))
    if cache is not None:
        cache.save()
    progress(f"TensorRT plan: {len(data) / 1e6:.1f} MB in {seconds:.1f} s")

    record: dict[str, Any] = {
        "builder": TRT_MODULE,
        "builder_version": version(trt),
        "options": {
            "opt_level": spec.opt_level,
            "workspace": spec.workspace,
            "max_batch": spec.max_batch,
            "io_dtype": spec.io_dtype.value,
            "profile": {k: list(v) for k, v in shapes.items()},
        },
        "compute_capabilities": _build_targets(),
        "network_layers": network.num_layers,
        "layer_precisions": definition.precisions(),
        "plan_bytes": len(data),
        "build_seconds": round(seconds, 3),
    }
    if cache is not None:
        record["timing_cache"] = "reused" if cache.loaded else "created"
    elif spec.timing_cache is not None:
        record["timing_cache"] = f"not used: timing caches are no-ops in {TRT_MODULE}"
    engine_layers = _engine_layer_count(data, record)
    if engine_layers is not None:
        record["engine_layers"] = engine_layers
    del definition, monitor  # the network's weights may go only now that the plan exists
    return BuiltEngine(spec=spec, files={PLAN_FILE: data}, batching=Batching.up_to(spec.max_batch), record=record)


def _build_targets() -> list[str]:
    if TRT_MODULE == "tensorrt_rtx":
        return list(RTX_DEFAULT_TARGETS)  # the builder config keeps TensorRT-RTX's portable default
    here = gpu()
    return [f"{here[0][0]}.{here[0][1]}"] if here else []


def _engine_layer_count(plan: bytes, record: dict) -> int | None:
    """Layers of the built engine, where this machine can deserialize it (a supported GPU)."""
    if plan_unavailable_reason(record) is not None:
        return None
    try:
        runtime = trt.Runtime(capturing_logger(trt))
        engine = runtime.deserialize_cuda_engine(plan)
        info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
        return len(info.get("Layers", []))
    except Exception as exc:
        _log.info("could not inspect the built engine: %s", exc)
        return None


# ---- can it run here, and load ------------------------------------------------------------------------


def unavailable_reason(entry: EngineEntry) -> str | None:
    """None when this machine can run the entry's plan, else one line saying why not."""
    return plan_unavailable_reason(entry.record)


def load(
    files: Mapping[str, bytes], entry: EngineEntry, graph: Graph, options: LoadOptions = LoadOptions()
) -> Engine:
    # `options` is ignored: a plan is compiled code, loaded as it is, so a quick start changes nothing.
    if PLAN_FILE not in files:
        raise TensorRTLoadError(f"the TensorRT engine has no {PLAN_FILE}; its members are {sorted(files)}")
    return TensorRTEngine(files[PLAN_FILE], entry, graph)
