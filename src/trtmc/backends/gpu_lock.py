"""One build at a time times its candidates on a GPU, and nobody's autotuning runs beside it: a lock shared by
every process on this machine.

A CUDA build compiles several lowerings and keeps the fastest, timed by replaying each. Several builds may
run at once (the bench prepares 14 entries side by side), and a build timing its candidates while another
process runs work on the GPU measures that work too: run 14 (benchmarks/NOTES.md) saw the same code
choose differently for 6 of 31 (entry, batch) pairs and one candidate's time move 3.2x. `timing_alone`
holds an exclusive `flock` on a file named after the GPU's UUID while the candidates are timed, so timing
never overlaps another build's timing on that GPU; compiling (the long part) is not held up.

That was not enough (runs 17 and 23): the other processes' compiles benchmark their kernels' configurations on
the same GPU (Inductor's autotuning at a compiled model's first call), and under a 14-process prepare no round
of replays was free of them — builds timed their candidates at 0.5-1.7x the bench's time of the same engine, and
12 of 39 choices flipped between two prepares of nearly the same code, moving an engine by up to 16%. So
Inductor's GPU benchmarks take the same lock, shared (`benchmarking_beside`, hooked into Inductor's benchmarker by
`share_gpu_with_timing`): processes autotune together as before, but never while a build times, and a build that
asks to time holds back new benchmarks until it has timed (a turnstile, so that 14 processes' overlapping
benchmarks cannot keep it waiting for ever). The kernel drops a lock when its process dies, so a killed build
never leaves it held.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator

from ..files import exclusive_lock, shared_lock

log = logging.getLogger(__name__)

LOCK_PREFIX = "trtmc-gpu-timing-"


def lock_path(gpu: str, folder: str | os.PathLike | None = None) -> Path:
    """The lock file of one GPU (its UUID or any stable name), in `folder` or the temporary folder."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu) or "gpu"
    return Path(folder or tempfile.gettempdir()) / f"{LOCK_PREFIX}{safe}.lock"


def _turnstile(path: Path) -> Path:
    """The lock a build takes before the timing lock, and every benchmark passes through before its share."""
    return path.with_name(path.name + ".turnstile")


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


def device_lock(index: int = 0) -> Path:
    """The timing lock of CUDA device `index`, in the temporary folder: the one every process using it shares."""
    return lock_path(cuda_device_name(index))


@contextlib.contextmanager
def timing_alone(path: Path, waited: Callable[[float], None] | None = None) -> Iterator[float]:
    """Hold the GPU's timing lock at `path` for the block: no other build times and no process benchmarks
    meanwhile. Yields the seconds spent waiting for it (also given to `waited` when the wait was noticeable, so a
    build can say why it paused). A lock this process may not open (another user's file in a shared temporary
    folder, say) is logged and the timing goes on without it: the lock makes a choice steadier, its absence must
    not fail a build."""
    with contextlib.ExitStack() as stack:
        try:
            wait = stack.enter_context(exclusive_lock(_turnstile(path)))  # new benchmarks queue from here
            wait += stack.enter_context(exclusive_lock(path))  # those running finish
        except OSError as exc:
            log.warning("cannot take the GPU timing lock %s (%s); timing the candidates without it", path, exc)
            stack.close()
            wait = 0.0
        if waited is not None and wait >= 0.1:
            waited(wait)
        yield wait


_depth = threading.local()  # benchmarks inside a benchmark share the outer one's hold


@contextlib.contextmanager
def benchmarking_beside(path: Path) -> Iterator[None]:
    """A share of the GPU's timing lock at `path` for the block: other processes' benchmarks run beside it, a
    build's timing does not. Waits while a build times or waits to time; nested blocks take it once (a second
    pass through the turnstile, held by a waiting build, would wait for the build that waits for this one). A
    lock this process may not open is logged once and the benchmark goes on without it."""
    depth = getattr(_depth, "value", 0)
    with contextlib.ExitStack() as stack:
        if not depth:
            try:
                with exclusive_lock(_turnstile(path)):
                    pass
                stack.enter_context(shared_lock(path))
            except OSError as exc:
                _warn_once(path, str(exc))
        _depth.value = depth + 1
        try:
            yield
        finally:
            _depth.value = depth


@functools.lru_cache(maxsize=None)
def _warn_once(path: Path, exc: str) -> None:
    log.warning("cannot share the GPU timing lock %s (%s); benchmarking without it", path, exc)


_HOOKED = "_trtmc_timing_lock"  # the attribute a hooked benchmark method carries: its lock's path
HOOKED_METHODS = ("benchmark_gpu", "benchmark_gpu_with_cuda_graph")  # of Inductor's `benchmarker`


def share_gpu_with_timing(path: Path) -> bool:
    """Make every GPU benchmark of Inductor's in this process (its autotuning of kernel configurations, its
    padding and fusion benchmarks: all go through `torch._inductor.runtime.benchmarking.benchmarker`) take a
    share of the timing lock at `path` (`benchmarking_beside`). Once per process; False (logged) where this
    torch's Inductor has no such benchmarker: its benchmarks then run as before."""
    try:
        from torch._inductor.runtime.benchmarking import benchmarker
    except ImportError as exc:
        log.info("no Inductor benchmarker to share the GPU timing lock with (%s)", exc)
        return False
    for name in HOOKED_METHODS:
        method = getattr(benchmarker, name, None)
        if method is None or getattr(method, _HOOKED, None) is not None:
            continue

        @functools.wraps(method)
        def beside(*args, _inner=method, **kwargs):
            with benchmarking_beside(path):
                return _inner(*args, **kwargs)

        setattr(beside, _HOOKED, path)
        setattr(benchmarker, name, beside)  # the module's one instance, which every caller imports
    return getattr(getattr(benchmarker, "benchmark_gpu", None), _HOOKED, None) is not None
