"""Where a quick start's first call goes (issue 10): the uncompiled CUDA graph's first call, profiled.

    python3 tools/first_call_probe.py BUNDLE OUT.json [--layout channels-last|nchw] [--cudnn on|off-for-grouped]

Run 7 measured the quick start's first batch-1 call at 0.45 s for resnet50, 2.3-3.4 s for lite0 and 6.2 s
for ghostnet_100: seconds that no later call pays. The suspect is cuDNN choosing (and, for some kernels,
compiling) an execution plan the first time it meets each convolution shape; ghostnet_100 and lite0 have
many depthwise shapes, which in channels-last fp16 go to cuDNN, while in NCHW PyTorch runs most of them
with kernels of its own. Run once per layout, each in a fresh process (cuDNN's plan cache lives in the
process). Writes the import, load and first / second call seconds, the distinct convolution shapes, and
torch.profiler's 15 ops with the most CPU time in the first call.

Run 8 (2026-12-02) found the suspect right and the layout irrelevant: `aten::cudnn_convolution` took 6.6 of
ghostnet_100's 6.8 s (63 distinct convolutions, 41 depthwise), 3.1 of lite0's 3.2 s and 0.28 of resnet50's
0.36 s, in NCHW as in channels-last. Dense shapes cost ~12 ms each, depthwise ones ~0.2 s. `--cudnn
off-for-grouped` runs the grouped (depthwise) convolutions with cuDNN disabled, so PyTorch's own CUDA kernels
take them (precompiled: nothing to choose or compile on first use); it also times a warm batch of 64, since
those kernels may be slower than cuDNN's once warm. Run 9 measured it (first calls 4.54 -> 0.41 s for
ghostnet_100, 2.26 -> 0.33 s for lite0; warm batch 64 5.3 -> 6.4 ms and 4.4 -> 6.6 ms), and the quick start
now runs that way (`trtmc.backends.inductor.grouped_convolutions_without_cudnn`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

STARTED = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layout", choices=("channels-last", "nchw"), default="channels-last")
    parser.add_argument("--cudnn", choices=("on", "off-for-grouped"), default="on")
    parser.add_argument("--device", default="cuda", help="cpu only to try the probe out on a machine without a GPU")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from trtmc.backends import LoadOptions
    from trtmc.backends.inductor import feed_dtype, grouped_convolutions_without_cudnn
    from trtmc.backends.torch_lowering import channels_last_weights, to_fx
    from trtmc.graph import OpKind
    from trtmc.runtime import Runtime

    imported = time.perf_counter() - STARTED
    runtime = Runtime.open(args.bundle, options=LoadOptions(quick_start=True))
    graph = runtime.graph
    module = to_fx(graph, quantized_gemms=True).eval().to(args.device)
    layout = torch.channels_last if args.layout == "channels-last" else torch.contiguous_format
    if args.layout == "channels-last":
        module = channels_last_weights(module, graph)
    if args.cudnn == "off-for-grouped":
        module = grouped_convolutions_without_cudnn(module)
    pixels = torch.rand((1, *graph.inputs[0].type.shape[1:]), device=args.device)
    x = pixels.to(feed_dtype(graph), memory_format=layout)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    loaded = time.perf_counter() - STARTED

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        module(x)
        sync()
        first = time.perf_counter() - started
    with torch.no_grad():
        started = time.perf_counter()
        module(x)
        sync()
        second = time.perf_counter() - started
        batch = pixels.expand(64, -1, -1, -1).to(feed_dtype(graph), memory_format=layout)
        module(batch)  # the first batch of 64: shapes that are new again
        sync()
        started = time.perf_counter()
        module(batch)
        sync()
        warm_batch64 = time.perf_counter() - started

    convs = [n for n in graph.nodes if n.kind is OpKind.CONV2D]
    shapes = {(graph.node(n.inputs[0]).type.shape, n.attrs.groups, graph.weights[n.attrs.weight].shape, n.attrs.stride) for n in convs}
    top = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    record = {
        "bundle": str(args.bundle),
        "layout": args.layout,
        "cudnn": args.cudnn,
        "torch": torch.__version__,
        "cudnn_version": torch.backends.cudnn.version(),
        "imports_s": round(imported, 3),
        "loaded_s": round(loaded, 3),
        "first_call_s": round(first, 4),
        "second_call_s": round(second, 5),
        "warm_batch64_call_s": round(warm_batch64, 5),
        "convolutions": len(convs),
        "depthwise": sum(1 for n in convs if n.attrs.groups > 1),
        "distinct_convolutions": len(shapes),
        "top_self_cpu": [{"op": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2)} for e in top],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "top_self_cpu"}))


if __name__ == "__main__":
    main()
