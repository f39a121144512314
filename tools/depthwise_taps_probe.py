"""Depthwise convolutions as sums of shifted taps that Inductor fuses, against cuDNN's, on the GPU (issue 12).

    PYTHONPATH=src python3 tools/depthwise_taps_probe.py OUT_DIR ARCH... [--batch N ...] [--variant NAME ...]
        [--compile-only]

For each architecture (random weights, fp16, the graph `trtmc build` prepares) and batch size, compiles the
graph as the CUDA inductor engine does, once per variant: each depthwise convolution one extern cuDNN call (which
Inductor cannot fuse into); every one not feeding a reduction as a sum of shifted taps (pointwise ops fused with
the bias, activation and concatenation around them); and the engine's choice at that batch size
(`depthwise_taps_nodes`, kernels up to 5x5 since run 16); and that choice with the 7x7 and 9x9 kernels as taps too
(the engine until run 16: mixnet_s's made its batch-1 compile 266 s of a 322 s build in run 15), or the 7x7 ones
only (mixnet_s's middle ground, not yet measured). Each is replayed
in a CUDA graph; all rows of an architecture are timed interleaved with the bench's protocol; the kernels of
one replay are counted; the two outputs on the same pixels are compared. `--compile-only` compiles and exits
(run one per architecture in parallel first: Inductor's disk caches then make the timed run's compiles warm).
The `triton depthwise` variants run the depthwise convolutions that are not taps as one Triton kernel each
(`trtmc.backends.depthwise_kernel`, a build candidate at batch 1 since run 21): every one, or those the engine
leaves to cuDNN. The variants run their patch embeddings as cuDNN's convolutions, as engines did until run 26, but
`the engine, patch products`, which runs the few-channel ones as one matrix product each (`patch_product_nodes`,
every CUDA lowering since run 26; run 26 measured vit_base_patch16_224 and convnext_tiny so).
Writes OUT_DIR/ARCH.json and prints one line per row.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from trtmc.backends.depthwise_kernel import depthwise_kernels
from trtmc.backends.torch_lowering import depthwise_taps_nodes, patch_product_nodes, to_fx

from probe_common import engine_replay, random_fp16_graph, timed_rows, write_rows

UNCAPPED = 9  # the widest depthwise kernel of the bench's networks (mixnet_s); the engine's choice until run 16

# Which depthwise convolutions run as taps: none (cuDNN's, the engine until run 9); every one not feeding a
# reduction, at any kernel size and batch (run 9's "depthwise taps" rows); the engine's choice at the row's batch
# size (kernels up to TAPS_MAX_KERNEL); that choice with the cap raised to 7x7 or lifted; and with taps feeding a
# norm too (the rule of runs 9-10), capped or not.
VARIANTS = {
    "cudnn depthwise": lambda graph, batch: frozenset(),
    "depthwise taps": lambda graph, batch: depthwise_taps_nodes(graph, 1, max_kernel=UNCAPPED),
    "the engine": depthwise_taps_nodes,
    "the engine, taps up to 7x7": lambda graph, batch: depthwise_taps_nodes(graph, batch, max_kernel=7),
    "the engine, taps up to 9x9": lambda graph, batch: depthwise_taps_nodes(graph, batch, max_kernel=UNCAPPED),
    # Taps feeding a layer norm too (runs 9-10; edgenext_small b1 1.21x the expert in run 10, 0.95x in run 18).
    "the engine, taps into norms": lambda graph, batch: depthwise_taps_nodes(graph, batch, into_norms=True),
    "taps into norms up to 9x9": lambda graph, batch: depthwise_taps_nodes(graph, batch, UNCAPPED, into_norms=True),
    # The same taps as the named variant; every other depthwise convolution on the Triton kernel, not cuDNN.
    "triton depthwise": lambda graph, batch: frozenset(),
    "the engine, the rest triton": depthwise_taps_nodes,
    # The engine's taps, and its patch embeddings as matrix products (`_patch_product`).
    "the engine, patch products": depthwise_taps_nodes,
    # The depthwise-kernel lowering as a build compiles it (taps, the rest on the Triton kernel, patch products;
    # commit 2932233's probe also timed it with only the patch embeddings of fewer than 8 channels as products, run 39).
    "depthwise kernel, patch products": depthwise_taps_nodes,
}
ON_TRITON = {"triton depthwise", "the engine, the rest triton", "depthwise kernel, patch products"}
WITH_PATCH_PRODUCTS = {"the engine, patch products", "depthwise kernel, patch products"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("archs", nargs="+")
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="only these variants (default: all); the first one is the others' reference")
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    for arch in args.archs:
        probe(arch, args.batch or [1, 128], args.out, args.compile_only, args.variant or list(VARIANTS))


def probe(arch: str, batches: list[int], out: Path, compile_only: bool, variants: list[str]) -> None:
    started = time.perf_counter()
    graph = random_fp16_graph(arch)
    replays, outputs, first_calls = {}, {}, {}
    for batch in batches:
        for name in variants:
            taps = VARIANTS[name](graph, batch)
            fusions = depthwise_kernels(graph, exclude=taps) if name in ON_TRITON else None
            patches = patch_product_nodes(graph) if name in WITH_PATCH_PRODUCTS else frozenset()
            module = to_fx(graph, quantized_gemms=True, depthwise_taps=taps, patch_products=patches, fusions=fusions)
            replays[name, batch], outputs[name, batch], first_calls[name, batch] = engine_replay(
                module, graph, batch, kernels=fusions)
            print(f"{arch} b{batch} {name}: compiled ({time.perf_counter() - started:.0f} s)", flush=True)
    if compile_only:
        return
    rows = timed_rows(replays, outputs, lambda batch: (variants[0], batch))
    for r in rows:
        name, batch = r["variant"], r["batch"]
        r["first_three_calls_s"] = round(first_calls[name, batch], 2)
        print(f"{arch} b{batch} {name}: {r['median_ms']} ms (spread {r['spread']:.1%}), {r['kernels']} kernels, "
              f"{r['first_three_calls_s']} s to compile, diff from {variants[0]} {r['max_diff_vs_reference']:.1e}",
              flush=True)
    write_rows(out, arch, rows)


if __name__ == "__main__":
    main()
