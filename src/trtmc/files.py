"""Atomic file writes: readers see the old file or the whole new one, never a part.

`update_file_atomically` adds a lock around read-modify-write, so concurrent processes sharing one
file (a TensorRT timing cache) take turns and none loses another's update.
"""

from __future__ import annotations

import fcntl
import io
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, TextIO


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
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            write_bytes_atomically(path, update(path.read_bytes() if path.exists() else None))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_text_atomically(path: Path, write: Callable[[TextIO], None]) -> Path:
    """`write_atomically` for text: `write(out)` gets a UTF-8 text stream (newlines written as given)."""

    def binary(f: BinaryIO) -> None:
        out = io.TextIOWrapper(f, encoding="utf-8", newline="")
        write(out)
        out.flush()
        out.detach()  # the binary file stays open for write_atomically to sync and rename

    return write_atomically(path, binary)
