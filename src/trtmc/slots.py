"""Decoded pixels from decode processes to the main process without pickling: fixed-size slots in one
shared anonymous mapping.

The main process maps the slots before its decode processes fork, so each worker inherits the mapping
and writes a decoded image straight into the slot it was given; only (height, width) travels back
through the pool's pipe. On CUDA the mapping is page-locked once the workers exist
(`cudaHostRegister`), so copies from a slot to the device are asynchronous DMA, as from pinned memory.
A slot is handed out with a file and given back once its pixels have been copied, so the slots bound
the memory however many files go through.
"""

from __future__ import annotations

import mmap
from collections import deque

import numpy as np
import torch

# A slot holds an RGB image of up to this many pixels (640 x 480); a larger one is cropped by its worker. Page-locking
# the slots is part of every run's start: on the H200 (run 9, 2,002 files, 16 workers, batch 64) 729 MB of 1024 x 768
# slots took 0.23-0.34 s to lock and the pass ran 1,316-1,618 images/s; 284 MB of these, 0.11-0.12 s and 1,663-1,669.
SLOT_PIXELS = 640 * 480


class Slots:
    def __init__(self, count: int, pixels: int = SLOT_PIXELS) -> None:
        self.slot_bytes = 3 * pixels
        self._mapping = mmap.mmap(-1, count * self.slot_bytes)  # MAP_SHARED | MAP_ANONYMOUS: forks share it
        self._array = np.frombuffer(self._mapping, dtype=np.uint8).reshape(count, self.slot_bytes)
        self._free = deque(range(count))
        self._pinned = False

    # ---- in a decode worker ----

    def write(self, slot: int, hwc: np.ndarray) -> bool:
        """Puts 8-bit HWC pixels into a slot; False (nothing written) when they do not fit."""
        if hwc.nbytes > self.slot_bytes:
            return False
        self._array[slot, : hwc.nbytes].reshape(hwc.shape)[...] = hwc
        return True

    # ---- in the main process ----

    @property
    def bytes(self) -> int:
        return len(self._mapping)

    def take(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(f"{count} slots asked for, {len(self._free)} free: the read-ahead window outgrew its slots")
        return [self._free.popleft() for _ in range(count)]

    def give_back(self, slots) -> None:
        self._free.extend(slots)

    def pixels(self, slot: int, height: int, width: int) -> torch.Tensor:
        """A slot's image as a [height, width, 3] uint8 tensor over the shared memory (no copy)."""
        return torch.from_numpy(self._array[slot, : height * width * 3].reshape(height, width, 3))

    def pin(self) -> bool:
        """Page-locks the mapping for asynchronous copies to CUDA devices; call it after the workers have
        forked. False (copies stay synchronous) where CUDA refuses."""
        if not self._pinned:
            status = torch.cuda.cudart().cudaHostRegister(self._address(), len(self._mapping), 0)
            self._pinned = int(status) == 0  # cudaSuccess
        return self._pinned

    def close(self) -> None:
        if self._pinned:
            torch.cuda.synchronize()  # no copy from the mapping may still be in flight
            torch.cuda.cudart().cudaHostUnregister(self._address())
            self._pinned = False

    def _address(self) -> int:
        return self._array.ctypes.data
