"""The TensorRT pieces the builder (`tensorrt`), the lowering and the engine (`tensorrt_engine`) share.

Which module is TensorRT here (`tensorrt` when it imports, else `tensorrt_rtx`, else None, so the
lowering table and `plan_unavailable_reason` still import on machines with neither), the process-wide
logger that keeps TensorRT's error messages, dtype names, the errors, and whether a plan built with
a given record can run on this machine.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Mapping

from ..precision import PRECISIONS

_log = logging.getLogger("trtmc.backends.tensorrt")

for _name in ("tensorrt", "tensorrt_rtx"):
    try:
        trt: Any = importlib.import_module(_name)
        TRT_MODULE: str | None = _name
        break
    except (ImportError, OSError):  # OSError: the wheel is there but its libraries are not
        continue
else:
    trt = None
    TRT_MODULE = None

BUILDERS = ("tensorrt", "tensorrt_rtx")
_PIP = {"tensorrt": "tensorrt", "tensorrt_rtx": "tensorrt-rtx-cu12 or tensorrt-rtx-cu13"}
# What a TensorRT-RTX plan built with the default builder config runs on ("12.x": any 12.y).
RTX_DEFAULT_TARGETS = ("8.0", "8.6", "8.9", "12.x")


class TensorRTBuildError(RuntimeError):
    """TensorRT rejected the network or the build; the message carries TensorRT's own errors."""

    def __init__(self, message: str, tensorrt_errors: list[str] = ()):  # type: ignore[assignment]
        self.tensorrt_errors = list(tensorrt_errors)
        if self.tensorrt_errors:
            message += "\n" + "\n".join(f"  TensorRT: {e}" for e in self.tensorrt_errors)
        super().__init__(message)


class TensorRTLoadError(RuntimeError):
    """A plan could not be deserialized or given an execution context here."""


_LOGGERS: dict[str, Any] = {}


def capturing_logger(module) -> Any:
    """The process-wide ILogger for `module`: it keeps every error message (exceptions quote those
    since a mark, `logger.since(mark)`) and forwards warnings to logging. One per module, because
    TensorRT may keep using the first logger it was given for every later builder and runtime."""
    if module.__name__ not in _LOGGERS:

        class CapturingLogger(module.ILogger):
            def __init__(self) -> None:
                module.ILogger.__init__(self)
                self.errors: list[str] = []

            def log(self, severity, msg) -> None:
                if severity <= module.ILogger.ERROR:  # ERROR and INTERNAL_ERROR
                    self.errors.append(msg)
                    _log.debug("TensorRT error: %s", msg)
                elif severity == module.ILogger.WARNING:
                    _log.warning("TensorRT: %s", msg)
                elif severity == module.ILogger.INFO:
                    _log.debug("TensorRT: %s", msg)

            def since(self, mark: int) -> list[str]:
                return self.errors[mark:]

        _LOGGERS[module.__name__] = CapturingLogger()
    return _LOGGERS[module.__name__]


def dtype_name(dtype) -> str:
    """trtmc's name for a TensorRT dtype (`f32`, `f16`, `bf16`; other types in lower case)."""
    return {p.tensorrt_name: p.dtype.value for p in PRECISIONS.values()}.get(dtype.name, dtype.name.lower())


def version(module) -> str:
    return str(module.__version__)


def short_version(text: str) -> str:
    return ".".join(text.split(".")[:3])


def gpu() -> tuple[tuple[int, int], str] | None:
    """(compute capability, name) of the current CUDA GPU, or None."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_capability(), torch.cuda.get_device_name()
    except Exception:  # a broken CUDA install reads as no GPU
        pass
    return None


def _runs_on(capability: tuple[int, int], targets: list[str]) -> bool:
    major, minor = capability
    return any(t == f"{major}.{minor}" or t == f"{major}.x" for t in targets)


def plan_unavailable_reason(record: Mapping[str, Any]) -> str | None:
    """None when this machine can run a plan built with `record`, else one line saying why not."""
    builder, built_by = record.get("builder"), str(record.get("builder_version", "?"))
    if builder not in BUILDERS:
        return f"this TensorRT engine names an unknown builder {builder!r}; rebuild it"
    here_gpu = gpu()
    if here_gpu is None:
        return "TensorRT plans run only on a CUDA GPU and none is available here; use the inductor engine"
    (major, minor), name = here_gpu
    targets = record.get("compute_capabilities") or (list(RTX_DEFAULT_TARGETS) if builder == "tensorrt_rtx" else [])
    if not _runs_on((major, minor), targets):
        if builder == "tensorrt_rtx":
            return (
                f"TensorRT-RTX plans cannot run on compute capability {major}.{minor} ({name}); this bundle's plan "
                f"was built by tensorrt_rtx {short_version(built_by)}; use another engine or rebuild with the full "
                f"TensorRT on this GPU"
            )
        built_for = ", ".join(targets) or "an unrecorded GPU"
        return (
            f"this TensorRT plan was built for compute capability {built_for} and cannot run on {major}.{minor} "
            f"({name}); rebuild it on this GPU or use another engine"
        )
    try:
        module = importlib.import_module(builder)
    except Exception as exc:
        return f"this plan needs the {builder} Python module (pip: {_PIP[builder]}), which does not import here: {exc}"
    here = version(module)
    if here != built_by:
        return (
            f"this plan was built by {builder} {built_by} but {builder} here is {here}; plans load only with the "
            f"version that built them: install {builder}=={built_by} or rebuild the engine"
        )
    return None
