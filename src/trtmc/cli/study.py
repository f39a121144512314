"""`trtmc study`: does a precision pay for a model? Every variant built, timed and judged in one process.

Importing this module loads neither torch nor timm: the help is written from the constants the
study runs with (the protocol, the quality measures, the decision rule).
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from ..backends import BACKENDS
from ..bench import timing
from ..bench.oracle import SHIPPED_PHOTOS
from ..bench.spec import TimingProtocol
from ..random_weights import INSTALL
from ..study.request import DEFAULT_BATCHES, DEFAULT_PRECISIONS, DEVICES, STUDY_PRECISIONS, StudyRequest

WIDTH = 100

EPILOG = """\
examples:
  trtmc study timm/ghostnet_100.in1k --calibration calib/ --holdout val/ --out studies/ghostnet_100
  trtmc study resnet50 --random-weights --precision fp16 --precision fp8 --precision int8 --out studies/resnet50
  trtmc study vit_base_patch16_224 --random-weights --batch 1 --batch 128 --user-batch 128 --out studies/vit
  trtmc study ./tf_efficientnet_lite0.in1k --device cpu --backend reference --precision fp16 --batch 1 --out s
"""


def _description() -> str:
    from ..study import quality
    from ..study.decision import rule_text

    protocol = TimingProtocol()
    paragraphs = [
        "Build every variant of one checkpoint (the fp32 reference, fp16 when fp8 or int8 is studied, and each "
        "--precision; fp8 and int8 compute in fp16 with the quantize pass of trtmc.quantization's recipe and scales "
        "calibrated on the calibration images), then, in one process: time every variant at every batch size with "
        "the bench protocol (rows interleaved), count CUDA kernels or TensorRT layers, measure quality against timm "
        "fp32 on the held-out images and scan for non-finite outputs, and decide.",
        timing.describe(protocol),
        quality.describe(),
        rule_text(DEFAULT_BATCHES, protocol.margin),
        f"Calibration and held-out images never overlap; with neither --calibration nor --holdout, the photos of "
        f"{SHIPPED_PHOTOS} are split by file name. Writes study.md, study.json and study.png to --out. Needs timm "
        f"(the reference, random weights) and matplotlib (the plot): {INSTALL}",
    ]
    return "\n\n".join(textwrap.fill(p, WIDTH) for p in paragraphs)


def add(sub) -> None:
    p = sub.add_parser(
        "study",
        help="measure whether fp16, bf16, fp8 or int8 pays for a model, and write the report",
        description=_description(),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="Hugging Face id, checkpoint folder, or timm architecture name (with --random-weights)")
    p.add_argument("--precision", action="append", choices=STUDY_PRECISIONS, dest="precisions",
                   help=f"precision to study, repeatable (default: {' '.join(DEFAULT_PRECISIONS)}); fp32 is always "
                        "the reference")
    p.add_argument("--calibration", type=Path, metavar="DIR", help="calibration images (with --holdout)")
    p.add_argument("--holdout", type=Path, metavar="DIR", help="held-out images, none of them in --calibration")
    p.add_argument("--random-weights", action="store_true",
                   help="random weights in the Hugging Face layout, calibrated on the calibration images (offline)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and the stress inputs (default 0)")
    p.add_argument("--device", choices=DEVICES, default="cuda", help="device to build for and time on (default cuda)")
    p.add_argument("--backend", choices=list(BACKENDS), default="inductor",
                   help="the engine built and timed (default inductor)")
    p.add_argument("--batch", type=int, action="append", metavar="N",
                   help=f"batch size, repeatable (default {' '.join(map(str, DEFAULT_BATCHES))})")
    p.add_argument("--user-batch", type=int, action="append", metavar="N",
                   help="a batch size users run, where a quantized precision must be faster than fp16; repeatable "
                        "(default: every --batch)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for study.md, study.json, study.png")
    p.add_argument("--workdir", type=Path, metavar="DIR", help="folder for random weights and bundles (default OUT/work)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="bundles to build at once, each in a process of its own (default 1; the compiles are "
                        "CPU-bound: up to the cores a machine has, one per bundle). Timing always runs alone")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..progress import Progress
    from ..random_weights import require_timm
    from ..study.report import write_report
    from ..study.runner import run_study

    request = StudyRequest(
        model=args.model,
        out=args.out,
        precisions=tuple(dict.fromkeys(args.precisions or DEFAULT_PRECISIONS)),
        calibration=args.calibration,
        holdout=args.holdout,
        random_weights=args.random_weights,
        seed=args.seed,
        device=args.device,
        backend=args.backend,
        batch_sizes=tuple(args.batch or DEFAULT_BATCHES),
        user_batches=tuple(args.user_batch or ()),
        workdir=args.workdir,
        jobs=args.jobs,
    )
    request.validate()
    require_timm()
    result = run_study(request, Progress(args.quiet))
    for decision in result.decisions:
        print(decision.summary())
    for path in write_report(result, args.out).values():
        print(f"wrote {path}")
    failed = [v.name for v in result.variants if v.error]
    return 1 if failed else 0
