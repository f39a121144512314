"""Where trtmc's graph differs from timm's, before Inductor sees either (issue 12's entries behind the expert).

An experiment, not product code, that needs no GPU. For each model (timm random weights), fp16, batch 1:
trtmc's FX module exactly as the CUDA inductor engine prepares it (`_compile_cuda`: `to_fx(quantized_gemms=True)`,
channels-last convolution weights, pixels fed in `feed_dtype`) and the expert baseline's model (timm `.half()`,
channels-last, float32 logits) both go through `torch.export` and `run_decompositions({})`; the aten ops, with
their dtypes and memory layouts, are counted side by side. Writes OUT/ARCH.{trtmc,timm}.txt (every op) and
OUT/ARCH.summary.txt (the counts, differences marked), and prints the summaries.

    PYTHONPATH=src python3 tools/graph_diff.py /tmp/graph-diff mixnet_s swin_tiny_patch4_window7_224

benchmarks/NOTES.md (2026-12-02, day) reads its findings; fusion and kernel choice happen after this point and
need the GPU (tools/kernel_profile.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import torch

from trtmc.backends.inductor import feed_dtype
from trtmc.backends.torch_lowering import channels_last_weights, to_fx
from trtmc.bench.baselines import Float32Logits
from trtmc.build import prepare_graph
from trtmc.checkpoint import Checkpoint
from trtmc.graph import DType
from trtmc.passes.precision import PrecisionPolicy, assign_precision
from trtmc.random_weights import RandomWeights, load_timm_model, save_random_checkpoint


def trtmc_module(folder: Path):
    """(module, example input, typed graph) as the CUDA inductor engine compiles them, on the CPU."""
    typed = assign_precision(prepare_graph(Checkpoint(folder), "fp16").graph, PrecisionPolicy("fp16"))
    module = channels_last_weights(to_fx(typed, quantized_gemms=True).eval(), typed)
    x = torch.randn((1, *typed.inputs[0].type.shape[1:])).to(feed_dtype(typed), memory_format=torch.channels_last)
    return module, x, typed


def timm_module(folder: Path):
    """(module, example input) of the expert baseline: timm in fp16, channels-last, float32 logits."""
    model = load_timm_model(folder).half().eval().to(memory_format=torch.channels_last)
    c, h, w = Checkpoint(folder).config.pretrained.input_size
    return Float32Logits(model).eval(), torch.randn(1, c, h, w).half().contiguous(memory_format=torch.channels_last)


def export(module, x):
    with torch.no_grad():
        return torch.export.export(module, (x,), strict=False).run_decompositions({})


def dt(v):
    return str(v.dtype).replace("torch.", "") if isinstance(v, torch.Tensor) else type(v).__name__


def layout(v):
    if not isinstance(v, torch.Tensor):
        return "-"
    if v.dim() == 4:
        if v.is_contiguous(memory_format=torch.channels_last) and not v.is_contiguous():
            return "CL"
        if v.is_contiguous():
            return "NCHW" if not v.is_contiguous(memory_format=torch.channels_last) else "both"
        return "strided"
    return "contig" if v.is_contiguous() else "strided"


def val(n):
    return n.meta.get("val") if hasattr(n, "meta") else None


def describe(ep):
    g = ep.graph_module.graph
    lines, ops = [], []
    for n in g.nodes:
        if n.op != "call_function":
            continue
        name = str(n.target).replace("aten.", "")
        ins = [a for a in n.args if isinstance(a, torch.fx.Node)]
        for a in n.args:
            if isinstance(a, (list, tuple)):
                ins += [b for b in a if isinstance(b, torch.fx.Node)]
        out = val(n)
        outv = out[0] if isinstance(out, (tuple, list)) and out else out
        in_desc = [f"{dt(val(a))}{list(val(a).shape) if isinstance(val(a), torch.Tensor) else ''}/{layout(val(a))}" for a in ins]
        consts = [a for a in n.args if not isinstance(a, (torch.fx.Node,)) and not (isinstance(a, (list, tuple)) and any(isinstance(b, torch.fx.Node) for b in a))]
        kw = {k: v for k, v in n.kwargs.items() if not isinstance(v, torch.fx.Node)}
        shape = list(outv.shape) if isinstance(outv, torch.Tensor) else ""
        lines.append(f"{n.name}: {name} in={in_desc} consts={consts} kw={kw} -> {dt(outv)}{shape}/{layout(outv)}")
        ops.append((n, name, ins, consts, kw, outv))
    return lines, ops


def summarize(ops):
    s = collections.OrderedDict()
    s["op_counts"] = collections.Counter(name for _, name, *_ in ops)
    convs, mms, norms, casts, sdpa, cat = collections.Counter(), collections.Counter(), collections.Counter(), collections.Counter(), collections.Counter(), collections.Counter()
    layouts = collections.Counter()
    for n, name, ins, consts, kw, outv in ops:
        base = name.split(".")[0]
        if base in ("convolution", "conv2d"):
            w = val(ins[1])
            if base == "convolution":
                stride, _, dilation, _, _, groups = n.args[3:9]
            else:
                a = list(n.args) + [None] * 7
                stride, dilation, groups = a[3] or (1, 1), a[5] or (1, 1), a[6] or 1
            cin = val(ins[0]).shape[1]
            dense = "dw" if groups == cin and groups > 1 else ("grouped" if groups > 1 else "dense")
            convs[(tuple(w.shape[2:]), tuple(stride), tuple(dilation), f"g={groups}({dense})", dt(val(ins[0])), layout(val(ins[0])))] += 1
            convs[("conv bias folded in", "bias" if len(ins) > 2 else "nobias")] += 1
        elif base in ("mm", "addmm", "bmm", "linear", "matmul", "baddbmm", "_scaled_mm", "_int_mm"):
            mms[(base, tuple(dt(val(a)) for a in ins), dt(outv))] += 1
        elif base in ("_softmax", "softmax", "native_layer_norm", "group_norm", "native_batch_norm", "layer_norm", "_native_batch_norm_legit_no_training", "native_group_norm", "batch_norm", "_log_softmax", "var_mean", "mean", "sum", "amax", "sqrt", "rsqrt", "div"):
            norms[(base, tuple(dt(val(a)) for a in ins), dt(outv))] += 1
        elif base in ("_to_copy", "to", "_to_dtype") or (base == "clone" and "memory_format" in kw):
            src = dt(val(ins[0]))
            d = kw.get("dtype")
            d = str(d).replace("torch.", "") if d is not None else src
            key = f"{src}->{d}" if src != d else f"same-dtype({src}) layout {layout(val(ins[0]))}->{layout(outv)} kw={kw}"
            casts[(base, key, tuple(val(ins[0]).shape))] += 1
        elif "scaled_dot_product" in base or "flash" in base or "efficient_attention" in base:
            sdpa[(base, tuple(dt(val(a)) for a in ins))] += 1
        elif base == "cat":
            cat[(len(ins), tuple(sorted(set(dt(val(a)) for a in ins))), n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0), tuple(layout(val(a)) for a in ins))] += 1
        if base in ("clone", "contiguous", "permute", "view", "_unsafe_view", "reshape", "expand", "transpose", "t", "cat", "split", "split_with_sizes", "slice", "narrow", "unsqueeze", "squeeze", "select", "as_strided", "index", "roll", "constant_pad_nd", "pad", "copy", "_to_copy", "clone"):
            layouts[base] += 1
    s["convolutions (k, stride, dil, groups, in dtype, in layout)"] = convs
    s["matmuls (op, in dtypes, out dtype)"] = mms
    s["norm/softmax/reductions (op, in dtypes, out dtype)"] = norms
    s["casts / layout copies (op, dtype change, shape)"] = casts
    s["attention"] = sdpa
    s["cat (n inputs, dtypes, dim)"] = cat
    s["data-movement op counts"] = layouts
    return s


def compare(arch: str, out: Path) -> str:
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_random_checkpoint(arch, Path(tmp) / arch, RandomWeights(seed=0))
        ours, x, typed = trtmc_module(folder)
        theirs, y = timm_module(folder)
        ours_lines, ours_ops = describe(export(ours, x))
        their_lines, their_ops = describe(export(theirs, y))
    (out / f"{arch}.trtmc.txt").write_text("\n".join(ours_lines))
    (out / f"{arch}.timm.txt").write_text("\n".join(their_lines))
    a_sum, b_sum = summarize(ours_ops), summarize(their_ops)
    report = [f"=== {arch} (trtmc graph: {len(typed.nodes)} ops; aten ops trtmc={len(ours_ops)} timm={len(their_ops)}; "
              f"{time.time() - started:.0f} s)",
              "trtmc graph op kinds: " + json.dumps(typed.op_counts()),
              "trtmc fp32 ops (by kind): " + json.dumps(collections.Counter(n.kind.value for n in typed.nodes if n.type.dtype is DType.F32))]
    for key in a_sum:
        a, b = a_sum[key], b_sum[key]
        report.append(f"-- {key}")
        for k in sorted(set(a) | set(b), key=str):
            mark = "" if a.get(k, 0) == b.get(k, 0) else "  <-- DIFF"
            report.append(f"    trtmc={a.get(k, 0):4d} timm={b.get(k, 0):4d}  {k}{mark}")
    text = "\n".join(report)
    (out / f"{arch}.summary.txt").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for arch in args.models:
        print(compare(arch, args.out), flush=True)


if __name__ == "__main__":
    main()
