"""How long Triton takes to compile trtmc's depthwise kernel for a GPU, by kernel size, with every tap unrolled
and with a loop over the kernel's rows (a CPU can: Triton compiles for a target without launching).

    PYTHONPATH=src python tools/depthwise_kernel_compile_time.py [SIZE ...] [--capability 90]

Each compile runs in a fresh Triton cache (so none is answered from an earlier one), stride 1, "same" padding,
the built tile (`TILE`) with its rows unrolled and looped. The kernel compiles at its first call in a process
whose Triton cache lacks that specialization, so this time is paid by a build's candidate (run 21: mixnet_s's 7x7,
9x9 and 11x11 kernels took 116-148 s of its build) and, for bundles built before they carried the compiled kernels
(`trtmc.backends.triton_cache`), by a fresh machine's first answer.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace

import triton

from trtmc.backends.depthwise_kernel import TILE, compiled_for


def compile_seconds(kernel: int, unroll_rows: bool, capability: int) -> float:
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        started = time.perf_counter()
        compiled_for(capability, kernel, replace(TILE, unroll_rows=unroll_rows))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, default=[3, 5, 7, 9, 11])
    parser.add_argument("--capability", type=int, default=90, help="the GPU's compute capability, e.g. 90 for sm_90")
    args = parser.parse_args()
    print(f"triton {triton.__version__}, sm_{args.capability}, {os.cpu_count()} CPUs", flush=True)
    for kernel in args.sizes:
        looped = compile_seconds(kernel, False, args.capability)
        unrolled = compile_seconds(kernel, True, args.capability)
        print(f"{kernel}x{kernel}: every tap unrolled {unrolled:.1f} s, a loop over its rows {looped:.1f} s",
              flush=True)


if __name__ == "__main__":
    main()
