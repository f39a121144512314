"""The inductor backend: the graph lowered to torch FX and compiled by PyTorch Inductor.

CPU: an AOTInductor package (`model.pt2`, weights inside), exported with a dynamic batch
dimension and loaded without compiling. CUDA: loading AOTInductor packages segfaults in the H200
image's torch 2.11, so the CUDA engine is `torch.compile` of the FX graph with Inductor's cache
artifacts saved at build time (`inductor-cache.bin`); loading replays them, so a fresh process
compiles warm. The runtime replays the compiled graph in a CUDA graph per batch size with static
input and output buffers.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..graph import Graph
from . import BuiltEngine, EngineSpec, Progress
from .torch_lowering import to_fx

log = logging.getLogger(__name__)

CPU_PACKAGE = "model.pt2"
CUDA_CACHE = "inductor-cache.bin"


def _versions() -> dict[str, str]:
    versions = {"torch": torch.__version__}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return versions


def compiled_batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes the CUDA engine is compiled and graph-captured for."""
    return sorted({1, max_batch})


def cpu_batch_limit(max_batch: int) -> int:
    """The CPU package takes any batch up to this (it is exported with a symbolic batch)."""
    return max(max_batch, 256)


def _example(graph: Graph, batch: int, device: str) -> torch.Tensor:
    from .torch_lowering import TORCH_DTYPES

    node = graph.inputs[0]
    shape = (batch,) + tuple(node.type.shape[1:])
    x = torch.randn(shape, device=device).to(TORCH_DTYPES[node.type.dtype])
    return _cuda_layout(x) if device == "cuda" else x


def _cuda_layout(x: torch.Tensor) -> torch.Tensor:
    """Channels-last end to end on CUDA: cuDNN then needs no layout conversions around convolutions
    (measured on the H200, ghostnet_100 fp16 batch 128: 2.82 ms NCHW, 2.72 ms channels-last)."""
    return x.to(memory_format=torch.channels_last) if x.dim() == 4 else x


def build(graph: Graph, spec: EngineSpec, progress: Progress) -> BuiltEngine:
    start = time.perf_counter()
    if spec.device == "cpu":
        files, extra = _build_cpu(graph, spec, progress)
    elif spec.device == "cuda":
        files, extra = _build_cuda(graph, spec, progress)
    else:
        raise ValueError(f"inductor backend: unknown device {spec.device!r}")
    record = {
        "builder": "inductor",
        "builder_version": torch.__version__,
        "versions": _versions(),
        "options": {"max_batch": spec.max_batch, "io_dtype": spec.io_dtype.value},
        "build_seconds": round(time.perf_counter() - start, 2),
        "size_bytes": sum(len(b) for b in files.values()),
        **extra,
    }
    return BuiltEngine(spec=spec, files=files, record=record)


def _build_cpu(graph: Graph, spec: EngineSpec, progress: Progress) -> tuple[dict[str, bytes], dict]:
    module = to_fx(graph).eval()
    example = _example(graph, 2, "cpu")
    # Batch 2 as the example keeps the batch symbolic (a size-1 example would be specialised).
    batch = torch.export.Dim("batch", min=1, max=cpu_batch_limit(spec.max_batch))
    progress("exporting the graph for AOTInductor")
    with torch.no_grad():
        exported = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    progress("compiling with AOTInductor for the CPU (a minute on a small machine)")
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / CPU_PACKAGE
        torch._inductor.aoti_compile_and_package(exported, package_path=str(package))
        return {CPU_PACKAGE: package.read_bytes()}, {
            "device_name": "cpu",
            "batch_sizes": [1, cpu_batch_limit(spec.max_batch)],
        }


def _build_cuda(graph: Graph, spec: EngineSpec, progress: Progress) -> tuple[dict[str, bytes], dict]:
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda needs a CUDA GPU visible to PyTorch; build with --device cpu here")
    _forget_earlier_compiles()
    compiled = _compile_cuda(graph)
    sizes = compiled_batch_sizes(spec.max_batch)
    for batch in sizes:
        progress(f"compiling with Inductor for CUDA, batch {batch}")
        with torch.no_grad():
            compiled(_example(graph, batch, "cuda"))
    torch.cuda.synchronize()
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is None:
        raise RuntimeError("Inductor produced no cache artifacts to store in the bundle")
    data, _info = artifacts
    props = torch.cuda.get_device_properties(0)
    return {CUDA_CACHE: bytes(data)}, {
        "batch_sizes": sizes,
        "device_name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
    }


def _forget_earlier_compiles() -> None:
    """save_cache_artifacts() returns everything compiled in the process so far: start this engine's
    record empty, so a process that builds several bundles does not pack one's caches into the next."""
    torch.compiler.reset()
    try:
        from torch.compiler._cache import CacheArtifactManager
    except ImportError:  # other torch versions keep no such record
        return
    CacheArtifactManager.clear()


def _compile_cuda(graph: Graph):
    module = to_fx(graph).eval().cuda().to(memory_format=torch.channels_last)
    return torch.compile(module, dynamic=False)


def unavailable_reason(record: dict[str, Any], device: str) -> str | None:
    if device == "cuda" and not torch.cuda.is_available():
        return "this engine runs on a CUDA GPU and this machine has none (rebuild with --device cpu)"
    built_with = record.get("versions", {}).get("torch")
    if device == "cpu" and built_with and built_with.split("+")[0] != torch.__version__.split("+")[0]:
        return (
            f"the AOTInductor package was built by torch {built_with} and this is torch {torch.__version__}; "
            "rebuild the bundle here"
        )
    return None


def load(files: dict[str, bytes], record: dict[str, Any], graph: Graph, device: str):
    if device == "cpu":
        return _CpuEngine(files[CPU_PACKAGE], max(record.get("batch_sizes", [1])))
    return _CudaEngine(graph, files[CUDA_CACHE], record.get("batch_sizes", [1]))


class _CpuEngine:
    device = "cpu"
    dynamic_batch = True

    def __init__(self, package: bytes, max_batch: int) -> None:
        self.max_batch = max_batch
        # aoti_load_package needs a path; the package is read fully at load, so the file can go.
        fd, path = tempfile.mkstemp(suffix=".pt2")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(package)
            self._model = torch._inductor.aoti_load_package(path)
        finally:
            os.unlink(path)

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._model(pixels).float()


class _CudaEngine:
    """torch.compile with the bundle's Inductor caches, replayed in one CUDA graph per batch size."""

    device = "cuda"
    dynamic_batch = False

    def __init__(self, graph: Graph, cache: bytes, batch_sizes: list[int]) -> None:
        from .torch_lowering import TORCH_DTYPES

        torch.compiler.load_cache_artifacts(cache)
        self._compiled = _compile_cuda(graph)
        self._input_dtype = TORCH_DTYPES[graph.inputs[0].type.dtype]
        self._input_shape = tuple(graph.inputs[0].type.shape[1:])
        self.batch_sizes = sorted(batch_sizes)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    def _capture(self, batch: int):
        static_in = _cuda_layout(torch.zeros((batch,) + self._input_shape, device="cuda", dtype=self._input_dtype))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(3):  # compile (warm, from the cache) and settle allocations outside capture
                self._compiled(static_in)
        torch.cuda.current_stream().wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(cuda_graph):
            static_out = self._compiled(static_in)
        return cuda_graph, static_in, static_out

    def warm_up(self) -> None:
        for batch in self.batch_sizes:
            self._graphs.setdefault(batch, self._capture(batch))

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        n = pixels.shape[0]
        if n not in self.batch_sizes:
            raise ValueError(f"this engine was compiled for batch sizes {self.batch_sizes}, got {n}")
        if n not in self._graphs:
            self._graphs[n] = self._capture(n)
        cuda_graph, static_in, static_out = self._graphs[n]
        static_in.copy_(pixels, non_blocking=True)
        cuda_graph.replay()
        return static_out.float()
