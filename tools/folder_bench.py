"""Issue 10's folder measurements on the GPU machine, in one call: files in, results out.

1. `trtmc bench`'s folder scope for the repo's real tf_efficientnet_lite0 (fp16, max batch 64): folders of
   2,002 and 20,000 files (the 22 shipped photos copied round-robin), each classified by trtmc's
   `classify_files` and by the hand-written DataLoader + torch.compile baseline, each side in a fresh
   process: images/s, their ratio, peak RSS, every file's top-1 against timm's. `--no-baselines` leaves
   out the engine-scope baselines (their compiles), not the folder scope's DataLoader baseline.
2. A Ray Data run over the 2,002-file folder with the bundle step 1 built:
   `ray.data.read_images(..., mode="RGB")` -> `map_batches(trtmc.ray.CropImages(bundle))` (fused into the read
   tasks) -> `map_batches(trtmc.ray.ClassifyBatch, ...)` on --ray-actors actors sharing --ray-gpus GPUs,
   images/s over the whole run and from its first result on, top-1 against timm's per photo, and Ray's own
   operator lines (how it fused the stages); skipped, with the reason in ray.json, where `import ray` fails.

Everything lands in --out: bench/results.{json,md} and bench.log (step 1), ray.json (step 2), summary.txt
(both). The folders and the bundle go to --workdir (about 2 GB for 20,000 files).

    PYTHONPATH=src python3 tools/folder_bench.py --out $OUT/folder --workdir /tmp/folderbench
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LITE0 = REPO / "examples" / "checkpoints" / "tf_efficientnet_lite0.in1k"
NAME = "tf_efficientnet_lite0"  # the bench entry's name: its bundle is bundles/NAME-PRECISION-BACKEND.bundle


def run_bench(args, out: Path) -> int:
    """Step 1: `trtmc bench` in a process of its own, its output in bench.log."""
    command = [sys.executable, "-m", "trtmc", "bench", "--model", str(LITE0), "--name", NAME,
               "--precision", args.precision, "--batch", str(args.batch), "--device", args.device,
               "--backend", args.backend, "--no-baselines", "--folder-baseline", args.folder_baseline,
               "--out", str(out / "bench"), "--workdir", str(args.workdir)]
    for count in args.images:
        command += ["--folder-images", str(count)]
    if args.reuse_bundle:
        command.append("--reuse-prepared")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p))
    print("$ " + " ".join(command), flush=True)
    with open(out / "bench.log", "w") as log:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode


def ray_run(args, out: Path) -> dict:
    """Step 2: Ray Data over the smallest folder with step 1's bundle; a dict for ray.json."""
    try:
        import ray
    except ImportError as exc:
        return {"skipped": f"`import ray` failed ({exc}); install Ray with `pip install 'trtmc[ray]'` to run this step"}
    from trtmc.bench.folder import build_folder
    from trtmc.bench.oracle import photo_files
    from trtmc.ray import ClassifyBatch, CropImages

    bundle = args.workdir / "bundles" / f"{NAME}-{args.precision}-{args.backend}.bundle"
    if not bundle.is_file():
        return {"skipped": f"{bundle}: no bundle (step 1 builds it; see bench.log)"}
    photos = photo_files()
    folder = build_folder(photos, min(args.images), args.workdir)  # the folder step 1 built, reused
    timm_top1 = _timm_top1(out)
    expected = {path.name: timm_top1.get(photos[p].name) for path, p in zip(folder.files, folder.photos)}

    logging.getLogger("ray").setLevel(logging.WARNING)
    # On a CPU machine the actors take two cores each: enough logical CPUs that the read tasks can run beside
    # them (on 2 cores, Ray Data would wait for ever for a free CPU).
    cpus = None if args.ray_gpus else max(os.cpu_count() or 1, 2 * args.ray_actors + 2)
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    started = time.perf_counter()
    ds = ray.data.read_images(str(folder.path), mode="RGB", include_paths=True)
    ds = ds.map_batches(CropImages(str(bundle)))  # no batch_size: Ray runs it inside the read tasks
    # The actors ask for other resources than the tasks (GPUs; on CPUs alone, two cores), or Ray would fuse
    # the crop into them.
    resources = {"num_gpus": args.ray_gpus / args.ray_actors} if args.ray_gpus else {"num_cpus": 2}
    ds = ds.map_batches(
        ClassifyBatch,
        fn_constructor_kwargs={"bundle": str(bundle), "top_k": 5},
        compute=ray.data.ActorPoolStrategy(size=args.ray_actors),
        batch_size=args.batch,
        **resources,
    )
    ds = ds.select_columns(["path", "top_indices"])
    rows = agree = 0
    first = None
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        if first is None:
            first, first_rows = time.perf_counter(), len(batch["path"])
        for path, top in zip(batch["path"], batch["top_indices"]):
            rows += 1
            agree += int(top[0]) == expected.get(Path(str(path)).name)
    seconds = time.perf_counter() - started
    after_first = time.perf_counter() - first if first is not None else None
    operators = [line.strip() for line in ds.stats().splitlines() if line.startswith("Operator")]
    ray.shutdown()
    return {
        "images": len(folder.files),
        "rows": rows,
        "seconds": round(seconds, 2),
        "images_per_s": round(rows / seconds, 1),
        # from the first result on: the actor has loaded the bundle and compiled by then
        "images_per_s_after_first_batch": None if not after_first else round((rows - first_rows) / after_first, 1),
        "top1_equal_to_timm": agree,
        "batch_size": args.batch,
        "actors": args.ray_actors,
        "num_gpus": args.ray_gpus,
        "ray": ray.__version__,
        "pipeline": "read_images -> CropImages (in the read tasks) -> ClassifyBatch actors",
        "operators": operators,
        "bundle": str(bundle),
        "folder": str(folder.path),
    }


def _timm_top1(out: Path) -> dict[str, int]:
    """timm fp32's top-1 per photo, from step 1's results.json (the oracle's reference)."""
    try:
        entry = json.loads((out / "bench" / "results.json").read_text())["entries"][0]
        return {name: top5[0] for name, top5 in entry["oracle"]["top5"].items()}
    except (OSError, KeyError, IndexError, TypeError, ValueError):
        return {}


def summary(out: Path, ray_result: dict) -> str:
    lines = []
    try:
        entry = json.loads((out / "bench" / "results.json").read_text())["entries"][0]
        lines.append(f"bench entry {entry['name']}: {entry['status']} {entry['message']}".rstrip())
        for run in entry["folder_runs"]:
            for side in (run["trtmc"], run["baseline"]):
                lines.append(
                    f"  {run['images']:6d} files  {side['label']:40s} {side['status']:6s} "
                    f"{side['images_per_s'] or 0:9.1f} images/s  peak RSS {side['peak_rss_mib'] or 0:8.1f} MiB  "
                    f"with workers {side['tree_peak_rss_mib'] or 0:8.1f} MiB  workers {side['workers']}  "
                    f"batch {side['batch']}  {side['error'] or ''}"
                )
            lines.append(f"  {run['images']:6d} files  trtmc / baseline: {run['ratio']}")
    except (OSError, KeyError, IndexError, ValueError) as exc:
        lines.append(f"bench: no results ({type(exc).__name__}: {exc}); see bench.log")
    if "skipped" in ray_result or "error" in ray_result:
        lines.append(f"ray: {', '.join(f'{k}: {v}' for k, v in ray_result.items())}")
    else:
        lines.append(f"ray: {ray_result['rows']} of {ray_result['images']} files, {ray_result['images_per_s']} images/s "
                     f"({ray_result['seconds']} s in all), {ray_result['images_per_s_after_first_batch']} images/s after "
                     f"the first batch, top-1 equal to timm's on {ray_result['top1_equal_to_timm']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "folder-bench")), help="output folder")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/folderbench"), help="folders and bundles")
    parser.add_argument("--images", type=int, action="append", help="folder sizes (default: 2002 and 20000)")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--batch", type=int, default=64, help="the engine's max batch, the DataLoader's and Ray's batch")
    parser.add_argument("--device", default="cuda", help="cpu runs the same steps on a CPU machine (a smoke test)")
    parser.add_argument("--backend", default="inductor", help="the engine trtmc builds (reference: nothing to compile)")
    parser.add_argument("--folder-baseline", default="compile", choices=["compile", "eager"],
                        help="how the DataLoader baseline runs timm (eager: no compile, for a smoke test)")
    parser.add_argument("--skip-bench", action="store_true", help="only the Ray step (reusing an earlier step 1)")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--reuse-bundle", action="store_true",
                        help="use the bundle an earlier call left in --workdir instead of building it again")
    parser.add_argument("--ray-gpus", type=float, default=1.0, help="GPUs the Ray actors share (0 on a CPU machine)")
    parser.add_argument("--ray-actors", type=int, default=1, help="Ray actors (each opens the bundle once)")
    parser.add_argument("--ray-json", default="ray.json", help="file name of the Ray step's result in --out")
    args = parser.parse_args()
    args.images = args.images or [2002, 20000]
    args.out.mkdir(parents=True, exist_ok=True)
    code = 0
    if not args.skip_bench:
        code = run_bench(args, args.out)
        print(f"trtmc bench exited with status {code}; log in {args.out / 'bench.log'}", flush=True)
    try:
        ray_result = {"skipped": "--skip-ray"} if args.skip_ray else ray_run(args, args.out)
    except Exception as exc:  # the bench's results still get their summary
        logging.exception("the Ray step failed")
        ray_result = {"error": f"{type(exc).__name__}: {exc}"}
    (args.out / args.ray_json).write_text(json.dumps(ray_result, indent=1) + "\n")
    text = summary(args.out, ray_result)
    (args.out / "summary.txt").write_text(text)
    print(text, end="")
    return code


if __name__ == "__main__":
    sys.exit(main())
