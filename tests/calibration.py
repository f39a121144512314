"""Random-weight checkpoints whose batch-norm statistics match the activations they normalise.

`support.randomize_` draws running variances in [0.02, 0.52] regardless of what a layer actually
outputs. Deep EfficientNet/MobileNet stacks then run far outside their working range: with SiLU or
hard-swish the logits reach 1e18..1e29 (fp16 overflows, and a relative error only sees the dominant
path), and with ReLU6 (EfficientNet-Lite, MobileNetV2) the net turns chaotic, so that timm's own
fp32 and fp64 logits already differ by ~10% of the largest. Re-estimating the running statistics
on one random batch (affine parameters stay random) keeps the net well conditioned while a wrong
eps or padding still moves the logits by ~10%.
"""

from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path

import torch

from support import load_timm, random_pixels


@lru_cache(maxsize=None)
def calibrated(folder: Path, seed: int = 3) -> Path:
    """A copy of a `save_timm_checkpoint` folder with running statistics taken from one batch."""
    from safetensors.torch import save_file

    out = folder.with_name(folder.name + "-calibrated")
    out.mkdir(exist_ok=True)
    shutil.copy(folder / "config.json", out / "config.json")
    model = load_timm(folder)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average: after one batch, exactly that batch's statistics
    model.train()
    with torch.no_grad():
        model(random_pixels(folder, batch=4, seed=seed))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    save_file(state, str(out / "model.safetensors"))
    return out
