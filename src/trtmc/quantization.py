"""What a quantized build is made from: a recipe, and calibration scales measured on images.

`QuantRecipe` says which convolutions and linear ops store their input and weight in a quantized
format (FP8 E4M3 or INT8) and how their scales are chosen; `passes/quantize.py` applies it. The
default is the recipe the GhostNet FP8 study measured on TensorRT: weights per output channel
(amax / 448 of the batch-norm-folded kernel), activations static per tensor (max |x| / 448 over the
calibration images, from a float32 run of the graph), an outlier rule (a layer whose scale is more
than 20x the median of its kind stays in the compute precision), and the layers that stay in the
compute precision because FP8 kernels for them are missing or lose accuracy: the stem (3 input
channels), depthwise and grouped convolutions, ops that see one position per image (squeeze-excite
and head convolutions on 1x1 maps, linear ops on pooled vectors) and the classifier. Selection reads
graph structure (op kind, groups, channels, spatial size), never family-specific names; name-glob
overrides decide first.

`CalibrationScales` holds max |x| at the input of every convolution and linear op (quantized or
not, so one calibration serves every recipe and format); it serializes to JSON for bundles and study
reports. `calibrate` measures it by running the float32 graph with torch, on CPU or GPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .graph import DType, Graph, OpKind
from .precision import QUANTIZED_FORMATS, Precision, precision_named

if TYPE_CHECKING:
    import torch

    from .preprocess import PreprocessSpec

# The ops a recipe can quantize; calibration measures the input of each.
QUANTIZABLE = (OpKind.CONV2D, OpKind.LINEAR)
_SCALES_VERSION = 1


@dataclass(frozen=True)
class LayerOverride:
    """Ops whose name matches `pattern` (fnmatch glob) are quantized or not, whatever the structure says."""

    pattern: str
    quantize: bool


@dataclass(frozen=True)
class QuantRecipe:
    format: str = "fp8"  # a quantized row of trtmc.precision: "fp8" (E4M3) or "int8"
    per_channel_weights: bool = True  # one weight scale per output channel (else one per tensor)
    outlier_ratio: float = 20.0  # a scale above this many times the median of its kind stays unquantized
    stem_channels: int = 3  # convolutions reading this many channels or fewer (the RGB stem) stay
    keep_grouped: bool = True  # depthwise and grouped convolutions stay
    keep_single_position: bool = True  # ops on one position per image (1x1 maps, pooled vectors) stay
    keep_classifier: bool = True  # the op that gives the logits stays
    overrides: tuple[LayerOverride, ...] = ()  # first match wins, before every rule above

    def __post_init__(self) -> None:
        precision_named(self.format, QUANTIZED_FORMATS)  # refuses anything else, listing the formats
        if not self.outlier_ratio > 1.0:
            raise ValueError(f"outlier_ratio must be above 1 (a ratio to the median), got {self.outlier_ratio}")

    @property
    def precision(self) -> Precision:
        return precision_named(self.format, QUANTIZED_FORMATS)

    def to_json(self) -> dict:
        return {**asdict(self), "overrides": [asdict(o) for o in self.overrides]}

    @classmethod
    def from_json(cls, data: dict) -> "QuantRecipe":
        overrides = tuple(LayerOverride(str(o["pattern"]), bool(o["quantize"])) for o in data.get("overrides", ()))
        return cls(**{**{k: v for k, v in data.items() if k != "overrides"}, "overrides": overrides})


FP8_RECIPE = QuantRecipe()
INT8_RECIPE = QuantRecipe(format="int8")


class CalibrationError(ValueError):
    """Calibration that cannot give usable scales; the message names the op or field and the fix."""


@dataclass(frozen=True)
class CalibrationScales:
    """max |x| at the input of each convolution and linear op (by node name) over `images`.

    The statistic is format-free: `activation_scale` divides it by the format's largest value
    (448 for FP8 E4M3, 127 for INT8).
    """

    input_amax: Mapping[str, float]
    images: tuple[str, ...] = ()  # what was calibrated on (file names), so held-out sets can exclude them
    statistic: str = field(default="max_abs", init=False)

    def __post_init__(self) -> None:
        amax = {str(k): float(v) for k, v in self.input_amax.items()}
        bad = {k: v for k, v in amax.items() if not (math.isfinite(v) and v >= 0.0)}
        if bad:
            name, value = next(iter(bad.items()))
            raise CalibrationError(
                f"calibration amax of {name!r} is {value}: every amax must be finite and >= 0 "
                "(an fp32 run that overflows cannot be calibrated; check the checkpoint and the images)"
            )
        object.__setattr__(self, "input_amax", MappingProxyType(amax))
        object.__setattr__(self, "images", tuple(str(i) for i in self.images))

    def amax(self, op: str) -> float:
        if op not in self.input_amax:
            raise CalibrationError(
                f"the calibration has no scale for op {op!r}: calibrate this graph (same architecture and "
                "checkpoint) before quantizing it"
            )
        return self.input_amax[op]

    def activation_scale(self, op: str, fmt: Precision) -> float:
        return self.amax(op) / fmt.largest

    def to_json(self) -> dict:
        return {
            "version": _SCALES_VERSION,
            "statistic": self.statistic,
            "images": list(self.images),
            "input_amax": dict(self.input_amax),
        }

    @classmethod
    def from_json(cls, data: dict) -> "CalibrationScales":
        if data.get("version") != _SCALES_VERSION or data.get("statistic") != "max_abs":
            raise CalibrationError(
                f"calibration scales of version {data.get('version')!r} / statistic {data.get('statistic')!r} "
                f"are not readable here (version {_SCALES_VERSION}, max_abs): calibrate again"
            )
        return cls(dict(data["input_amax"]), tuple(data.get("images", ())))


# ---- measuring: an fp32 run of the graph --------------------------------------------------------


def calibrate(graph: Graph, batches: Iterable["torch.Tensor"], images: Sequence[str] = ()) -> CalibrationScales:
    """max |x| at the input of every convolution and linear op of the float32 `graph` (batch norms
    folded or not: the inputs are the same), over preprocessed NCHW `batches`."""
    import torch

    from .backends.torch_lowering import GraphModule

    not_f32 = [n for n in graph.nodes if n.type.dtype is not DType.F32]
    if not_f32:
        raise CalibrationError(
            f"calibration runs the float32 graph, but {not_f32[0].kind.value} {not_f32[0].name!r} is "
            f"{not_f32[0].type.dtype.value}: calibrate before assigning a precision (or with PrecisionPolicy('fp32'))"
        )
    ops = [n for n in graph.nodes if n.kind in QUANTIZABLE]
    probed = list(dict.fromkeys(n.inputs[0] for n in ops))  # each tensor once, however many ops read it
    module = GraphModule(Graph(nodes=graph.nodes, weights=graph.weights, outputs=probed)).eval()
    amax = dict.fromkeys(probed, 0.0)
    seen = 0
    with torch.no_grad():
        for batch in batches:
            values = module(batch)
            values = values if isinstance(values, tuple) else (values,)
            for name, value in zip(probed, values):
                amax[name] = max(amax[name], float(value.abs().amax()))
            seen += 1
    if not seen:
        raise CalibrationError("calibration needs at least one batch of images")
    return CalibrationScales({n.name: amax[n.inputs[0]] for n in ops}, tuple(images))


def calibrate_images(
    graph: Graph, spec: "PreprocessSpec", paths: Sequence[str | Path], *, batch_size: int = 8
) -> CalibrationScales:
    """`calibrate` on image files, preprocessed by the bundle's contract (timm's eval transform)."""
    import torch

    from .tasks import load_image

    paths = [Path(p) for p in paths]
    if not paths:
        raise CalibrationError("calibration needs at least one image file")

    def batches() -> Iterable[Any]:
        for start in range(0, len(paths), batch_size):
            yield torch.stack([spec.from_pil(load_image(p)) for p in paths[start : start + batch_size]])

    return calibrate(graph, batches(), [p.name for p in paths])
