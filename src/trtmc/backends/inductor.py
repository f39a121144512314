"""The inductor backend: the graph lowered to torch FX and compiled by PyTorch Inductor.

CPU: an AOTInductor package (`model.pt2`, weights inside), exported with a symbolic batch
dimension and loaded without compiling; the bundle records, and the engine serves, any batch
1..max_batch as requested at build time. CUDA: loading AOTInductor packages segfaults in the H200
image's torch 2.11, so the CUDA engine is `torch.compile` of the FX graph with Inductor's cache
artifacts saved at build time (`inductor-cache.bin`); loading replays them, so a fresh process
compiles warm. It serves the fixed batch sizes it was compiled for, each replayed in a CUDA graph
with static input and output buffers (the caller gets a copy of the output, never the buffer).

A quick start (`LoadOptions(quick_start=True)`, `trtmc classify`'s default) skips all of that on
CUDA: `UncompiledCudaEngine` runs the same FX graph uncompiled (same ops and dtypes, any batch
1..max_batch), without importing Dynamo or Inductor, and with cuDNN off for grouped (depthwise)
convolutions: cuDNN's first use of a depthwise shape costs ~0.2 s (run 8), so ghostnet_100's first
call took 4.5 s with it and 0.41 s without, lite0's 2.3 s and 0.33 s (run 9). Loading the caches and compiling at the first
call take about 15 s on a GPU, which a run bound by image decoding never wins back. The CPU package
is compiled code already and loads as always.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Mapping

import torch

from ..graph import Graph
from . import Batching, BuiltEngine, Engine, EngineEntry, EngineSpec, LoadOptions, Progress, triton_cache
from .engine_io import EngineBase, PixelSpec, device_missing_reason
from .inductor_lowerings import (
    GELU_PRODUCTS, INDUCTOR_OPTIONS, LOWERINGS, PATCH_PRODUCTS, captured, choose_lowering, compile_cuda,
    inductor_options,
)
from .torch_lowering import channels_last_weights, to_fx

log = logging.getLogger(__name__)

name = "inductor"
devices = ("cpu", "cuda")

CPU_PACKAGE = "model.pt2"
CUDA_CACHE = "inductor-cache.bin"
TRITON_KERNELS = "triton-kernels.zip"  # trtmc's own Triton kernels the engine launches (`triton_cache`), if any


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


def _export_batch_limit(max_batch: int) -> int:
    """The symbolic batch's upper bound in the exported CPU program. The engine serves 1..max_batch;
    the export keeps a wider range (at least 2: a size-1 bound would specialise the batch)."""
    return max(max_batch, 256)


def _example(graph: Graph, batch: int, device: str) -> torch.Tensor:
    """The CPU export's example, or (on CUDA) a batch as the engine feeds its compiled graph."""
    from .torch_lowering import TORCH_DTYPES

    node = graph.inputs[0]
    shape = (batch,) + tuple(node.type.shape[1:])
    x = torch.randn(shape, device=device)
    return _cuda_feed(x, feed_dtype(graph)) if device == "cuda" else x.to(TORCH_DTYPES[node.type.dtype])


def feed_dtype(graph: Graph) -> torch.dtype:
    """The dtype a CUDA engine hands its graph. Where the graph's one use of its input is the precision
    pass's cast to the compute precision, the copy the engine makes of the pixels anyway (into its
    channels-last buffer) rounds them instead, as that cast would (both round to nearest even), and the
    cast runs on a tensor of its own dtype, which is no op: a kernel and a float32 copy of the batch
    fewer per call, the same bits."""
    from ..graph import OpKind
    from .torch_lowering import TORCH_DTYPES

    pixels = graph.inputs[0]
    readers = [n for n in graph.nodes if pixels.name in n.inputs]
    if len(readers) == 1 and readers[0].kind is OpKind.CAST and pixels.name not in graph.outputs:
        return TORCH_DTYPES[readers[0].attrs.dtype]
    return TORCH_DTYPES[pixels.type.dtype]


def _cuda_feed(pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Pixels as the CUDA engines feed the graph: in its `feed_dtype`, channels-last end to end, so cuDNN
    needs no layout conversions around convolutions (measured on the H200, ghostnet_100 fp16 batch 128:
    2.82 ms NCHW, 2.72 ms channels-last)."""
    layout = torch.channels_last if pixels.dim() == 4 else torch.contiguous_format
    return pixels.to(dtype, memory_format=layout)


def cannot_build_reason(device: str) -> str | None:
    if device == "cuda" and not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU here; build with --device cpu"
    return None


def build(graph: Graph, spec: EngineSpec, progress: Progress) -> BuiltEngine:
    start = time.perf_counter()
    if spec.device == "cpu":
        files, extra = _build_cpu(graph, spec, progress)
        batching = Batching.up_to(spec.max_batch)
    elif spec.device == "cuda":
        files, extra = _build_cuda(graph, spec, progress)
        batching = Batching.fixed(compiled_batch_sizes(spec.max_batch))
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
    return BuiltEngine(spec=spec, files=files, batching=batching, record=record)


def _build_cpu(graph: Graph, spec: EngineSpec, progress: Progress) -> tuple[dict[str, bytes], dict]:
    module = to_fx(graph).eval()
    example = _example(graph, 2, "cpu")
    # Batch 2 as the example keeps the batch symbolic (a size-1 example would be specialised).
    batch = torch.export.Dim("batch", min=1, max=_export_batch_limit(spec.max_batch))
    progress("exporting the graph for AOTInductor")
    with torch.no_grad():
        exported = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    progress("compiling with AOTInductor for the CPU (a minute on a small machine)")
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / CPU_PACKAGE
        torch._inductor.aoti_compile_and_package(exported, package_path=str(package))
        return {CPU_PACKAGE: package.read_bytes()}, {"device_name": "cpu"}


def _build_cuda(graph: Graph, spec: EngineSpec, progress: Progress) -> tuple[dict[str, bytes], dict]:
    reason = cannot_build_reason("cuda")
    if reason:
        raise RuntimeError(reason)
    _forget_earlier_compiles()
    props = torch.cuda.get_device_properties(0)
    compiled = compile_cuda(graph, options=inductor_options((props.major, props.minor)))
    choices: dict[str, dict[str, Any]] = {}
    for batch in compiled_batch_sizes(spec.max_batch):
        choice = choose_lowering(compiled, graph, _example(graph, batch, "cuda"), progress)
        compiled.choose(batch, choice.chosen)
        choices[str(batch)] = choice.to_json()
    torch.cuda.synchronize()
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is None:
        raise RuntimeError("Inductor produced no cache artifacts to store in the bundle")
    data, _info = artifacts
    files = {CUDA_CACHE: bytes(data)}
    if compiled.launches_own_kernels:  # extern calls: their kernels are not in Inductor's caches
        from .depthwise_kernel import JIT_KERNELS

        files[TRITON_KERNELS] = triton_cache.archive(triton_cache.launched(JIT_KERNELS))
        triton_cache.forget(JIT_KERNELS)  # a later build in this process archives its own only
    return files, {
        "device_name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        LOWERINGS: choices,
        INDUCTOR_OPTIONS: compiled.options,
        PATCH_PRODUCTS: sorted(compiled.patches),
        GELU_PRODUCTS: sorted(compiled.gelus),
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


def compiling_in_process():
    """Inductor settings for compiles that caches answer: no pool of compile workers.

    Inductor starts one worker process per core (each importing torch) the first time it compiles,
    stops them 60 s after the last compile (`quiesce_async_compile_time`) and starts them again at the
    next; with every kernel in the caches they have nothing to do but cost start-up and exit time, and
    CPU time beside whatever runs then. A cache miss still compiles, in this process. A user who set
    TORCHINDUCTOR_COMPILE_THREADS keeps their setting.
    """
    if "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
        return contextlib.nullcontext()
    import torch._inductor.config

    return torch._inductor.config.patch(compile_threads=1)


def graph_cache_counts() -> tuple[int, int]:
    """(hits, misses) of Inductor's FX graph cache in this process so far. A compile that misses runs Inductor again
    (its kernels may still come from Triton's cache): a load that misses is slow, and says the bundle's or the disk's
    caches did not answer."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def describe_cache_use(before: tuple[int, int]) -> str:
    """' (Inductor's graph cache: H hits, M misses)' since `before` (a `graph_cache_counts()`), or '' if none."""
    hits, misses = (now - then for now, then in zip(graph_cache_counts(), before))
    return f" (Inductor's graph cache: {hits} hits, {misses} misses)" if hits or misses else ""


def unavailable_reason(entry: EngineEntry) -> str | None:
    missing = device_missing_reason(entry.device)
    if missing:
        return missing
    built_with = entry.record.get("versions", {}).get("torch")
    if entry.device == "cpu" and built_with and built_with.split("+")[0] != torch.__version__.split("+")[0]:
        return (
            f"the AOTInductor package was built by torch {built_with} and this is torch {torch.__version__}; "
            "rebuild the bundle here"
        )
    return None


def load(
    files: Mapping[str, bytes], entry: EngineEntry, graph: Graph, options: LoadOptions = LoadOptions()
) -> Engine:
    package = CPU_PACKAGE if entry.device == "cpu" else CUDA_CACHE
    if package not in files:
        raise RuntimeError(f"the inductor engine {entry.key} has no {package}; its files are {sorted(files)}")
    if entry.device == "cpu":  # compiled code already: a quick start changes nothing
        return InductorCpuEngine(files[CPU_PACKAGE], entry.batching, PixelSpec.of(graph, "cpu"))
    if options.quick_start:
        return UncompiledCudaEngine(graph, "cuda", entry.batching.max_batch)
    if TRITON_KERNELS in files:
        point_triton_at_inductors_cache(torch.cuda.current_device())
        log.info("%s", triton_cache.restore(files[TRITON_KERNELS]))
    return InductorCudaEngine(graph, files[CUDA_CACHE], entry.batching, entry.record)


def point_triton_at_inductors_cache(device_index: int) -> None:
    """Triton's cache folder set where Inductor sets it for the rest of the process once it loads its first kernel,
    unless the user set it (`TRITON_CACHE_DIR`): every later Triton launch, trtmc's depthwise kernels' included, looks
    there, so the bundle's kernels must go there, not to Triton's own default, which a launch no longer reads."""
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    os.environ.setdefault("TRITON_CACHE_DIR", triton_cache_dir(device_index))


class InductorCpuEngine(EngineBase):
    """The AOTInductor package, loaded once; any batch 1..max_batch."""

    def __init__(self, package: bytes, batching: Batching, pixels: PixelSpec) -> None:
        super().__init__(pixels, batching)
        if not zipfile.is_zipfile(io.BytesIO(package)):  # torch would only log "outdated pt2 file" and fail
            raise ValueError(f"{CPU_PACKAGE} is not an AOTInductor package (not a zip archive)")
        # aoti_load_package needs a path; the package is read fully at load, so the file can go.
        fd, path = tempfile.mkstemp(suffix=".pt2")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(package)
            self._model = torch._inductor.aoti_load_package(path)
        finally:
            os.unlink(path)

    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self._model(pixels)


class InductorCudaEngine(EngineBase):
    """torch.compile with the bundle's Inductor caches, replayed in one CUDA graph per batch size
    (captured on a size's first call, or in `warm_up`)."""

    copies_input = True  # into the graph's static (channels-last) buffer

    def __init__(self, graph: Graph, cache: bytes, batching: Batching, record: Mapping[str, Any] | None = None) -> None:
        super().__init__(PixelSpec.of(graph, "cuda"), batching)
        torch.compiler.load_cache_artifacts(cache)
        self._feed = feed_dtype(graph)
        self._compiled = compile_cuda(graph, record)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    def _capture(self, batch: int):
        static_in = _cuda_feed(self._pixels.zeros(batch), self._feed)
        with compiling_in_process():
            cuda_graph, static_out = captured(self._compiled, static_in)
        return cuda_graph, static_in, static_out

    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        n = pixels.shape[0]
        if n not in self._graphs:
            self._graphs[n] = self._capture(n)
        cuda_graph, static_in, static_out = self._graphs[n]
        static_in.copy_(pixels, non_blocking=True)  # into the graph's dtype and layout (`feed_dtype`)
        cuda_graph.replay()
        return static_out  # the next replay overwrites it: EngineBase hands out a copy


class UncompiledCudaEngine(EngineBase):
    """The CUDA engine's FX graph run uncompiled, for a quick start: what `_compile_cuda` would
    compile (quantized GEMMs, channels-last, the graph's dtypes), eager, serving any batch
    1..max_batch (nothing is specialised per size, so a batch of 3 runs as 3, unpadded).

    `device` is a parameter only so that CPU tests can compare it with the reference engine; the
    runtime makes it on "cuda".
    """

    copies_input = True  # eager ops read any strides, and `_cuda_feed` makes a channels-last copy of the others

    def __init__(self, graph: Graph, device: str, max_batch: int) -> None:
        super().__init__(PixelSpec.of(graph, device), Batching.up_to(max_batch))
        # As `_compile_cuda` prepares it, minus the compile; nothing here imports Dynamo or Inductor.
        self._feed = feed_dtype(graph)  # once: the graph does not change between calls
        module = channels_last_weights(to_fx(graph, quantized_gemms=True).eval().to(device), graph)
        self._module = grouped_convolutions_without_cudnn(module)

    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self._module(_cuda_feed(pixels, self._feed))


def _conv2d_without_cudnn_if_grouped(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if groups == 1:
        return torch.conv2d(x, weight, bias, stride, padding, dilation, groups)
    with torch.backends.cudnn.flags(enabled=False):
        return torch.conv2d(x, weight, bias, stride, padding, dilation, groups)


def grouped_convolutions_without_cudnn(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`module` (from `to_fx`, run uncompiled) with every grouped convolution on PyTorch's own CUDA
    kernels instead of cuDNN's, whose first call of each depthwise shape picks a kernel for ~0.2 s.
    Measured on the H200 (run 9, `tools/first_call_probe.py`, fp16 channels-last): first calls 4.54 ->
    0.41 s (ghostnet_100), 2.26 -> 0.33 s (lite0); a warm batch of 64 slower, 5.3 -> 6.4 ms and 4.4 ->
    6.6 ms, ~10,000 images/s, still far above what decoding feeds a folder run."""
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target in (torch.conv2d, torch.nn.functional.conv2d):
            node.target = _conv2d_without_cudnn_if_grouped
    module.recompile()
    return module
