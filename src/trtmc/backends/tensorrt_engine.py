"""A loaded TensorRT plan: one execution context and fixed device buffers per batch size on a side
stream, replayed through a CUDA graph where the runtime allows (full TensorRT: a torch CUDA graph of
the enqueue; TensorRT-RTX: its own whole-graph capture). Not exercised in CI: no GPU here can run a
plan."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any

from ..precision import PRECISIONS
from .tensorrt import TensorRTLoadError, _dtype_name, _logger, unavailable_reason
from .tensorrt_lowering import INPUT_NAME, OUTPUT_NAME

_log = logging.getLogger(__name__)



@dataclass
class _Slot:
    """One batch size: its own execution context, device buffers bound to it, and a CUDA graph."""

    context: Any
    input: Any
    output: Any
    graph: Any = None


class TensorRTEngine:
    dynamic_batch = True  # the optimization profile serves every batch 1..max_batch
    """A deserialized plan; `engine(pixels)` takes a CUDA (N, C, H, W) tensor and gives float32 logits."""

    device = "cuda"

    def __init__(self, plan: bytes, record: dict) -> None:
        import torch

        reason = unavailable_reason(record)
        if reason:
            raise TensorRTLoadError(reason)
        self._torch = torch
        self._trt = module = importlib.import_module(record["builder"])
        self._logger = _logger(module)
        mark = len(self._logger.errors)
        self._runtime = module.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            errors = self._logger.since(mark)
            raise TensorRTLoadError("\n".join([f"{record['builder']} could not deserialize the plan", *errors]))
        self.max_batch = int(record["options"]["max_batch"])
        dtypes = {p.dtype.value: p.torch_dtype for p in PRECISIONS.values()}
        self._input_dtype = dtypes[_dtype_name(self._engine.get_tensor_dtype(INPUT_NAME))]
        self._output_dtype = dtypes[_dtype_name(self._engine.get_tensor_dtype(OUTPUT_NAME))]
        self._chw = tuple(self._engine.get_tensor_shape(INPUT_NAME))[1:]
        self._device = torch.device("cuda", torch.cuda.current_device())
        self._stream = torch.cuda.Stream(self._device)
        self._slots: dict[int, _Slot] = {}
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
        torch = self._torch
        mark = len(self._logger.errors)
        context = self._context()
        if context is None:
            errors = self._logger.since(mark)
            raise TensorRTLoadError("\n".join(["TensorRT could not create an execution context", *errors]))
        x = torch.zeros((batch, *self._chw), dtype=self._input_dtype, device=self._device)
        if not context.set_input_shape(INPUT_NAME, tuple(x.shape)):
            raise ValueError(f"this plan does not take a batch of {batch} (its profile is 1..{self.max_batch})")
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
        torch = self._torch
        if hasattr(context, "is_stream_capturable") and not context.is_stream_capturable(self._stream.cuda_stream):
            return None
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self._stream):
                self._execute(context)
            return graph
        except Exception as exc:  # some plans cannot be captured: run them uncaptured
            _log.info("CUDA graph capture of the TensorRT engine failed (%s); executing directly", exc)
            return None

    def _run(self, pixels):
        torch = self._torch
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
            logits = slot.output.float() if slot.output.dtype != torch.float32 else slot.output.clone()
        current.wait_stream(self._stream)
        logits.record_stream(current)
        return logits

    def __call__(self, pixels):
        if pixels.ndim != 4 or tuple(pixels.shape[1:]) != self._chw or pixels.shape[0] == 0:
            chw = ", ".join(map(str, self._chw))
            raise ValueError(f"expected pixels of shape (N, {chw}), got {tuple(pixels.shape)}")
        pixels = pixels.to(self._device)
        chunks = [self._run(chunk) for chunk in pixels.split(self.max_batch)]
        return chunks[0] if len(chunks) == 1 else self._torch.cat(chunks)



def load_plan(plan: bytes, record: dict) -> "TensorRTEngine":
    return TensorRTEngine(plan, record)
