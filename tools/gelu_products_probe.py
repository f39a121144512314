"""Matrix products with their bias and GELU as one cuBLASLt call, against the engine's lowering, on the GPU (issue 12).

    PYTHONPATH=src python3 tools/gelu_products_probe.py OUT_DIR ARCH... [--batch N ...] [--compile-only]

For each architecture (random weights, fp16, the graph `trtmc build` prepares) and batch size, compiles the lowering
a build would most likely keep there (the depthwise-kernel candidate where it is offered, else the plain one; no
GEMM templates) twice: as is, and with every GELU after a half-precision linear op or 1x1 convolution computed with
that product by `torch._addmm_activation` (`trtmc.backends.gelu_products`). Each is replayed in a CUDA graph; the rows
of an architecture are timed interleaved with the bench's protocol; the kernels of one replay are counted; the two
outputs on the same pixels are compared. `--compile-only` compiles and exits (one process per architecture in
parallel first fills Inductor's disk caches for the timed run). Writes OUT_DIR/ARCH.json and prints one line per row.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from trtmc.backends.gelu_products import gelu_products
from trtmc.backends.inductor import feed_dtype
from trtmc.backends.inductor_lowerings import KERNEL, PLAIN, captured, lowering_candidates
from trtmc.backends.torch_lowering import patch_product_nodes

from probe_common import random_fp16_graph, timed_rows, write_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("archs", nargs="+")
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    for arch in args.archs:
        probe(arch, args.batch or [1, 128], args.out, args.compile_only)


def probe(arch: str, batches: list[int], out: Path, compile_only: bool) -> None:
    started = time.perf_counter()
    graph = random_fp16_graph(arch)
    patches = patch_product_nodes(graph)
    gelus = frozenset(gelu_products(graph, exclude=patches))  # as a build finds them (`compile_cuda`)
    print(f"{arch}: {len(gelus)} GELU products", flush=True)
    replays, outputs, seconds, kept = {}, {}, {}, []
    for batch in batches:
        candidates = lowering_candidates(graph, batch, gemm_templates=False, patches=patches)
        base = KERNEL if KERNEL in candidates else PLAIN
        pixels = torch.rand((batch, *graph.inputs[0].type.shape[1:]), device="cuda",
                            generator=torch.Generator("cuda").manual_seed(0))
        x = pixels.to(feed_dtype(graph), memory_format=torch.channels_last)
        for name, lowering in ((base, candidates[base]), (f"{base} + gelu products",
                                                            replace(candidates[base], gelus=gelus))):
            module = torch.compile(lowering.module(graph, torch.device("cuda")), dynamic=False)
            t0 = time.perf_counter()
            cuda_graph, output = captured(module, x)
            seconds[name, batch] = time.perf_counter() - t0
            replays[name, batch], outputs[name, batch] = cuda_graph.replay, output
            kept.append((module, cuda_graph, x))  # the replay reads their memory
            print(f"{arch} b{batch} {name}: compiled in {seconds[name, batch]:.0f} s "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    if compile_only:
        return
    # Each batch's first row, the lowering as a build keeps it, is the others' reference.
    rows = timed_rows(replays, outputs, lambda batch: next(k for k in outputs if k[1] == batch))
    for r in rows:
        key, base = (r["variant"], r["batch"]), (r["reference"], r["batch"])
        same = outputs[key].float().argmax(-1) == outputs[base].float().argmax(-1)
        r.update(same_top1=float(same.float().mean()), compile_s=round(seconds[key], 1))
        name, batch = key
        print(f"{arch} b{batch} {name}: {r['median_ms']} ms (spread {r['spread']:.1%}), {r['kernels']} kernels "
              f"{r['kernel_us']} us, diff from {r['reference']} {r['max_diff_vs_reference']:.1e}, top-1 agreement "
              f"{r['same_top1']:.2f}", flush=True)
    write_rows(out, arch, rows)


if __name__ == "__main__":
    main()
