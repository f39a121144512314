"""How long Triton takes to compile trtmc's depthwise kernel for a GPU, by kernel size, with every tap unrolled
and with a loop over the kernel's rows (a CPU can: Triton compiles for a target without launching).

    PYTHONPATH=src python tools/depthwise_kernel_compile_time.py [SIZE ...] [--capability 90]

Each compile runs in a fresh Triton cache (so none is answered from an earlier one), stride 1, "same" padding,
the built tile (`BLOCK_PIXELS` x `BLOCK_CHANNELS`, 4 warps). The kernel compiles at its first call in each process
and shape, outside the caches a bundle carries, so this time is paid by a build's candidate and by a fresh
machine's first answer (run 21: mixnet_s's 7x7, 9x9 and 11x11 kernels took 116-148 s of its build).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget

from trtmc.backends.depthwise_kernel import BLOCK_CHANNELS, BLOCK_PIXELS, depthwise_conv2d_kernel

POINTERS = ("x_ptr", "w_ptr", "b_ptr", "out_ptr")
SIZES = ("pixels", "height", "width", "channels", "out_height", "out_width")


def compile_seconds(kernel: int, unroll_rows: bool, capability: int) -> float:
    constexprs = {"stride_h": 1, "stride_w": 1, "top": kernel // 2, "left": kernel // 2, "dilation_h": 1,
                  "dilation_w": 1, "kh": kernel, "kw": kernel, "has_bias": True, "block_p": BLOCK_PIXELS,
                  "block_c": BLOCK_CHANNELS, "unroll_rows": unroll_rows}
    signature = {**{p: "*fp16" for p in POINTERS}, **{s: "i32" for s in SIZES}, **{c: "constexpr" for c in constexprs}}
    source = triton.compiler.ASTSource(fn=depthwise_conv2d_kernel, signature=signature, constexprs=constexprs)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        started = time.perf_counter()
        triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": 4})
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
