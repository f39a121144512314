"""The one precision table: every numeric format trtmc knows, and what it is called everywhere.

A `Precision` row names a format the way users write it (`fp16`), the graph's `DType` for it, and its
torch, TensorRT and numpy spellings; backends, the CLI, the bench and the build read them from here
instead of keeping their own maps. torch and TensorRT types are resolved only when asked for, so
importing this module (as `trtmc --help` does) stays cheap.

A row is either a compute precision (what `--precision` and `PrecisionPolicy` accept: every op
computes in it) or a quantized storage format (`quantized=True`: FP8 E4M3 and INT8): a value in that
format means nothing without its scale, so only the quantization pass (`passes/quantize.py`), driven
by its recipe and calibration scales, puts such tensors into a graph, between quantize and
dequantize ops. A quantized row also says how values map onto its grid: a scale maps the largest
magnitude to `largest` (448 for E4M3, 127 for INT8), and `to_grid` is the one rounding every
quantizer uses (the torch lowering's quantize, the pass's offline weight quantization): saturate to
`saturation`, round to nearest even, store. Adding a format is one row here (and a `DType` member).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping


class DType(str, Enum):
    """The dtype of a graph tensor (its value is how `print(graph)` and graph.json spell it)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F8E4M3 = "f8e4m3"
    I8 = "i8"


class UnknownPrecision(ValueError):
    """A precision name that is not in the table; the message lists the ones that are."""


@dataclass(frozen=True)
class Precision:
    name: str  # as users write it: --precision, --io-dtype, bench YAML, the bundle manifest
    dtype: DType
    torch_name: str  # torch.<torch_name>
    tensorrt_name: str  # member of TensorRT's DataType (engines report their I/O types by this name)
    # numpy.<numpy_name>; None where numpy has no such type: then host bytes come from torch's
    # rounding of the float32 value, viewed as an unsigned/signed integer of the same width.
    numpy_name: str | None
    quantized: bool = False  # a storage format that needs scales (FP8, INT8), never a compute precision
    # Quantized rows only: a scale is amax / largest; quantizing saturates to `saturation` (TensorRT's
    # ranges: E4M3 is symmetric, INT8 keeps -128, which a symmetric scale reaches only past amax).
    largest: float | None = None
    saturation: tuple[float, float] | None = None

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.torch_name)

    def tensorrt_dtype(self, trt: Any) -> Any:
        """This format as `trt.DataType`, for the TensorRT module in use (tensorrt or tensorrt_rtx)."""
        return getattr(trt.DataType, self.tensorrt_name)

    def host_array(self, value: Any) -> Any:
        """The bytes of float32 `value` in this format, as a contiguous numpy array (round to nearest
        even; a quantized format takes values already divided by their scale, through `to_grid`);
        formats numpy lacks come back as integers of the same width holding those bytes."""
        import numpy as np

        value = np.ascontiguousarray(value, dtype=np.float32)
        if self.numpy_name is not None and not self.quantized:
            return value.astype(getattr(np, self.numpy_name))
        import torch

        tensor = torch.from_numpy(value)
        converted = self.to_grid(tensor) if self.quantized else tensor.to(self.torch_dtype)
        if self.numpy_name is not None:
            return converted.numpy().copy()
        same_width = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[converted.element_size()]
        return converted.view(same_width).numpy().copy()

    def to_grid(self, scaled: Any) -> Any:
        """Float tensor `scaled` (values already divided by their scale) stored in this quantized
        format: saturated, rounded to nearest even, as a torch tensor of `torch_dtype`. Traceable by
        torch.fx, so the torch lowering's quantize is this call."""
        if not self.quantized:
            raise ValueError(f"{self.name} is a compute precision, not a quantized format: it has no grid")
        low, high = self.saturation
        saturated = scaled.clamp(low, high)
        if not self.torch_dtype.is_floating_point:
            saturated = saturated.round()  # a float8 cast rounds to nearest even itself; an integer cast truncates
        return saturated.to(self.torch_dtype)


_ROWS = (
    Precision("fp32", DType.F32, "float32", "FLOAT", "float32"),
    Precision("fp16", DType.F16, "float16", "HALF", "float16"),
    Precision("bf16", DType.BF16, "bfloat16", "BF16", None),
    Precision("fp8", DType.F8E4M3, "float8_e4m3fn", "FP8", None, quantized=True, largest=448.0, saturation=(-448.0, 448.0)),
    Precision("int8", DType.I8, "int8", "INT8", "int8", quantized=True, largest=127.0, saturation=(-128.0, 127.0)),
)

PRECISIONS: Mapping[str, Precision] = MappingProxyType({p.name: p for p in _ROWS})
_BY_DTYPE: Mapping[DType, Precision] = MappingProxyType({p.dtype: p for p in _ROWS})

# What --precision, --io-dtype, bench entries and families accept: every row that is not a quantized format.
COMPUTE_PRECISIONS: tuple[str, ...] = tuple(p.name for p in _ROWS if not p.quantized)
# The formats a quantization recipe may store tensors in.
QUANTIZED_FORMATS: tuple[str, ...] = tuple(p.name for p in _ROWS if p.quantized)


def precision_named(name: str, choices: tuple[str, ...] = COMPUTE_PRECISIONS) -> Precision:
    """The row called `name`, which must be one of `choices` (default: the compute precisions)."""
    if name not in choices:
        raise UnknownPrecision(f"precision {name!r} is not one of {', '.join(choices)}")
    return PRECISIONS[name]


def precision_of(dtype: DType) -> Precision:
    """The row whose graph dtype is `dtype` (every DType has exactly one)."""
    return _BY_DTYPE[DType(dtype)]
