"""Atomic file writes: readers see the old file or the whole new one, never a part."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


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
