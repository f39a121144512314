"""Whether Inductor reaches torch 2.11's bare `raise CantSplit` while compiling timm's ARCH as the bench's expert
baseline, in fresh Inductor and Triton caches (`backends/inductor_mends.py` says why that raise failed run 41's
swinv2_tiny_window8_256 expert). The mend is silent, so this counts: each `CantSplit` made without arguments during
the compile is one the unmended class would have turned into a failed compile. One sample: which tilings Inductor
tries has varied between runs and machines.

    PYTHONPATH=src python3 tools/cantsplit_probe.py swinv2_tiny_window8_256 --out $OUT/cantsplit.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import traceback
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arch", help="a timm architecture, e.g. swinv2_tiny_window8_256")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 128], help="batch sizes, in order (default 1 128)")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--device", default="cuda", help="cuda (default; cpu only to try the probe itself)")
    parser.add_argument("--out", type=Path, required=True, help="a JSON file for the counts")
    args = parser.parse_args()
    caches = Path(tempfile.mkdtemp(prefix="cantsplit-"))  # fresh, so that Inductor generates every kernel again
    os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"] = str(caches / "inductor"), str(caches / "triton")

    import timm
    import torch
    from torch._inductor.codegen.simd import CantSplit

    from trtmc.backends.inductor_mends import mend_inductor
    from trtmc.bench.baselines import make_baseline

    mend_inductor()  # as make_baseline does; then every construction passes through the count below
    bare: list[str] = []
    mended_init = CantSplit.__init__

    def counted(self, *given, **named):
        if not given and not named:
            bare.append("".join(traceback.format_stack(limit=4)[:-1]))
        mended_init(self, *given, **named)

    CantSplit.__init__ = counted
    model = timm.create_model(args.arch, pretrained=False).eval().to(args.device)
    baseline = make_baseline("expert", model, args.precision, args.device)
    size = model.pretrained_cfg["input_size"]
    rows = []
    for batch in args.batch:
        bare.clear()  # make_baseline's own mend tries the class bare once: not a compile's
        started = time.perf_counter()
        error = None
        try:
            with torch.no_grad():
                baseline(baseline.prepare(torch.zeros((batch, *size), device=args.device)))
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as failure:  # the compile's failure is the finding, not the probe's
            error = f"{type(failure).__name__}: {failure}"[:2000]
        rows.append({"batch": batch, "seconds": round(time.perf_counter() - started, 1), "bare_cant_split": len(bare),
                     "first_site": bare[0] if bare else None, "error": error})
        print(f"{args.arch} batch {batch}: {len(bare)} bare CantSplit, {'failed: ' + error if error else 'compiled'} "
              f"in {rows[-1]['seconds']} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"arch": args.arch, "precision": args.precision, "torch": torch.__version__,
                                    "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
