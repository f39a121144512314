"""One build at a time times its candidates on a GPU: a lock shared by every process on this machine.

A CUDA build compiles several lowerings and keeps the fastest, timed by replaying each. Several builds may
run at once (the bench prepares 14 entries side by side), and a build timing its candidates while another
build's replays share the GPU measures the other build: run 14 (benchmarks/NOTES.md) saw the same code
choose differently for 6 of 31 (entry, batch) pairs and one candidate's time move 3.2x. `timing_alone`
holds an exclusive `flock` on a file named after the GPU's UUID while the candidates are timed, so timing
never overlaps another build's timing on that GPU; compiling (the long part) is not held up. The kernel
drops the lock when its process dies, so a killed build never leaves it held.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, ContextManager

from ..files import exclusive_lock

LOCK_PREFIX = "trtmc-gpu-timing-"


def lock_path(gpu: str, folder: str | os.PathLike | None = None) -> Path:
    """The lock file of one GPU (its UUID or any stable name), in `folder` or the temporary folder."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu) or "gpu"
    return Path(folder or tempfile.gettempdir()) / f"{LOCK_PREFIX}{safe}.lock"


def cuda_device_name(index: int = 0) -> str:
    """A name of CUDA device `index` that every process on this machine agrees on: its UUID where torch
    reports one (CUDA_VISIBLE_DEVICES renumbers devices, UUIDs stay), else its PCI bus id."""
    import torch

    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        return str(uuid)
    return f"pci-{getattr(props, 'pci_bus_id', index)}-{getattr(props, 'pci_device_id', 0)}"


def timing_alone(path: Path, waited: Callable[[float], None] | None = None) -> ContextManager[float]:
    """Hold the GPU's timing lock at `path` for the block; yields the seconds spent waiting for it (also given
    to `waited` when the wait was noticeable, so a build can say why it paused)."""
    return exclusive_lock(path, waited)
