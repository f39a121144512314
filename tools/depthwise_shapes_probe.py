"""Which depthwise convolutions take cuDNN's slow path, and what runs them faster (issue 12, ghostnet_100 batch 128).

An experiment, not product code: one measurement on the GPU, eager, no compile (about a minute).
Run 3 found 2 of ghostnet_100's 40 depthwise convolutions in cuDNN's `conv2d_grouped_direct_kernel` at batch 128
(561 us of the 2.75 ms; the other 38 average 16 us in `conv2d_c1_k1_nhwc_specialized`). The fused Triton kernel
that replaced all of them lost (run 8), so this looks at the shapes one by one.

For each distinct depthwise convolution of each model (timm random weights, the graph trtmc builds, fp16), at each
batch size, it times with the bench protocol (rounds of back-to-back calls, CUDA events):
- `cl`: as the engine runs it, channels-last input and weight (cuDNN);
- `nchw`: the same convolution on a contiguous (NCHW) copy of the input, the copies both ways included;
- `stride1`: a strided convolution as its stride-1 form (padding unchanged), subsampled afterwards: more
  arithmetic, but possibly cuDNN's fast kernel. Same values (each output pixel is the same sum);
and names the kernel cuDNN runs for `cl` (torch.profiler). Writes OUT.json and prints one line per shape.

    PYTHONPATH=src python3 tools/depthwise_shapes_probe.py OUT.json ghostnet_100 --batch 1 --batch 128
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from trtmc.bench.spec import TimingProtocol
from trtmc.bench.timing import CudaEventClock, HostClock, TimedCall, time_interleaved
from trtmc.build import prepare_graph
from trtmc.checkpoint import open_checkpoint
from trtmc.graph import OpKind
from trtmc.random_weights import save_random_checkpoint


def depthwise_shapes(arch: str) -> dict[tuple, int]:
    """(channels, height, width, kernel, stride, padding) -> how many of the model's convolutions have it."""
    with tempfile.TemporaryDirectory() as tmp:
        graph = prepare_graph(open_checkpoint(save_random_checkpoint(arch, Path(tmp) / arch)), "fp16").graph
    shapes: dict[tuple, int] = {}
    for node in graph.nodes:
        if node.kind is not OpKind.CONV2D:
            continue
        _, channels, height, width = graph.node(node.inputs[0]).type.shape
        if node.attrs.groups != channels or channels == 1:
            continue
        kernel = graph.weights[node.attrs.weight].shape[2]
        key = (channels, height, width, kernel, tuple(node.attrs.stride), tuple(node.attrs.padding))
        shapes[key] = shapes.get(key, 0) + 1
    return shapes


def variants(channels, height, width, kernel, stride, padding, batch, device, dtype):
    x = torch.randn(batch, channels, height, width, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(channels, 1, kernel, kernel, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    top, left, bottom, right = padding  # Conv2dAttrs' order; TF "SAME" is asymmetric, padded first as the engine does
    symmetric = (top, left) == (bottom, right)
    x_padded = x if symmetric else F.pad(x, (left, right, top, bottom))
    pad = (top, left) if symmetric else (0, 0)
    conv = lambda inp, s: F.conv2d(inp, w, None, s, pad, 1, channels)  # noqa: E731
    rows = {
        "cl": lambda: conv(x_padded, stride),
        "nchw": lambda: conv(x_padded.contiguous(), stride).contiguous(memory_format=torch.channels_last),
    }
    if stride != (1, 1):
        rows["stride1"] = lambda: conv(x_padded, (1, 1))[:, :, :: stride[0], :: stride[1]]
    return rows


def cudnn_kernel(fn, device: str) -> str:
    if device != "cuda":
        return "-"
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return next((n for n in names if "conv" in n.lower()), names[0] if names else "?")[:100]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 1 and 128)")
    parser.add_argument("--device", default="cuda", help="cpu (float32) only to try the probe out without a GPU")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    dtype, clock = (torch.float16, CudaEventClock()) if cuda else (torch.float32, HostClock())
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else "cpu",
              "cudnn": torch.backends.cudnn.version(), "models": {}}
    for arch in args.models:
        rows_out = []
        for shape, count in depthwise_shapes(arch).items():
            for batch in args.batch or [1, 128]:
                rows = variants(*shape, batch, args.device, dtype)
                with torch.no_grad():
                    reference = rows["cl"]().float()
                    agree = {k: float((fn().float() - reference).abs().max()) for k, fn in rows.items()}
                    outcome = time_interleaved({k: TimedCall(fn, clock) for k, fn in rows.items()}, TimingProtocol())
                    kernel = cudnn_kernel(rows["cl"], args.device)
                row = {"shape": dict(zip(("channels", "height", "width", "kernel", "stride", "padding"), shape)),
                       "count": count, "batch": batch, "cudnn_kernel": kernel, "max_abs_difference": agree,
                       "us": {k: round(t.median_ms * 1e3, 2) for k, t in outcome.timings.items()},
                       "errors": dict(outcome.errors)}
                rows_out.append(row)
                print(arch, shape, "x", count, f"b{batch}", row["us"], kernel[:60], flush=True)
        result["models"][arch] = rows_out
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))  # after every model: a timeout keeps what ran


if __name__ == "__main__":
    main()
