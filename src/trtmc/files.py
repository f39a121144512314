"""Atomic file writes: readers see the old file or the whole new one, never a part.

`update_file_atomically` adds a lock around read-modify-write, so concurrent processes sharing one
file (a TensorRT timing cache) take turns and none loses another's update; `exclusive_lock` is that lock
for any work that processes must do one at a time (`shared_lock`, its other side, for work they may do together
but never beside the exclusive holder).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TextIO


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Call `write(f)` on a temporary file beside `path`, then rename it over `path`.

    On any error the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_bytes_atomically(path: Path, data: bytes) -> Path:
    return write_atomically(path, lambda f: f.write(data))


def update_file_atomically(path: Path, update: Callable[[bytes | None], bytes]) -> None:
    """Replace `path` with `update(current bytes, or None)` under an exclusive flock on `<path>.lock`.

    Concurrent writers take turns and each sees the previous one's result; the new content is
    written atomically, so readers only ever see a whole file.
    """
    path = Path(path)
    with exclusive_lock(path.with_name(path.name + ".lock")):
        write_bytes_atomically(path, update(path.read_bytes() if path.exists() else None))


@contextlib.contextmanager
def exclusive_lock(path: Path, waited: Callable[[float], None] | None = None) -> Iterator[float]:
    """Hold an exclusive `flock` on the file `path` (created if missing) for the block, across processes;
    yields the seconds spent waiting for it, also given to `waited` when the wait was noticeable (0.1 s or
    more). The kernel drops the lock when its process dies, so a killed holder never leaves it held."""
    with _flock(path, fcntl.LOCK_EX, waited) as wait:
        yield wait


@contextlib.contextmanager
def shared_lock(path: Path, waited: Callable[[float], None] | None = None) -> Iterator[float]:
    """`exclusive_lock`'s shared side: any number of processes hold it together, none while one holds the
    exclusive lock on the same file."""
    with _flock(path, fcntl.LOCK_SH, waited) as wait:
        yield wait


@contextlib.contextmanager
def _flock(path: Path, operation: int, waited: Callable[[float], None] | None) -> Iterator[float]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access: others may share it
    try:
        started = time.perf_counter()
        fcntl.flock(fd, operation)
        wait = time.perf_counter() - started
        if waited is not None and wait >= 0.1:
            waited(wait)
        try:
            yield wait
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_text_atomically(path: Path, write: Callable[[TextIO], None]) -> Path:
    """`write_atomically` for text: `write(out)` gets a UTF-8 text stream (newlines written as given)."""

    def binary(f: BinaryIO) -> None:
        out = io.TextIOWrapper(f, encoding="utf-8", newline="")
        write(out)
        out.flush()
        out.detach()  # the binary file stays open for write_atomically to sync and rename

    return write_atomically(path, binary)
