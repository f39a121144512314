"""`trtmc inspect` (what a bundle holds) and `trtmc families` (what can be built)."""

from __future__ import annotations

import json
from pathlib import Path


def add(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="show a bundle's manifest, preprocessing, graph and engines",
        description="Verify a bundle and summarise it: manifest, preprocessing contract, op counts by kind and precision, engines.",
    )
    p.add_argument("bundle", type=Path)
    p.add_argument("--graph", action="store_true", help="also print the whole graph, one op per line")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..bundle import read_bundle

    bundle = read_bundle(args.bundle)
    m = bundle.manifest
    if args.json:
        print(json.dumps(m, indent=1, sort_keys=True))
        return 0
    src = m["source"]
    print(f"bundle      {bundle.path} (format {m['format_version']}, trtmc {m['tool_version']})")
    print(f"digest      {bundle.digest}  (sha256 of manifest.json; pin it with `trtmc classify --expect-sha256`)")
    print(f"model       {m['architecture']} (family {m['family']}), task {m['task']}, {m['num_classes']} classes")
    print(f"source      {src['id']} @ {src['revision']}  sha256 {src['sha256'][:16]}…")
    print(f"precision   {m['precision']} (io {m['io_dtype']})" + (f", fp32 layers {m['fp32_layers']}" if m.get("fp32_layers") else ""))
    if "quantization" in m:
        q = m["quantization"]
        images = len(q["calibration"].get("images", []))
        print(f"quantized   {len(q['quantized_ops'])} ops in {q['format']} (the rest in {q['compute_precision']}), "
              f"scales calibrated on {images} images")
    pre = bundle.preprocess
    print(f"preprocess  resize {pre.interpolation} crop_pct {pre.crop_pct} ({pre.crop_mode}) to {pre.input_size[0]}x{pre.input_size[1]}, "
          f"mean {list(pre.mean)} std {list(pre.std)}")
    labels = bundle.labels
    print(f"labels      {len(labels['names'])} names, {len(labels['descriptions'])} descriptions")
    print(f"graph       {m['graph']['ops']} ops")
    by_kind: dict[str, dict[str, int]] = {}
    for key, count in m["graph"]["op_counts"].items():
        kind, dtype = key.split(":")
        by_kind.setdefault(kind, {})[dtype] = count
    for kind, dtypes in sorted(by_kind.items()):
        print(_counts_line("  ", kind, 14, dtypes))
    print(f"engines     {len(bundle.engines) or 'none'}")
    for e in bundle.engines:
        r = e.record
        size = sum(len(data) for data in bundle.engine_files(e.key).values())
        line = f"  {e.key:28s} {r.get('builder', e.backend)} {r.get('builder_version', '')}  {size / 1e6:.1f} MB  {e.batching}"
        if "network_layers" in r:
            line += f"  {r['network_layers']} layers"
        if "engine_layers" in r:
            line += f" ({r['engine_layers']} in the engine)"
        if "build_seconds" in r:
            line += f"  built in {r['build_seconds']} s"
        print(line)
        for kind, dtypes in sorted(r.get("layer_precisions", {}).items()):
            print(_counts_line("      ", kind, 18, dtypes))
        for text in lowering_lines(r):
            print(f"      {text}")
    if args.graph:
        print(bundle.graph())
    return 0


def lowering_lines(record) -> list[str]:
    """What a CUDA inductor build measured and kept at each batch size (the record's `lowerings`), one line each:
    `batch 128: cudnn-fused kept (plain 2.268 ms, cudnn-fused 2.109 ms)`; then the patch embeddings every lowering
    runs as a matrix product (`patch_products`) and the GELUs it runs with their products (`gelu_products`), if any."""
    lines = []
    for batch, choice in sorted(record.get("lowerings", {}).items(), key=lambda item: int(item[0])):
        times = ", ".join(f"{name} {ms:.3f} ms" for name, ms in choice.get("ms", {}).items())
        failed = "".join(f"; {name} failed: {error}" for name, error in choice.get("errors", {}).items())
        lines.append(f"batch {batch}: {choice['chosen']} kept" + (f" ({times})" if times else " (the only candidate)") + failed)
    if record.get("patch_products"):
        lines.append("patch embeddings as one matrix product each: " + ", ".join(record["patch_products"]))
    if record.get("gelu_products"):
        lines.append(f"GELUs with their matrix product as one cuBLASLt call: {len(record['gelu_products'])}")
    return lines


def _counts_line(indent: str, kind: str, width: int, dtypes: dict[str, int]) -> str:
    """`  conv2d         f16 49  f32 1`: how many ops (or layers) of a kind run in each precision."""
    return f"{indent}{kind:{width}s} " + "  ".join(f"{d} {n}" for d, n in sorted(dtypes.items()))


def add_families(sub) -> None:
    p = sub.add_parser("families", help="list the supported architectures",
                       description="List every supported timm architecture with its family and precisions.")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one object per architecture")
    form.add_argument("--markdown", action="store_true", help="the README's table: one row per family")
    p.set_defaults(run=_cmd_families)


def _cmd_families(args) -> int:
    from ..families import all_families

    rows = [(f.name, arch, f.precisions, f.summary) for f in all_families() for arch in f.architectures]
    if args.json:
        print(json.dumps([{"family": f, "architecture": a, "precisions": list(p)} for f, a, p, _ in rows], indent=1))
        return 0
    if args.markdown:
        print("| family | architectures | precisions |\n|---|---|---|")
        for family in all_families():
            archs = ", ".join(f"`{a}`" for a in family.architectures)
            print(f"| `{family.name}` | {archs} | {', '.join(family.precisions)} |")
        return 0
    for family in all_families():
        print(f"{family.name}: {family.summary}")
        print(f"  precisions: {', '.join(family.precisions)}")
        print("  " + ", ".join(family.architectures))
    return 0
