"""trtmc's own compiled Triton kernels, carried in a bundle and put back into Triton's cache at load.

Inductor's cache artifacts (`inductor-cache.bin`) hold the kernels Inductor generates, but trtmc's depthwise
kernels (`depthwise_kernel`) are extern calls in Inductor's graph, launched by Triton's JIT: on a machine whose
Triton cache never saw them, a load compiles every specialization again before its first answer (run 30: ~8 s for
a 7x7 window kernel on a 2-core CPU). A build archives each specialization it launched, as Triton's cache holds it:
the metadata and the binary, keyed by Triton's hash of the kernel's source, options, target and Triton itself
(`CompiledKernel.hash`). A load puts back those the local cache lacks, so that the first launch finds them. A kernel
archived by another Triton or for another GPU has another hash, so it is never found and the launch compiles.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

HASH = re.compile(r"[0-9a-f]{64}")  # Triton's sha256 of the kernel's cache key
FILE_NAME = re.compile(r"\w[\w.\-]*")  # a file in the kernel's cache folder: never a path
EPOCH = (1980, 1, 1, 0, 0, 0)  # the archive's timestamps: the same kernels make the same bytes


def launched(functions: Iterable) -> list:
    """Every specialization of these `triton.jit` functions compiled (or loaded from the cache) in this process."""
    kernels = []
    for fn in functions:
        for device_cache in fn.device_caches.values():
            # (kernel cache, ...) since Triton 3.3, the cache mapping each specialization to its CompiledKernel; an
            # asynchronous compile (not trtmc's) leaves a placeholder until it ends, which has no files yet.
            kernels.extend(k for k in device_cache[0].values() if hasattr(k, "metadata_group") and hasattr(k, "hash"))
    return kernels


def forget(functions: Iterable) -> None:
    """Drop what these functions compiled in this process (the next launch reads Triton's cache), so that a process
    that builds several bundles does not archive one's kernels into the next."""
    for fn in functions:
        fn.device_caches.clear()


def archive(kernels: Iterable) -> bytes:
    """A zip of each kernel's metadata and binary (`HASH/NAME.json`, `HASH/NAME.cubin`), the intermediate forms
    left out: a launch reads the binary only (Triton's own `store_binary_only` keeps the same two)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for kernel in sorted(kernels, key=lambda k: k.hash):
            for name, path in sorted(_needed(kernel).items()):
                zf.writestr(zipfile.ZipInfo(f"{kernel.hash}/{name}", EPOCH), Path(path).read_bytes())
    return buffer.getvalue()


def _needed(kernel) -> dict[str, str]:
    """The kernel's files a launch needs: its metadata and its binary."""
    from triton.compiler.compiler import make_backend

    binary = "." + make_backend(kernel.metadata.target).binary_ext
    return {name: path for name, path in kernel.metadata_group.items() if name.endswith((".json", binary))}


@dataclass(frozen=True)
class Restored:
    """What `restore` did: how many of the archive's kernels it put into Triton's cache; the rest were there."""

    put: int
    archived: int

    def __str__(self) -> str:
        kernels = f"{self.archived} compiled Triton kernel{'s' if self.archived != 1 else ''}"
        if self.put == 0:
            return f"Triton's cache held the bundle's {kernels} already"
        if self.put == self.archived:
            return f"put the bundle's {kernels} into Triton's cache"
        return f"put {self.put} of the bundle's {kernels} into Triton's cache (the others were there)"


def restore(data: bytes) -> Restored:
    """Puts the archived kernels that Triton's cache lacks into it."""
    from triton.runtime.cache import get_cache_manager

    restored = 0
    groups = _groups(data)
    for key, files in groups.items():
        metadata = [name for name in files if name.endswith(".json")]
        if len(metadata) != 1:
            raise ValueError(f"the bundle's Triton kernel {key} has {len(metadata)} metadata files, not 1; "
                             "rebuild the bundle")
        cache = get_cache_manager(key)
        if cache.get_group(metadata[0]) is not None:
            continue
        paths = {name: cache.put(content, name) for name, content in files.items()}
        cache.put_group(metadata[0], paths)
        restored += 1
    return Restored(restored, len(groups))


def _groups(data: bytes) -> dict[str, dict[str, bytes]]:
    """The archive's files by kernel hash, every name checked: nothing may be written outside a kernel's folder."""
    groups: dict[str, dict[str, bytes]] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for entry in zf.namelist():
            key, _, name = entry.partition("/")
            if not HASH.fullmatch(key) or not FILE_NAME.fullmatch(name) or ".." in name:
                raise ValueError(f"the bundle's Triton kernels hold {entry!r}, not HASH/FILE; rebuild the bundle")
            groups.setdefault(key, {})[name] = zf.read(entry)
    return groups
