"""A loaded TensorRT plan: one execution context and fixed device buffers per batch size on a side
stream, replayed through a CUDA graph where the runtime allows (full TensorRT: a torch CUDA graph of
the enqueue; TensorRT-RTX: its own whole-graph capture). Not exercised in CI: no GPU here can run a
plan; the contract test checks the class against the `Engine` protocol, and the boundary it shares
with every engine (`engine_io`) is tested on the CPU."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from ..graph import DType, Graph
from . import EngineEntry
from .engine_io import EngineBase, PixelSpec, WarnOnce
from .tensorrt_common import TensorRTLoadError, capturing_logger, dtype_name, plan_unavailable_reason
from .tensorrt_lowering import INPUT_NAME, OUTPUT_NAME
from .torch_lowering import TORCH_DTYPES

_log = logging.getLogger(__name__)


@dataclass
class _Slot:
    """One batch size: its own execution context, device buffers bound to it, and a CUDA graph."""

    context: Any
    input: Any
    output: Any
    graph: Any = None


class TensorRTEngine(EngineBase):
    """A deserialized plan: CUDA (N, C, H, W) pixels in the plan's input dtype -> owned float32 logits.

    The optimization profile serves every batch 1..max_batch; each batch size gets its context and
    buffers on first use (or in `warm_up`)."""

    copies_input = True  # into its slot's input buffer

    def __init__(self, plan: bytes, entry: EngineEntry, graph: Graph) -> None:
        reason = plan_unavailable_reason(entry.record)
        if reason:
            raise TensorRTLoadError(reason)
        super().__init__(PixelSpec.of(graph, "cuda"), entry.batching)
        builder = entry.record["builder"]
        self._trt = module = importlib.import_module(builder)
        self._logger = capturing_logger(module)
        mark = len(self._logger.errors)
        self._runtime = module.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            errors = self._logger.since(mark)
            raise TensorRTLoadError("\n".join([f"{builder} could not deserialize the plan", *errors]))
        plan_input = TORCH_DTYPES[DType(dtype_name(self._engine.get_tensor_dtype(INPUT_NAME)))]
        plan_chw = tuple(self._engine.get_tensor_shape(INPUT_NAME))[1:]
        if (plan_input, plan_chw) != (self._pixels.dtype, self._pixels.chw):
            raise TensorRTLoadError(
                f"the plan takes {plan_input} {plan_chw} but the bundle's graph takes "
                f"{self._pixels.dtype} {self._pixels.chw}; rebuild the bundle"
            )
        self._output_dtype = TORCH_DTYPES[DType(dtype_name(self._engine.get_tensor_dtype(OUTPUT_NAME)))]
        self._device = torch.device("cuda", torch.cuda.current_device())
        self._stream = torch.cuda.Stream(self._device)
        self._slots: dict[int, _Slot] = {}
        self._capture_failed = WarnOnce(_log)
        # TensorRT-RTX captures CUDA graphs itself (it JIT-compiles kernels per shape first).
        self._native_graphs = hasattr(module, "CudaGraphStrategy") and hasattr(self._engine, "create_runtime_config")

    def _context(self):
        if self._native_graphs:
            config = self._engine.create_runtime_config()
            config.cuda_graph_strategy = self._trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
            # Compile the shape-specialised kernels on a batch size's first call rather than in the
            # background, so every later call (and the captured graph) runs them.
            config.dynamic_shapes_kernel_specialization_strategy = (
                self._trt.DynamicShapesKernelSpecializationStrategy.EAGER
            )
            return self._engine.create_execution_context(config)
        return self._engine.create_execution_context()

    def _execute(self, context) -> None:
        mark = len(self._logger.errors)
        if not context.execute_async_v3(self._stream.cuda_stream):
            raise RuntimeError("\n".join(["TensorRT inference failed", *self._logger.since(mark)]))

    def _slot(self, batch: int) -> _Slot:
        mark = len(self._logger.errors)
        context = self._context()
        if context is None:
            errors = self._logger.since(mark)
            raise TensorRTLoadError("\n".join(["TensorRT could not create an execution context", *errors]))
        x = torch.zeros((batch, *self._pixels.chw), dtype=self._pixels.dtype, device=self._device)
        if not context.set_input_shape(INPUT_NAME, tuple(x.shape)):
            raise ValueError(f"this plan does not take a batch of {batch} (it serves {self._batching})")
        y = torch.empty(tuple(context.get_tensor_shape(OUTPUT_NAME)), dtype=self._output_dtype, device=self._device)
        context.set_tensor_address(INPUT_NAME, x.data_ptr())
        context.set_tensor_address(OUTPUT_NAME, y.data_ptr())
        slot = _Slot(context, x, y)
        with torch.cuda.stream(self._stream):
            self._execute(context)  # lazy initialisation happens here, outside any capture
        self._stream.synchronize()
        if not self._native_graphs:
            slot.graph = self._capture(context)
        return slot

    def _capture(self, context):
        if hasattr(context, "is_stream_capturable") and not context.is_stream_capturable(self._stream.cuda_stream):
            return None
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self._stream):
                self._execute(context)
            return graph
        except Exception as exc:  # some plans cannot be captured: run them uncaptured, slower
            self._capture_failed("CUDA graph capture of the TensorRT engine failed (%s); executing it uncaptured", exc)
            return None

    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        batch = pixels.shape[0]
        if batch not in self._slots:
            self._slots[batch] = self._slot(batch)
        slot = self._slots[batch]
        current = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            slot.input.copy_(pixels)
            if slot.graph is not None:
                slot.graph.replay()
            else:
                self._execute(slot.context)
        current.wait_stream(self._stream)
        # EngineBase copies the slot's buffer on the current stream; the next call's side stream
        # waits for that copy before it writes the buffer again.
        return slot.output
