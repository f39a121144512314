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

import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from ..files import exclusive_lock

log = logging.getLogger(__name__)

LOCK_PREFIX = "trtmc-gpu-timing-"


def lock_path(gpu: str, folder: str | os.PathLike | None = None) -> Path:
    """The lock file of one GPU (its UUID or any stable name), in `folder` or the temporary folder."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu) or "gpu"
    return Path(folder or tempfile.gettempdir()) / f"{LOCK_PREFIX}{safe}.lock"


def cuda_device_name(index: int = 0) -> str:
    """A name of CUDA device `index` that every process on this machine agrees on: its UUID where torch
    reports one (CUDA_VISIBLE_DEVICES renumbers devices, UUIDs stay), else its PCI location, else its index."""
    import torch

    props = torch.cuda.get_device_properties(index)
    try:
        return str(props.uuid)
    except Exception:  # a torch without the UUID: the PCI location where it has one
        location = [getattr(props, key, None) for key in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        return "pci-" + "-".join(map(str, location)) if None not in location else f"cuda{index}"


@contextlib.contextmanager
def timing_alone(path: Path, waited: Callable[[float], None] | None = None) -> Iterator[float]:
    """Hold the GPU's timing lock at `path` for the block; yields the seconds spent waiting for it (also given
    to `waited` when the wait was noticeable, so a build can say why it paused). A lock this process may not
    open (another user's file in a shared temporary folder, say) is logged and the timing goes on without
    it: the lock makes a choice steadier, its absence must not fail a build."""
    with contextlib.ExitStack() as stack:
        try:
            wait = stack.enter_context(exclusive_lock(path, waited))
        except OSError as exc:
            log.warning("cannot take the GPU timing lock %s (%s); timing the candidates without it", path, exc)
            wait = 0.0
        yield wait
