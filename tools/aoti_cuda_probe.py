"""Where an AOTInductor CUDA package's load time goes, and whether it replays in a CUDA graph (issue 10).

Two phases, each in its own process so that the load is measured cold:

    python3 tools/aoti_cuda_probe.py export BUNDLE OUT_DIR     # one static-batch package per --batch, CUDA
    LD_PRELOAD=... python3 tools/aoti_cuda_probe.py load BUNDLE OUT_DIR

`export` lowers the bundle's graph (trtmc's FX module, channels-last) with `torch.export` and
`aoti_compile_and_package` for CUDA and lists what the package holds (kernels as .cubin or PTX, the .so,
its weights). `load` times `import torch`, `aoti_load_package` under cProfile (the 25 most expensive calls
go to OUT_DIR/load-profile.txt), the first and second call, compares the output with the graph run
uncompiled, then tries to capture a call in a CUDA graph after warming up and times its replays.
The H200 image's torch 2.11 needs the system C++ runtime preloaded to load any AOTInductor package
(docs/ARCHITECTURE.md); torch 2.14 does not. Results: OUT_DIR/probe.json.
"""

from __future__ import annotations

import json
import sys
import time
import zipfile
from pathlib import Path

STARTED = time.perf_counter()


def _graph(bundle_path: str):
    from trtmc.bundle import read_bundle

    return read_bundle(Path(bundle_path)).graph()


def _example(graph, batch: int):
    import torch

    from trtmc.backends.torch_lowering import TORCH_DTYPES

    node = graph.inputs[0]
    x = torch.rand((batch,) + tuple(node.type.shape[1:]), device="cuda").to(TORCH_DTYPES[node.type.dtype])
    return x.to(memory_format=torch.channels_last)


def export(bundle_path: str, out: Path, batches: list[int]) -> dict:
    import torch

    from trtmc.backends.torch_lowering import to_fx

    graph = _graph(bundle_path)
    module = to_fx(graph).eval().cuda().to(memory_format=torch.channels_last)
    record: dict = {"torch": torch.__version__, "packages": {}}
    for batch in batches:
        started = time.perf_counter()
        with torch.no_grad():
            exported = torch.export.export(module, (_example(graph, batch),))
        path = out / f"b{batch}.pt2"
        torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
        with zipfile.ZipFile(path) as z:
            files = [(i.filename, i.file_size) for i in z.infolist()]
        kinds: dict[str, list[int]] = {}
        for name, size in files:
            kind = Path(name).suffix or name
            kinds.setdefault(kind, [0, 0])
            kinds[kind][0] += 1
            kinds[kind][1] += size
        record["packages"][batch] = {
            "seconds": round(time.perf_counter() - started, 1),
            "bytes": path.stat().st_size,
            "by_suffix": {k: {"files": n, "bytes": b} for k, (n, b) in sorted(kinds.items())},
        }
    return record


def load(bundle_path: str, out: Path, batches: list[int]) -> dict:
    import cProfile
    import io
    import pstats

    t0 = time.perf_counter()
    import torch

    record: dict = {"import_torch_s": round(time.perf_counter() - t0, 2), "batches": {}}
    graph = _graph(bundle_path)
    from trtmc.backends.torch_lowering import GraphModule

    reference = GraphModule(graph).eval().cuda()
    for batch in batches:
        row: dict = {}
        record["batches"][batch] = row
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        try:
            model = torch._inductor.aoti_load_package(str(out / f"b{batch}.pt2"))
        except Exception as exc:  # what stops it is the finding
            row["load_error"] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        finally:
            profiler.disable()
            row["load_s"] = round(time.perf_counter() - started, 2)
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
            (out / f"load-profile-b{batch}.txt").write_text(text.getvalue())
        x = _example(graph, batch)
        for call in ("first_call_s", "second_call_s"):
            started = time.perf_counter()
            try:
                with torch.no_grad():
                    y = model(x)
                torch.cuda.synchronize()
            except Exception as exc:
                row[call.replace("_s", "_error")] = f"{type(exc).__name__}: {exc}"[:500]
                break
            row[call] = round(time.perf_counter() - started, 3)
        else:
            with torch.no_grad():
                want = reference(x.contiguous()).float()
            got = (y[0] if isinstance(y, (list, tuple)) else y).float()
            row["max_abs_diff_over_max_logit"] = float((got - want).abs().max() / want.abs().max())
            row.update(_capture(model, x))
    return record


def _capture(model, x) -> dict:
    """Capture one call in a CUDA graph as the CUDA engine does (`inductor_lowerings.captured`: warm-ups on a side
    stream, then the capture), time replays against plain calls."""
    import torch

    from trtmc.backends.inductor_lowerings import captured

    result: dict = {}
    try:
        cuda_graph, _ = captured(model, x)
    except Exception as exc:
        result["capture_error"] = f"{type(exc).__name__}: {exc}"[:500]
        cuda_graph = None
    with torch.no_grad():
        result["plain_call_ms"] = _time_ms(lambda: model(x))
    if cuda_graph is not None:
        result["replay_ms"] = _time_ms(cuda_graph.replay)
    return result


def _time_ms(fn, calls: int = 50) -> float:
    import torch

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(7):
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
    return round(sorted(samples)[len(samples) // 2], 4)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("export", "load"):
        print(__doc__, file=sys.stderr)
        return 2
    phase, bundle, out = argv[0], argv[1], Path(argv[2])
    batches = [int(b) for b in argv[3:]] or [1]
    out.mkdir(parents=True, exist_ok=True)
    record = (export if phase == "export" else load)(bundle, out, batches)
    record["process_s"] = round(time.perf_counter() - STARTED, 2)
    path = out / "probe.json"
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged[phase] = record
    path.write_text(json.dumps(merged, indent=1))
    print(json.dumps({phase: record}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
