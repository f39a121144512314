"""What a depthwise kernel asks of the GPU per thread, read from its machine code on a CPU (issue 12; run 30).

Compiles the row kernel of runs 29-30 (tools/depthwise_kernel_tune.py's `depthwise_rows_kernel` at `ROW_TILE`)
and the product's window kernel (`depthwise_window_kernel`, `window R S C N`) for sm_90a with Triton, specialized as
a launch on one of convnext_tiny's 7x7 convolutions specializes them (taps laid out tap by tap in float32, as
`taps_major_weights` lays them out; 16-divisible sizes and strides marked so, a stride of 1 made a constant),
without a GPU; counts the SASS instructions of one thread (`cuobjdump -sass`, bundled with Triton) and reads its
registers and spills (`ptxas -v`). Multiply-adds per thread against all instructions per thread is what the kernel
issues for its arithmetic; the compile time is Triton's, in this process (run it with an empty TRITON_CACHE_DIR to
time a cold compile).

    PYTHONPATH=src:tools python3 tools/depthwise_kernel_sass.py [--kernel 7] [--channels 96] [--width 56]
        [--window "4 4 64 1" ...]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

from trtmc.backends.depthwise_kernel import depthwise_window_kernel

from depthwise_kernel_tune import ROW_TILE, depthwise_rows_kernel

TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
POINTERS = {"x_ptr": "*fp16", "w_ptr": "*fp32", "b_ptr": "*fp16", "out_ptr": "*fp16"}
SASS_OP = re.compile(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def specialized(fn, sizes: dict[str, int], constexprs: dict) -> triton.compiler.ASTSource:
    """The source Triton compiles at a launch with these integer arguments: 1 a constant, 16-divisible marked so
    (its launcher's specialization; the pointers, freshly allocated, 16-byte aligned)."""
    ones = {name: 1 for name, value in sizes.items() if value == 1}
    constexprs = {**constexprs, **ones}
    signature = {**POINTERS, **{name: "i32" for name in sizes if name not in ones},
                 **{name: "constexpr" for name in constexprs}}
    order = list(fn.arg_names)
    divisible = [name for name in POINTERS] + [n for n, v in sizes.items() if v != 1 and v % 16 == 0]
    attrs = {(order.index(name),): [["tt.divisibility", 16]] for name in divisible}
    return triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


def machine_code(source: triton.compiler.ASTSource, warps: int) -> dict:
    began = time.perf_counter()
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    seconds = time.perf_counter() - began
    with tempfile.TemporaryDirectory() as tmp:
        cubin, ptx = Path(tmp, "k.cubin"), Path(tmp, "k.ptx")
        cubin.write_bytes(compiled.asm["cubin"])
        ptx.write_text(compiled.asm["ptx"])
        sass = subprocess.run([TOOLS / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
        arch = re.search(r"\.target\s+(\w+)", compiled.asm["ptx"]).group(1)
        verbose = subprocess.run([TOOLS / "ptxas", "-v", f"-arch={arch}", ptx, "-o", os.devnull],
                                 capture_output=True, text=True, check=True).stderr
    ops = collections.Counter(m.group(1).split(".")[0] for m in map(SASS_OP.match, sass.splitlines()) if m)
    return {"compile_s": round(seconds, 1), "instructions": sum(ops.values()), "ffma": ops["FFMA"], "loads": ops["LDG"],
            "registers": int(re.search(r"Used (\d+) registers", verbose).group(1)),
            "spill_stores": int(re.search(r"(\d+) bytes spill stores", verbose).group(1)),
            "top": ops.most_common(8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", type=int, default=7)
    parser.add_argument("--channels", type=int, default=96)
    parser.add_argument("--width", type=int, default=56, help="the map's height and width")
    parser.add_argument("--window", action="append", help='"R S C N" (default: the tune tool\'s window tiles)')
    args = parser.parse_args()
    k, c, hw = args.kernel, args.channels, args.width
    sizes = {"height": hw, "width": hw, "channels": c, "out_height": hw, "out_width": hw,
             "stride_wc": 1, "stride_wh": k * c, "stride_ww": c}  # taps-major float32: [C, 1, kh, kw] at (1, kw*C, C)
    same = {"top": k // 2, "left": k // 2, "kh": k, "kw": k, "has_bias": True}
    rows = {**same, "rows": ROW_TILE.rows, "block_w": ROW_TILE.columns, "block_c": ROW_TILE.channels}
    runs = {f"row kernel {ROW_TILE}": (specialized(depthwise_rows_kernel, sizes, rows), ROW_TILE.warps)}
    for spec in args.window or ["4 4 64 1", "4 4 128 2", "2 8 64 1", "4 7 64 1"]:
        r, s, block_c, warps = map(int, spec.split())
        window = {**same, "rows": r, "cols": s, "block_c": block_c}
        runs[f"window {spec}"] = (specialized(depthwise_window_kernel, sizes, window), warps)
    for name, (source, warps) in runs.items():
        m = machine_code(source, warps)
        print(f"{k}x{k}, {c} channels, {hw}x{hw}, {name}: {m['instructions']} instructions a thread for {m['ffma']} "
              f"multiply-adds ({m['instructions'] / m['ffma']:.2f} each), {m['loads']} loads, {m['registers']} "
              f"registers, {m['spill_stores']} bytes spilled; compile {m['compile_s']} s; {m['top']}", flush=True)


if __name__ == "__main__":
    main()
