"""What each bundle member must hold, and how the members must agree, checked when a bundle opens.

Every check raises `MemberError` naming the member and the field; `bundle.read_bundle` adds the
bundle's path and the fix. Checks run in the order a reader needs them: the manifest's member table
(before any checksum is computed), then each member's shape, then the agreements between members
(the graph's input size against runtime.json, its classes against the labels and the manifest, the
precision and io dtype against the graph's dtypes, the engines against the member files). An fp8 or
int8 bundle's manifest records its `quantization` (format, compute precision, recipe, calibration
scales, quantized ops); the graph must hold exactly those quantized ops, in that format, each reading
its input at the scale the recorded calibration gives.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .backends import EngineEntry
from .checkpoint import CROP_MODES, INTERPOLATIONS
from .graph import DType, Graph, OpKind
from .precision import COMPUTE_PRECISIONS, QUANTIZED_FORMATS, precision_named
from .preprocess import PreprocessSpec
from .schema import Fields, SchemaError

MANIFEST = "manifest.json"
RUNTIME = "runtime.json"
LABELS = "labels.json"
GRAPH = "graph.json"
WEIGHTS = "weights.safetensors"
REQUIRED = (RUNTIME, LABELS, GRAPH, WEIGHTS)
ENGINES_FOLDER = "engines/"
PRECISIONS = COMPUTE_PRECISIONS + QUANTIZED_FORMATS  # what the manifest's precision may name
IO_DTYPES = COMPUTE_PRECISIONS  # and its io_dtype
_QUANTIZABLE = (OpKind.CONV2D, OpKind.LINEAR)  # what a recipe quantizes (trtmc.quantization.QUANTIZABLE)


class MemberError(SchemaError):
    """A bundle member that does not hold what it must; `member` names it."""

    def __init__(self, member: str, message: str) -> None:
        super().__init__(message)
        self.member = member


@dataclass(frozen=True)
class Member:
    """A member's recorded size and sha256, as the manifest pins them."""

    sha256: str
    size: int


@dataclass(frozen=True)
class Contents:
    """A bundle's members, read and checked."""

    engines: tuple[EngineEntry, ...]
    preprocess: PreprocessSpec
    labels: Mapping[str, Any]
    graph: Graph


def engine_member(key: str, filename: str) -> str:
    return f"{ENGINES_FOLDER}{key}/{filename}"


def _checked(member: str, read):
    try:
        return read()
    except MemberError:
        raise
    except SchemaError as exc:
        raise MemberError(member, str(exc)) from exc


def member_table(manifest: Any) -> dict[str, Member]:
    """The manifest's `members` (name -> size and sha256), checked before any member is read."""

    def read() -> dict[str, Member]:
        members = Fields.of(manifest).obj("members", "an object (member name -> {sha256, size})")
        table = {}
        for name in members.data:
            entry = members.obj(name, "an object {sha256, size}")
            table[name] = Member(entry.text("sha256"), entry.integer("size", minimum=0))
        return table

    return _checked(MANIFEST, read)


def _manifest(manifest: Mapping[str, Any]) -> tuple[EngineEntry, ...]:
    """Check every manifest field the runtime and `trtmc inspect` read; the typed engine entries."""
    fields = Fields.of(manifest)
    for name in ("tool_version", "family", "architecture", "task"):
        fields.text(name)
    fields.integer("num_classes", minimum=1)
    source = fields.obj("source", "an object {id, revision, sha256}")
    for name in ("id", "revision", "sha256"):
        source.text(name)
    fields.choice("precision", PRECISIONS)
    fields.choice("io_dtype", IO_DTYPES)
    fields.strings("fp32_layers")
    graph = fields.obj("graph", "an object {ops, op_counts}")
    graph.integer("ops", minimum=1)
    graph.obj("op_counts")
    entries = fields.items("engines", "a list of engine entries")
    return tuple(EngineEntry.from_json(entry, f"engines[{i}]") for i, entry in enumerate(entries))


def _preprocess(data: Any) -> PreprocessSpec:
    fields = Fields.of(data)
    fields.integers("input_size", length=2, minimum=1)
    fields.choice("interpolation", INTERPOLATIONS)
    crop_pct = fields.number("crop_pct")
    if not 0 < crop_pct <= 1:
        raise fields.wrong("crop_pct", "a number in (0, 1]")
    fields.choice("crop_mode", CROP_MODES)
    fields.numbers("mean", 3)
    if min(fields.numbers("std", 3)) <= 0:
        raise fields.wrong("std", "3 positive numbers")
    return PreprocessSpec.from_json(dict(data))


def _labels(data: Any) -> Mapping[str, Any]:
    fields = Fields.of(data, what="an object {names, descriptions}")
    fields.strings("names")
    descriptions = fields.obj("descriptions", "an object (label name -> description)")
    if not all(isinstance(v, str) for v in descriptions.data.values()):
        raise fields.wrong("descriptions", "an object of strings (label name -> description)")
    if fields.has("vocabulary_id") and not isinstance(fields.value("vocabulary_id"), str):
        raise fields.wrong("vocabulary_id", "a string (\"imagenet-1k\", or \"\" when the labels are no known vocabulary)")
    return data


def _graph(data: Any, weights: Mapping[str, Any]) -> Graph:
    fields = Fields.of(data, what="an object {nodes, outputs}")
    fields.items("nodes", "a list of nodes")
    fields.strings("outputs")
    try:
        return Graph.from_json(data, dict(weights))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise SchemaError(f"not a graph this trtmc can read ({type(exc).__name__}: {exc})") from exc


def _json(members: Mapping[str, bytes], name: str) -> Any:
    try:
        return json.loads(members[name].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MemberError(name, f"not JSON ({exc})") from exc


def _weights(members: Mapping[str, bytes]) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        return load(members[WEIGHTS])
    except (SafetensorError, ValueError) as exc:
        raise MemberError(WEIGHTS, f"not a safetensors file ({exc})") from exc


def read_contents(manifest: Mapping[str, Any], members: Mapping[str, bytes]) -> Contents:
    """Check every member's shape and how the members agree; the parsed members."""
    missing = [name for name in REQUIRED if name not in members]
    if missing:
        raise MemberError(MANIFEST, f"members lists no {', '.join(missing)}")
    engines = _checked(MANIFEST, lambda: _manifest(manifest))
    preprocess = _checked(RUNTIME, lambda: _preprocess(_json(members, RUNTIME)))
    labels = _checked(LABELS, lambda: _labels(_json(members, LABELS)))
    weights = _weights(members)
    graph = _checked(GRAPH, lambda: _graph(_json(members, GRAPH), weights))
    contents = Contents(engines, preprocess, labels, graph)
    _check_graph_agreement(manifest, contents)
    _check_engine_files(engines, members)
    return contents


def _check_graph_agreement(manifest: Mapping[str, Any], contents: Contents) -> None:
    graph = contents.graph
    inputs = graph.inputs
    if len(inputs) != 1 or len(graph.outputs) != 1:
        raise MemberError(GRAPH, f"the graph has {len(inputs)} inputs and {len(graph.outputs)} outputs; a classifier has one of each")
    pixels, logits = inputs[0].type, graph.node(graph.outputs[0]).type
    if len(pixels.shape) != 4 or pixels.shape[1] != 3:
        raise MemberError(GRAPH, f"the graph's input is {list(pixels.shape)}, not RGB pixels [1, 3, H, W]")
    if tuple(pixels.shape[2:]) != tuple(contents.preprocess.input_size):
        raise MemberError(
            RUNTIME,
            f"input_size {list(contents.preprocess.input_size)} disagrees with the graph's input "
            f"{pixels.shape[2]}x{pixels.shape[3]}",
        )
    classes = logits.shape[-1]
    if manifest["num_classes"] != classes:
        raise MemberError(MANIFEST, f"num_classes {manifest['num_classes']} disagrees with the graph's {classes} output classes")
    names = contents.labels["names"]
    if names and len(names) != classes:
        raise MemberError(LABELS, f"names holds {len(names)} labels but the graph gives {classes} classes")
    io_dtype = precision_named(manifest["io_dtype"]).dtype
    if pixels.dtype is not io_dtype or logits.dtype is not io_dtype:
        raise MemberError(
            MANIFEST,
            f"io_dtype {manifest['io_dtype']} disagrees with the graph's input {pixels.dtype.value} "
            f"and output {logits.dtype.value}",
        )
    _check_precision(manifest, graph, contents.engines)


def _check_precision(manifest: Mapping[str, Any], graph: Graph, engines: tuple[EngineEntry, ...]) -> None:
    """An fp32 graph computes only in f32; a half-precision one in that half type, plus f32 where
    the policy keeps ops in fp32, and never in the other half type. (Only `--fp32-layers` can keep
    every op of a half-precision build in f32.) An fp8/int8 graph computes in its recorded compute
    precision and holds tensors of its format, between quantize and dequantize ops."""
    precision = manifest["precision"]
    if precision in QUANTIZED_FORMATS:
        compute = precision_named(_check_quantization(manifest, graph)).dtype
        storage = {precision_named(precision, QUANTIZED_FORMATS).dtype}
    elif "quantization" in manifest:
        raise MemberError(MANIFEST, f"quantization is recorded, but precision {precision} is not a quantized format")
    else:
        compute, storage = precision_named(precision).dtype, set()
    found = {n.type.dtype for n in graph.nodes}
    all_kept_in_fp32 = bool(manifest["fp32_layers"]) and found - storage == {DType.F32}
    if not found <= {compute, DType.F32} | storage or (compute not in found and not all_kept_in_fp32) or not storage <= found:
        have = ", ".join(sorted(d.value for d in found))
        raise MemberError(MANIFEST, f"precision {precision} disagrees with graph.json, whose ops compute in {have}")
    for i, entry in enumerate(engines):
        if entry.precision != precision:
            raise MemberError(MANIFEST, f"engines[{i}].precision {entry.precision} disagrees with the bundle's precision {precision}")


def _check_quantization(manifest: Mapping[str, Any], graph: Graph) -> str:
    """The `quantization` record of an fp8/int8 manifest, checked against the graph; its compute precision."""
    record = _checked(MANIFEST, lambda: _quantization(manifest))
    fmt = precision_named(manifest["precision"], QUANTIZED_FORMATS)
    for node in graph.nodes:
        if node.kind in (OpKind.QUANTIZE, OpKind.DEQUANTIZE) and node.attrs.format is not fmt.dtype:
            raise MemberError(GRAPH, f"{node.kind.value} {node.name!r} stores {node.attrs.format.value}, not the bundle's {fmt.name}")
    # A quantized convolution or linear op reads its input through a dequantize (passes/quantize.py).
    ops = [n for n in graph.nodes if n.kind in _QUANTIZABLE and graph.node(n.inputs[0]).kind is OpKind.DEQUANTIZE]
    if tuple(n.name for n in ops) != record.quantized_ops:
        raise MemberError(MANIFEST, f"quantization.quantized_ops does not list the {len(ops)} quantized ops of graph.json")
    for op in ops:
        stored = float(graph.weights[graph.node(op.inputs[0]).attrs.scale].reshape(-1)[0])
        recorded = record.input_amax[op.name] / fmt.largest if op.name in record.input_amax else None
        if recorded is None or not math.isclose(stored, recorded, rel_tol=1e-6):
            raise MemberError(
                MANIFEST,
                f"quantization.calibration gives {op.name!r} the input scale {recorded}, but graph.json holds {stored}: "
                "the recorded calibration is not the one the graph was quantized with",
            )
    return record.compute_precision


@dataclass(frozen=True)
class _Quantization:
    compute_precision: str
    input_amax: Mapping[str, float]  # the calibration: max |x| at each op's input
    quantized_ops: tuple[str, ...]


def _quantization(manifest: Mapping[str, Any]) -> _Quantization:
    """The fields the reader checks. (trtmc.quantization parses recipes and scales in full, but it
    reaches the task's image loader, which imports the runtime, which imports this module.)"""
    fields = Fields.of(manifest).obj("quantization", "an object {format, compute_precision, recipe, calibration, quantized_ops}")
    fmt = fields.choice("format", QUANTIZED_FORMATS)
    if fmt != manifest["precision"]:
        raise fields.wrong("format", f"the bundle's precision {manifest['precision']!r}")
    compute = fields.choice("compute_precision", COMPUTE_PRECISIONS)
    recipe = fields.obj("recipe", "an object (trtmc.quantization.QuantRecipe)")
    if recipe.value("format") != fmt:
        raise fields.wrong("recipe", f"a recipe for {fmt}")
    amax = fields.obj("calibration", "an object (trtmc.quantization.CalibrationScales)").obj("input_amax")
    return _Quantization(compute, {op: amax.number(op) for op in amax.data}, fields.strings("quantized_ops"))


def _check_engine_files(engines: tuple[EngineEntry, ...], members: Mapping[str, bytes]) -> None:
    seen: set[str] = set()
    listed: set[str] = set()
    for i, entry in enumerate(engines):
        if entry.key in seen:
            raise MemberError(MANIFEST, f"engines[{i}].key {entry.key!r} appears twice")
        seen.add(entry.key)
        for filename in entry.files:
            name = engine_member(entry.key, filename)
            if name not in members:
                raise MemberError(MANIFEST, f"engines[{i}].files lists {filename!r} but the bundle has no member {name}")
            listed.add(name)
    stray = sorted(n for n in members if n.startswith(ENGINES_FOLDER) and n not in listed)
    if stray:
        raise MemberError(MANIFEST, f"member {stray[0]} belongs to no engine in engines")
