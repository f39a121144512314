"""`trtmc build`: a checkpoint in, one bundle file out."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..precision import COMPUTE_PRECISIONS, QUANTIZED_FORMATS
from ..progress import Progress


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4G, 512M, 1073741824)") from exc


def add(sub) -> None:
    from ..backends import BACKENDS, DEFAULT_BACKEND, DEVICES  # here: importing the CLI stays light

    p = sub.add_parser(
        "build",
        help="build a bundle from a timm checkpoint",
        description="Read a timm checkpoint, derive its network, compile engines and write one bundle file.",
        epilog="examples:\n"
        "  trtmc build timm/ghostnet_100.in1k -o ghostnet.bundle\n"
        "  trtmc build ./tf_efficientnet_lite0.in1k -o lite0.bundle --precision bf16\n"
        "  trtmc build timm/resnet50.a1_in1k -o r50.bundle --device cuda --precision fp16 --max-batch 128\n"
        "  trtmc build MODEL -o both.bundle --backend tensorrt --backend inductor --device cuda\n\n"
        "backends:\n" + "\n".join(f"  {name:10s} {summary}" for name, summary in BACKENDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="Hugging Face id (owner/name) or a local folder with config.json + model.safetensors")
    p.add_argument("-o", "--output", required=True, type=Path, help="bundle file to write (written atomically)")
    p.add_argument("--precision", default="fp32", choices=COMPUTE_PRECISIONS + QUANTIZED_FORMATS,
                   help="compute precision of every op, convolutions included (default fp32); fp8 and int8 "
                        "compute in fp16 with the quantized convolutions and linear ops of the family's "
                        "recipe, only for families whose `trtmc study` decided it pays")
    p.add_argument("--calibration", type=Path, metavar="DIR",
                   help="images to calibrate fp8/int8 activation scales on (a folder, searched recursively)")
    p.add_argument("--device", default="cpu", choices=DEVICES,
                   help="device the engines are built for, where the backend builds for it (a TensorRT plan "
                        "always targets cuda); default cpu")
    p.add_argument("--backend", action="append", choices=list(BACKENDS), dest="backends",
                   help=f"engine to build (see backends below); repeat to put several in one bundle "
                        f"(default {DEFAULT_BACKEND})")
    p.add_argument("--revision", help="Hugging Face revision (branch, tag or commit) of MODEL")
    p.add_argument("--io-dtype", default="fp32", choices=COMPUTE_PRECISIONS,
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
    p.set_defaults(run=run)


def run(args) -> int:
    from ..backends import DEFAULT_BACKEND
    from ..build import BuildRequest, build_bundle

    calibration: tuple[Path, ...] = ()
    if args.calibration is not None:
        from ..pipeline import expand_images

        calibration = tuple(expand_images([args.calibration]))
    request = BuildRequest(
        model=args.model,
        output=args.output,
        precision=args.precision,
        device=args.device,
        backends=tuple(args.backends or [DEFAULT_BACKEND]),
        revision=args.revision,
        io_dtype=args.io_dtype,
        max_batch=args.max_batch,
        opt_level=args.opt_level,
        workspace=args.workspace,
        timing_cache=args.timing_cache,
        fp32_layers=tuple(args.fp32_layers),
        add_engines_from=args.add_engines_from,
        calibration=calibration,
    )
    path = build_bundle(request, Progress(args.quiet))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0
