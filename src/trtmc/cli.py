"""The `trtmc` command: build, classify, inspect, families, decode, bench."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .progress import Progress

DESCRIPTION = """\
trtmc turns a timm image classifier (a Hugging Face id such as timm/ghostnet_100.in1k, or a local
folder with config.json + model.safetensors) into one self-describing bundle file, compiled by
TensorRT and/or PyTorch Inductor, and classifies images with it.

  trtmc build timm/ghostnet_100.in1k -o ghostnet.bundle
  trtmc classify ghostnet.bundle --image photo.jpg
"""


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4G, 512M, 1073741824)") from exc


def _add_build(sub) -> None:
    p = sub.add_parser(
        "build",
        help="build a bundle from a timm checkpoint",
        description="Read a timm checkpoint, derive its network, compile engines and write one bundle file.",
        epilog="examples:\n"
        "  trtmc build timm/ghostnet_100.in1k -o ghostnet.bundle\n"
        "  trtmc build ./tf_efficientnet_lite0.in1k -o lite0.bundle --precision bf16\n"
        "  trtmc build timm/resnet50.a1_in1k -o r50.bundle --device cuda --precision fp16 --max-batch 128\n"
        "  trtmc build MODEL -o both.bundle --backend tensorrt --backend inductor --device cuda",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="Hugging Face id (owner/name) or a local folder with config.json + model.safetensors")
    p.add_argument("-o", "--output", required=True, type=Path, help="bundle file to write (written atomically)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"],
                   help="compute precision of every op, convolutions included (default fp32)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="device the inductor engine is compiled for (default cpu)")
    p.add_argument("--backend", action="append", choices=["tensorrt", "inductor"], dest="backends",
                   help="engine to build; repeat to put several in one bundle (default inductor)")
    p.add_argument("--revision", help="Hugging Face revision (branch, tag or commit) of MODEL")
    p.add_argument("--io-dtype", default="fp32", choices=["fp32", "fp16", "bf16"],
                   help="dtype of the engine's input and output tensors (default fp32)")
    p.add_argument("--max-batch", type=int, default=1,
                   help="largest batch the engine serves; TensorRT optimizes for it (default 1)")
    p.add_argument("--opt-level", type=int, default=3, help="TensorRT builder optimization level 0..5 (default 3)")
    p.add_argument("--workspace", type=_size, help="TensorRT workspace limit, e.g. 4G (default: builder's choice)")
    p.add_argument("--timing-cache", type=Path, help="TensorRT timing cache file, shared across builds")
    p.add_argument("--fp32-layers", action="append", default=[], metavar="GLOB",
                   help="keep ops whose name matches GLOB (e.g. 'blocks.6.*') in fp32; repeatable")
    p.add_argument("--add-engines-from", type=Path, metavar="BUNDLE",
                   help="also carry the engines of BUNDLE (same checkpoint and precision), e.g. a TensorRT plan "
                        "built on another machine")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(run=_cmd_build)


def _cmd_build(args) -> int:
    from .build import BuildRequest, build_bundle

    request = BuildRequest(
        model=args.model,
        output=args.output,
        precision=args.precision,
        device=args.device,
        backends=tuple(args.backends or ["inductor"]),
        revision=args.revision,
        io_dtype=args.io_dtype,
        max_batch=args.max_batch,
        opt_level=args.opt_level,
        workspace=args.workspace,
        timing_cache=args.timing_cache,
        fp32_layers=tuple(args.fp32_layers),
        add_engines_from=args.add_engines_from,
    )
    path = build_bundle(request, Progress(args.quiet))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def _add_classify(sub) -> None:
    p = sub.add_parser(
        "classify",
        help="classify images with a bundle",
        description="Print the most likely classes of each image, with label names where the checkpoint gave them.",
        epilog="examples:\n"
        "  trtmc classify lite0.bundle --image photo.jpg\n"
        "  trtmc classify lite0.bundle --image a.jpg b.png --top-k 3 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("bundle", type=Path, help="bundle file written by `trtmc build`")
    p.add_argument("--image", nargs="+", required=True, metavar="PATH", help="JPEG or PNG files")
    p.add_argument("--top-k", type=int, default=5, help="classes to show per image (default 5)")
    p.add_argument("--json", action="store_true",
                   help="JSON Lines: one object per image with image, logits (all, checkpoint order) and top")
    p.add_argument("--engine", help="use this engine (backend name or key from `trtmc inspect`); default: the first that runs here")
    p.set_defaults(run=_cmd_classify)


def _cmd_classify(args) -> int:
    from .runtime import Runtime
    from .tasks import image_to_class_scores

    if args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1, got {args.top_k}")
    runtime = Runtime.open(args.bundle, engine=args.engine)
    scores = image_to_class_scores(runtime, list(args.image))
    for image, logits, top in zip(args.image, scores.logits, scores.top(args.top_k)):
        if args.json:
            print(json.dumps({
                "image": image,
                "engine": runtime.choice.key,
                "logits": [float(v) for v in logits],
                "top": [t.__dict__ for t in top],
            }))
            continue
        print(f"{image}")
        for rank, t in enumerate(top, 1):
            label = f"{t.label}  {t.description}".strip() or "(no label in checkpoint)"
            print(f"  {rank}. {t.index:5d}  {t.score:7.2%}  {label}")
    return 0


def _add_inspect(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="show a bundle's manifest, preprocessing, graph and engines",
        description="Verify a bundle and summarise it: manifest, preprocessing contract, op counts by kind and precision, engines.",
    )
    p.add_argument("bundle", type=Path)
    p.add_argument("--graph", action="store_true", help="also print the whole graph, one op per line")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(run=_cmd_inspect)


def _cmd_inspect(args) -> int:
    from .bundle import read_bundle

    bundle = read_bundle(args.bundle)
    m = bundle.manifest
    if args.json:
        print(json.dumps(m, indent=1, sort_keys=True))
        return 0
    src = m["source"]
    print(f"bundle      {bundle.path} (format {m['format_version']}, trtmc {m['tool_version']})")
    print(f"model       {m['architecture']} (family {m['family']}), task {m['task']}, {m['num_classes']} classes")
    print(f"source      {src['id']} @ {src['revision']}  sha256 {src['sha256'][:16]}…")
    print(f"precision   {m['precision']} (io {m['io_dtype']})" + (f", fp32 layers {m['fp32_layers']}" if m.get("fp32_layers") else ""))
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
        r = e["record"]
        size = sum(m["members"][f"engines/{e['key']}/{f}"]["size"] for f in e["files"])
        line = f"  {e['key']:28s} {r.get('builder', e['backend'])} {r.get('builder_version', '')}  {size / 1e6:.1f} MB"
        if "network_layers" in r:
            line += f"  {r['network_layers']} layers"
        if "engine_layers" in r:
            line += f" ({r['engine_layers']} in the engine)"
        if "build_seconds" in r:
            line += f"  built in {r['build_seconds']} s"
        print(line)
        for kind, dtypes in sorted(r.get("layer_precisions", {}).items()):
            print(_counts_line("      ", kind, 18, dtypes))
    if args.graph:
        print(bundle.graph())
    return 0


def _counts_line(indent: str, kind: str, width: int, dtypes: dict[str, int]) -> str:
    """`  conv2d         f16 49  f32 1`: how many ops (or layers) of a kind run in each precision."""
    return f"{indent}{kind:{width}s} " + "  ".join(f"{d} {n}" for d, n in sorted(dtypes.items()))


def _add_families(sub) -> None:
    p = sub.add_parser("families", help="list the supported architectures",
                       description="List every supported timm architecture with its family and precisions.")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_families)


def _cmd_families(args) -> int:
    from .families import all_families

    rows = [(f.name, arch, f.precisions, f.summary) for f in all_families() for arch in f.architectures]
    if args.json:
        print(json.dumps([{"family": f, "architecture": a, "precisions": list(p)} for f, a, p, _ in rows], indent=1))
        return 0
    for family in all_families():
        print(f"{family.name}: {family.summary}")
        print(f"  precisions: {', '.join(family.precisions)}")
        print("  " + ", ".join(family.architectures))
    return 0


def _add_decode(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="write an image as raw RGB float32 for the C and C++ SDK consumers",
        description="Decode an image file as the task does (RGB, values / 255) and write it as raw float32 HWC "
        "in [0, 1], native byte order, no header (.rgb.f32). Prints the image's height and width.",
        epilog="example:\n"
        "  build/sdk_consumer_c lite0.bundle chelsea.rgb.f32 $(trtmc decode examples/images/chelsea.png)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("image", type=Path, help="JPEG or PNG file")
    p.add_argument("-o", "--output", type=Path,
                   help="file to write (default: the image's name with the suffix .rgb.f32, in the current folder)")
    p.set_defaults(run=_cmd_decode)


def _cmd_decode(args) -> int:
    from .files import write_bytes_atomically
    from .tasks import decode_image

    pixels = decode_image(args.image)
    write_bytes_atomically(args.output or Path(args.image.name).with_suffix(".rgb.f32"), pixels.tobytes())
    print(f"{pixels.shape[0]} {pixels.shape[1]}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trtmc", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log details (and tracebacks on errors)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_build(sub)
    _add_classify(sub)
    _add_decode(sub)
    _add_inspect(sub)
    _add_families(sub)
    try:
        from .bench.cli import add_bench
    except ImportError:
        pass
    else:
        add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="trtmc: %(message)s")
    # torch's C++ extension loader warns about a missing CUDA toolkit on CPU machines: not ours to report.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("trtmc: interrupted", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, OSError, TypeError) as exc:  # one clear line; -v shows the traceback
        if args.verbose:
            raise
        print(f"trtmc: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
