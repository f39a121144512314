"""GPU acceptance check: build CUDA bundles, classify the shared photos in a fresh process, time batch 1.

For each architecture: a checkpoint (the repo's real lite0, or random weights saved in the HF layout),
`trtmc build --device cuda --precision P` in a subprocess (build time), then a fresh process that opens
the bundle (load time, proving the Inductor caches make the first call warm), classifies the photos and
times the engine at batch 1 with CUDA events over CUDA-graph replays. The reference is trtmc's own
float32 graph run eagerly on the CPU (the "CPU fp32 result") and timm fp32 with the same weights.

    PYTHONPATH=src python tools/gpu_check.py --images DIR --out OUT [--precision fp16] ARCH ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LITE0 = REPO / "examples" / "checkpoints" / "tf_efficientnet_lite0.in1k"


def classify_in_fresh_process(bundle: Path, images: list[Path]) -> dict:
    """Runs in a child process: load, classify, time batch 1."""
    import numpy as np
    import torch

    from trtmc.runtime import Runtime
    from trtmc.tasks import image_to_class_scores

    t0 = time.perf_counter()
    runtime = Runtime.open(bundle)
    first = image_to_class_scores(runtime, [str(images[0])])
    first_call_s = time.perf_counter() - t0
    scores = image_to_class_scores(runtime, [str(p) for p in images])
    x = torch.randn((1,) + tuple(runtime.graph.inputs[0].type.shape[1:]), device="cuda")
    for _ in range(20):
        runtime.engine(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(200):
            runtime.engine(x)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 200)
    task_times = []
    for _ in range(20):
        t = time.perf_counter()
        image_to_class_scores(runtime, [str(images[0])])
        task_times.append((time.perf_counter() - t) * 1e3)
    return {
        "engine": runtime.choice.key,
        "skipped": runtime.skipped,
        "load_and_first_call_s": round(first_call_s, 2),
        "top1": np.argmax(scores.logits, -1).tolist(),
        "logits": scores.logits.tolist(),
        "engine_ms_batch1": round(sorted(times)[len(times) // 2], 4),
        "task_ms_batch1": round(sorted(task_times)[len(task_times) // 2], 3),
        "first_call_logits_ok": bool(np.allclose(first.logits[0], scores.logits[0], atol=1e-3)),
    }


def cpu_reference(folder: Path, images: list[Path], bundle: Path) -> dict:
    import torch

    from trtmc.backends.torch_lowering import GraphModule
    from trtmc.bundle import read_bundle
    from trtmc.checkpoint import Checkpoint
    from trtmc.families import build_graph
    from trtmc.passes.precision import PrecisionPolicy, assign_precision
    from trtmc.random_weights import load_timm_model
    from PIL import Image

    spec = read_bundle(bundle).preprocess
    pixels = torch.stack([spec.from_pil(Image.open(p)) for p in images])
    _, graph = build_graph(Checkpoint(folder), "fp32")
    with torch.no_grad():
        ours = GraphModule(assign_precision(graph, PrecisionPolicy("fp32")))(pixels)
        timm_logits = load_timm_model(folder)(pixels)
    return {"cpu_fp32_top1": ours.argmax(-1).tolist(), "timm_fp32_top1": timm_logits.argmax(-1).tolist(),
            "cpu_fp32_logits": ours.tolist()}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def build_and_check(arch: str, folder: Path, images: Path, precision: str, work: Path) -> dict:
    """Build in a subprocess, then classify in a fresh one; runs concurrently for several archs."""
    row: dict = {"arch": arch, "precision": precision}
    bundle = work / f"{arch}-{precision}.bundle"
    t = time.perf_counter()
    build = _run([sys.executable, "-m", "trtmc", "build", str(folder), "-o", str(bundle), "--device", "cuda",
                  "--precision", precision, "-q"])
    row["build_s"] = round(time.perf_counter() - t, 1)
    if build.returncode:
        row["error"] = build.stderr[-2000:]
    row["bundle"] = str(bundle)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("archs", nargs="+")
    parser.add_argument("--images", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--jobs", type=int, default=4, help="concurrent builds (Inductor compiles on the CPU)")
    parser.add_argument("--child", type=Path, nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    images = sorted(p for p in args.images.iterdir() if p.suffix in (".jpg", ".png"))
    if args.child:
        # One fresh process for all bundles: each still loads from its own bundle's caches.
        print(json.dumps({str(b): classify_in_fresh_process(b, images) for b in args.child}))
        return

    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from trtmc.random_weights import save_random_checkpoint

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/gpu_check")
    work.mkdir(parents=True, exist_ok=True)
    folders = {a: LITE0 if a == "tf_efficientnet_lite0" else save_random_checkpoint(a, work / a) for a in args.archs}
    # Phase 1: builds in parallel (cold Inductor compiles are CPU-bound).
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda a: build_and_check(a, folders[a], args.images, args.precision, work), args.archs))
    # Phase 2: one fresh process opens every bundle in turn, so load and latency are not contended.
    built = [row["bundle"] for row in rows if "error" not in row]
    child = _run([sys.executable, __file__, *args.archs, "--images", str(args.images), "--out", str(args.out),
                  "--child", *built])
    measured = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else {}
    if child.returncode:
        print(child.stderr[-3000:], flush=True)
    results = {}
    for row in rows:
        arch = row["arch"]
        if row["bundle"] in measured:
            gpu = measured[row["bundle"]]
            ref = cpu_reference(folders[arch], images, Path(row["bundle"]))
            g, c = np.array(gpu.pop("logits")), np.array(ref.pop("cpu_fp32_logits"))
            row.update(gpu)
            row.update(ref)
            row["top1_matches_cpu"] = sum(a == b for a, b in zip(gpu["top1"], ref["cpu_fp32_top1"]))
            row["top1_matches_timm"] = sum(a == b for a, b in zip(gpu["top1"], ref["timm_fp32_top1"]))
            row["max_abs_logit_diff_vs_cpu"] = float(np.abs(g - c).max())
            row["photos"] = len(images)
        elif "error" not in row:
            row["error"] = "not measured (see the child's error above)"
        results[arch] = row
        print(json.dumps({k: v for k, v in row.items() if k not in ("top1", "cpu_fp32_top1", "timm_fp32_top1", "bundle")}), flush=True)
    (args.out / f"gpu_check_{args.precision}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
