"""1x1 convolutions as matrix products that Inductor's GEMM templates fuse with what follows them, on the GPU (issue 12).

    PYTHONPATH=src python3 tools/pointwise_probe.py OUT_DIR ARCH... [--batch N ...] [--variant SPEC ...]
        [--compile-only]

For each architecture (random weights, fp16, the graph `trtmc build` prepares) and batch size, compiles the
lowerings a build offers there (`lowering_candidates`: plain, cudnn-fused, depthwise-kernel, gemm-templates where
the graph has them) and variants of them: SPEC is a candidate's name, then `+pw` (its 1x1 convolutions as one
matrix product each, `pointwise_product_nodes`) and `+tmpl` (Inductor's Triton GEMM templates timed against
cuBLAS for every product, `GEMM_TEMPLATE_OPTIONS`, which leaves convolutions to cuDNN) and `+conv` (with `+tmpl`:
Inductor's Triton convolution templates timed against cuDNN for every convolution too, as run 38's first call did
before `GEMM_TEMPLATE_OPTIONS` kept them off), e.g. `plain+pw+tmpl`. Default: every candidate, and each one
with `+pw+tmpl`, and `plain+pw`. Each is compiled as the CUDA engine compiles it, replayed in a CUDA graph, all rows
of an architecture timed interleaved with the bench's protocol; the kernels of one replay are counted; every
output is compared with the first variant's on the same pixels. `--compile-only` compiles and exits (run one per
architecture in parallel first: Inductor's disk caches then make the timed run's compiles warm).
Writes OUT_DIR/ARCH.json and prints one line per row.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from trtmc.backends.inductor import feed_dtype
from trtmc.backends.inductor_lowerings import PLAIN, captured, lowering_candidates
from trtmc.backends.torch_lowering import patch_product_nodes, pointwise_product_nodes
from trtmc.bench.spec import TimingProtocol
from trtmc.bench.timing import CudaEventClock, TimedCall, time_interleaved

from probe_common import kernels, random_fp16_graph


def variant_lowering(spec: str, graph, batch: int):
    """The lowering SPEC names (`candidate[+pw][+tmpl]`) at `batch`."""
    name, *flags = spec.split("+")
    unknown = set(flags) - {"pw", "tmpl", "conv"}
    if unknown:
        raise SystemExit(f"{spec}: unknown flag(s) {', '.join(sorted(unknown))}; use +pw, +tmpl and +conv")
    candidates = lowering_candidates(graph, batch, patches=patch_product_nodes(graph))
    if name not in candidates:
        raise SystemExit(f"{spec}: {name!r} is not offered at batch {batch} ({', '.join(candidates)})")
    lowering = candidates[name]
    if "pw" in flags:
        lowering = replace(lowering, pointwise=pointwise_product_nodes(graph) - lowering.rewritten)
    if "tmpl" in flags:
        lowering = replace(lowering, gemm_templates=True)
    return lowering, ({"max_autotune_conv_backends": "ATEN,TRITON"} if "conv" in flags else {})


def default_variants(graph, batch: int) -> list[str]:
    names = list(lowering_candidates(graph, batch, patches=patch_product_nodes(graph)))
    return names + [f"{PLAIN}+pw"] + [f"{name}+pw+tmpl" for name in names if name != "gemm-templates"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("archs", nargs="+")
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--variant", action="append", help="only these (default: see above); the first is the reference")
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    for arch in args.archs:
        probe(arch, args.batch or [1], args.out, args.compile_only, args.variant)


def probe(arch: str, batches: list[int], out: Path, compile_only: bool, variants: list[str] | None) -> None:
    started = time.perf_counter()
    graph = random_fp16_graph(arch)
    device = torch.device("cuda")
    replays, outputs, compile_s, specs = {}, {}, {}, {}
    for batch in batches:
        specs[batch] = variants or default_variants(graph, batch)
        pixels = torch.rand((batch, *graph.inputs[0].type.shape[1:]), device=device,
                            generator=torch.Generator("cuda").manual_seed(0))
        example = pixels.to(feed_dtype(graph), memory_format=torch.channels_last)
        for spec in specs[batch]:
            lowering, extra = variant_lowering(spec, graph, batch)
            t0 = time.perf_counter()
            try:
                module = torch.compile(lowering.module(graph, device), dynamic=False,
                                       options={**lowering.inductor_options(), **extra} or None)
                cuda_graph, out_tensor = captured(module, example)
            except Exception as exc:  # a variant that does not compile is a result, not the end of the probe
                print(f"{arch} b{batch} {spec}: failed ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
                continue
            compile_s[spec, batch] = time.perf_counter() - t0
            replays[spec, batch] = (lambda g=cuda_graph, keep=(module, example, out_tensor): g.replay())
            outputs[spec, batch] = out_tensor
            print(f"{arch} b{batch} {spec}: compiled in {compile_s[spec, batch]:.1f} s "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    if compile_only:
        return
    outcome = time_interleaved({k: TimedCall(r, CudaEventClock()) for k, r in replays.items()}, TimingProtocol())
    rows = []
    for (spec, batch), replay in replays.items():
        timing = outcome.timings[spec, batch]
        reference = outputs[next(s for s in specs[batch] if (s, batch) in outputs), batch].float()
        table = kernels(replay)
        rows.append({
            "variant": spec, "batch": batch, "median_ms": round(timing.median_ms, 4),
            "spread": round(timing.spread, 4), "stable": timing.stable,
            "kernels": sum(r["count"] for r in table), "kernel_us": round(sum(r["us"] for r in table), 1),
            "max_diff_vs_reference": float((outputs[spec, batch].float() - reference).abs().max()
                                           / reference.abs().max()),
            "compile_s": round(compile_s[spec, batch], 1), "top": table[:12],
        })
        r = rows[-1]
        print(f"{arch} b{batch} {spec}: {r['median_ms']} ms (spread {r['spread']:.1%}), {r['kernels']} kernels "
              f"({r['kernel_us']} us), compiled in {r['compile_s']} s, diff {r['max_diff_vs_reference']:.1e}",
              flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{arch}.json").write_text(json.dumps({"arch": arch, "torch": torch.__version__,
                                                  "gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
