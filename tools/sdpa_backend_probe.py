"""Which of torch's attention kernels run each ATTENTION op of trtmc's fp16 graph (an experiment, GPU only).

For every distinct attention (q, k, v shapes and a bias or not) in the graph of each model (timm random weights,
batch 1): which backends accept it when forced one at a time (`torch.nn.attention.sdpa_kernel`: flash,
efficient, cuDNN, math) and their time per call, and the kernels `F.scaled_dot_product_attention` runs
left to choose, eager and under `torch.compile`. The question it answers (benchmarks/NOTES.md, run 18, behind):
do edgenext's cross-covariance attentions, whose head_dim is the image's token count, fall to the math
path's float32 GEMMs?

    PYTHONPATH=src python3 tools/sdpa_backend_probe.py OUT.json edgenext_small mobilevit_s
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from trtmc.build import prepare_graph
from trtmc.checkpoint import Checkpoint
from trtmc.graph import OpKind
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.random_weights import save_random_checkpoint

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def attentions(arch: str, folder: Path) -> dict[tuple, str]:
    """(q shape, k shape, v shape, has a bias) -> the first node name, for each distinct ATTENTION op."""
    graph = assign_precision(prepare_graph(Checkpoint(save_random_checkpoint(arch, folder)), "fp16").graph,
                             PrecisionPolicy("fp16"))
    found = {}
    for n in graph.nodes:
        if n.kind is OpKind.ATTENTION:
            key = tuple(tuple(graph.node(i).type.shape) for i in n.inputs) + (n.attrs.bias is not None,)
            found.setdefault(key, n.name)
    return found


def ms_per_call(fn, calls: int = 200) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name[:100] for e in prof.events() if e.device_type.name == "CUDA"]


def probe(key: tuple) -> dict:
    q_shape, k_shape, v_shape, biased = key
    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(s, device="cuda", dtype=torch.float16, generator=gen) for s in (q_shape, k_shape, v_shape))
    bias = torch.randn((1, q_shape[1], q_shape[2], k_shape[2]), device="cuda", dtype=torch.float16) if biased else None

    def call():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    row = {"q": q_shape, "k": k_shape, "v": v_shape, "bias": biased, "forced_ms": {}, "refused": {}}
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel([backend]):
                row["forced_ms"][name] = round(ms_per_call(call), 4)
        except RuntimeError as exc:
            row["refused"][name] = str(exc).splitlines()[0][:200]
    row["eager_kernels"] = kernel_names(call)
    compiled = torch.compile(call)
    row["compiled_kernels"] = kernel_names(compiled)
    row["compiled_ms"] = round(ms_per_call(compiled), 4)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("archs", nargs="+")
    args = parser.parse_args()
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs:
            rows = []
            for key, name in attentions(arch, Path(tmp) / arch).items():
                rows.append({"first": name, **probe(key)})
                print(arch, json.dumps(rows[-1]), flush=True)
            report["models"][arch] = rows
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
