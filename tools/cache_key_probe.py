"""Why a bundle's Inductor caches miss when it loads (issue 12): every run's vit_base_patch16_224 load compiles
again (run 15: "loaded inductor-cuda-fp16 in 15.5 s (Inductor's graph cache: 0 hits, 2 misses)"), while all 13
other entries of run 15 hit. On the CPU, the same graph's keys match between two processes (benchmarks/NOTES.md,
tenth session), so the difference is on the GPU.

    PYTHONPATH=src python3 tools/cache_key_probe.py OUT_DIR ARCH [--device cuda] [--max-batch 128]

Builds ARCH (random weights, fp16) as a bench prepare process does (one torch thread, 4 compile workers) in one
process, then opens the bundle and warms its engine up in a second process with Inductor and Triton disk caches of
its own (a user's fresh process: only the bundle's caches answer). In both, every FX graph cache key Inductor
computes, and every AOTAutograd cache key (of Dynamo's graph, looked up first), is written with the details it
hashed (OUT_DIR/build-keys.json, load-keys.json) beside Inductor's and AOTAutograd's cache counters. Prints each key
the load computed that the build did not, with the hashed details that differ from the build's key of the same
graph (same kind, same position in compile order); OUT_DIR/diff.txt holds the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def record_keys(path: Path) -> None:
    """From now on, every cache key this process computes, AOTAutograd's (of Dynamo's graph) and Inductor's FX graph
    cache's (of the graph after AOTAutograd), goes to `path` with the details it hashed, and at exit Inductor's and
    AOTAutograd's cache counters."""
    import atexit

    import torch._functorch._aot_autograd.autograd_cache as autograd_cache
    import torch._inductor.codecache as codecache
    from torch._dynamo.utils import counters

    keys: list[dict] = []

    def spy(module, name: str, kind: str) -> None:
        original = getattr(module, name)

        def computing(*args, **kwargs):
            key, lines = original(*args, **kwargs)
            keys.append({"kind": kind, "key": key, "details": lines})
            return key, lines

        setattr(module, name, computing)

    spy(autograd_cache, "autograd_cache_key", "aot_autograd")
    spy(codecache, "compiled_fx_graph_hash", "fx_graph")

    def write() -> None:
        path.write_text(json.dumps({"keys": keys, "inductor": dict(counters["inductor"]),
                                    "aot_autograd": dict(counters["aot_autograd"])}, indent=1))

    atexit.register(write)


def build(out: Path, arch: str, device: str, max_batch: int) -> None:
    import torch
    import torch._inductor.config as inductor_config

    from trtmc.bench import oracle
    from trtmc.bench.sources import resolve_source
    from trtmc.build import BuildRequest, build_bundle

    torch.set_num_threads(1)  # as `bench.prepare` runs a build beside 13 others
    inductor_config.compile_threads = 4
    record_keys(out / "build-keys.json")
    source = resolve_source(arch, "random", out / "work", 0, oracle.photo_files())
    request = BuildRequest(model=source.build_model, output=out / f"{arch}.bundle", precision="fp16", device=device,
                           backends=("inductor",), max_batch=max_batch)
    build_bundle(request, lambda message: print(f"build: {message}", flush=True))


def load(out: Path, arch: str) -> None:
    import time

    from trtmc.backends.inductor import describe_cache_use, graph_cache_counts
    from trtmc.runtime import Runtime

    record_keys(out / "load-keys.json")
    started, before = time.perf_counter(), graph_cache_counts()
    runtime = Runtime.open(out / f"{arch}.bundle", engine="inductor")
    runtime.engine.warm_up()
    seconds = time.perf_counter() - started
    print(f"load: {runtime.choice.key} in {seconds:.1f} s{describe_cache_use(before)}", flush=True)


def differences(out: Path) -> list[str]:
    built = json.loads((out / "build-keys.json").read_text())
    loaded = json.loads((out / "load-keys.json").read_text())
    lines = [f"build counters: {built['inductor']} {built['aot_autograd']}",
             f"load counters: {loaded['inductor']} {loaded['aot_autograd']}"]
    for kind in ("aot_autograd", "fx_graph"):
        theirs = [k for k in built["keys"] if k["kind"] == kind]
        ours = [k for k in loaded["keys"] if k["kind"] == kind]
        built_keys = {k["key"] for k in theirs}
        for i, entry in enumerate(ours):
            if entry["key"] in built_keys:
                lines.append(f"load's {kind} key {i} {entry['key']}: the build computed it too")
                continue
            lines.append(f"load's {kind} key {i} {entry['key']}: not computed by the build")
            if i < len(theirs):  # the same graph in compile order (batch 1, then the larger sizes)
                build_only, load_only = set(theirs[i]["details"]), set(entry["details"])
                lines += [f"  build only: {line[:400]}" for line in sorted(build_only - load_only)]
                lines += [f"  load only:  {line[:400]}" for line in sorted(load_only - build_only)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("arch")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-batch", type=int, default=128)
    parser.add_argument("--step", choices=("build", "load"), help=argparse.SUPPRESS)  # one process's part
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "build":
        return build(args.out, args.arch, args.device, args.max_batch)
    if args.step == "load":
        return load(args.out, args.arch)
    me = [sys.executable, str(Path(__file__).resolve()), str(args.out), args.arch, "--device", args.device,
          "--max-batch", str(args.max_batch)]
    subprocess.run([*me, "--step", "build"], check=True)
    with tempfile.TemporaryDirectory() as fresh:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{fresh}/inductor", TRITON_CACHE_DIR=f"{fresh}/triton")
        subprocess.run([*me, "--step", "load"], check=True, env=env)
    lines = differences(args.out)
    (args.out / "diff.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
