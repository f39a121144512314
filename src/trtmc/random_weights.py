"""Random-weight timm checkpoints in the Hugging Face layout, and timm's model read back from one.

trtmc is checked against timm holding the same weights. Where no trained checkpoint is at hand (the
tests; the GPU machine, which has no network) the weights are random and written where trtmc reads a
downloaded checkpoint from: `config.json` (architecture, num_classes, timm's `pretrained_cfg`) and
`model.safetensors`. timm's own init is too forgiving for a check: every norm starts as the identity
and the last norm of a residual block as zero, so a missed norm or a wrong eps would not move the
logits. Here the affine parameters of every norm, the layer scales and the attention biases timm
starts at zero (BEiT's, LeViT's, EfficientFormer's) are drawn at random, and the batch-norm running statistics are one of two kinds (`BatchNormStatistics`): drawn at random, with
small variances so that an eps mistake shows; or calibrated, measured on noise images in training
mode, which keeps a deep network in a trained one's range (random statistics drive GhostNet's fp16
activations past 65504) while a wrong eps or padding still moves the logits. For checks on photos,
`calibrate_on_photos` goes further: statistics measured on the photos and the classifier imprinted
with them, so that each photo has one clear winner, as with a trained model.

`load_timm_model` and `timm_pixels` are timm's side of a comparison: its model holding a
checkpoint's weights, and its eval transform of image files. timm is an optional dependency
(`pip install 'trtmc[bench]'`), imported only when a function here runs.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

INSTALL = "pip install 'trtmc[bench]'"  # timm and matplotlib, for the bench and these helpers
# Noise images the calibrated statistics are measured on by default, in one training-mode batch.
CALIBRATION_IMAGES = 4
# The calibration noise is drawn with seed + this, apart from the weights' own draws (3 for seed 0: the
# tests' checkpoints stayed the same, bit for bit, when this module replaced their own helper).
CALIBRATION_SEED_OFFSET = 3
# The classes given to an architecture timm registers without a classifier (num_classes 0).
HEADLESS_CLASSES = 1000
# Attention parameters some timm models start at zero, which would hide them from a comparison.
_ZERO_STARTED = ("relative_position_bias_table", "q_bias", "v_bias")


class BatchNormStatistics(enum.Enum):
    """What a random-weight checkpoint holds as batch-norm running statistics."""

    RANDOM = "random"  # running mean ~ N(0, 0.1²), running variance ~ U(0.02, 0.52)
    CALIBRATED = "calibrated"  # measured on RandomWeights.calibration_images noise images


@dataclass(frozen=True)
class RandomWeights:
    """How a random-weight checkpoint is drawn; the same options give the same tensors."""

    seed: int = 0
    statistics: BatchNormStatistics = BatchNormStatistics.CALIBRATED
    # Noise images the calibrated statistics are measured on. Where a deep layer's statistics vary much
    # from one image to the next (LeViT's tokens), a few images leave them far from any other image's.
    calibration_images: int = CALIBRATION_IMAGES


def require_timm():
    """The timm module, or an error saying how to install it."""
    try:
        import timm
    except ImportError as exc:
        raise RuntimeError(
            f"timm is not installed; trtmc needs it for random weights, baselines and the oracle: {INSTALL}"
        ) from exc
    return timm


def _is_affine_norm(module) -> bool:
    """A LayerNorm of any kind, or ConvNeXt-V2's global response norm, whose zero weight and bias make
    it the identity until they are drawn."""
    import torch

    kind = type(module).__name__
    return isinstance(module, torch.nn.LayerNorm) or kind.startswith("LayerNorm") or kind == "GlobalResponseNorm"


def _randomize_(model, weights: RandomWeights):
    """Draw every norm's affine parameters (and, for batch norms, running statistics) and every layer
    scale of timm `model` in place; the statistics are calibrated afterwards if `weights` asks."""
    import torch

    gen = torch.Generator().manual_seed(weights.seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                module.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.02)
                module.weight.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                module.bias.copy_(torch.randn(n, generator=gen) * 0.1)
            elif _is_affine_norm(module) and getattr(module, "weight", None) is not None:
                module.weight.copy_(torch.rand(module.weight.shape, generator=gen) * 0.5 + 0.75)
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * 0.1)
        for name, p in model.named_parameters():
            if name.endswith(("gamma", "gamma_1", "gamma_2", "gamma_xca")) or ".ls" in name or "layer_scale" in name:
                p.copy_(torch.rand(p.shape, generator=gen) * 0.5 + 0.5)
            elif name.endswith("attention_biases"):  # LeViT's and EfficientFormer's, which timm starts at 0
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            # Swin V2's cosine-attention scales, all log(10) at init: drawn per head in [1, 5], so some heads
            # pass timm's clamp at log(100) and a missing clamp shows.
            elif name.endswith("logit_scale"):
                p.copy_(torch.rand(p.shape, generator=gen) * 4.0 + 1.0)
        for name, p in model.named_parameters():
            # BEiT and EVA start their attention's relative position bias table and q / v biases at zero:
            # drawn, a bias gathered or placed wrongly moves the logits.
            if name.endswith(_ZERO_STARTED) and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    if weights.statistics is BatchNormStatistics.CALIBRATED:
        _calibrate_batch_norm_(model, weights.seed + CALIBRATION_SEED_OFFSET, weights.calibration_images)
    return model.eval()


def _calibrate_batch_norm_(model, seed: int, images: int) -> None:
    """Running statistics of one training-mode batch of noise images, as training would leave them."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one batch, exactly that batch's statistics
    c, h, w = model.pretrained_cfg.get("input_size", (3, 224, 224))
    model.train()
    try:
        with torch.no_grad():
            model(torch.randn(images, c, h, w, generator=torch.Generator().manual_seed(seed)))
    finally:
        for norm, momentum in zip(norms, momenta):
            norm.momentum = momentum
        model.eval()


def _json_config(model, architecture: str) -> dict[str, Any]:
    cfg = dict(model.pretrained_cfg)
    return {
        "architecture": architecture,
        "num_classes": model.num_classes,
        "num_features": getattr(model, "num_features", None),
        "pretrained_cfg": {
            k: v for k, v in cfg.items() if isinstance(v, (int, float, str, list, tuple, bool, type(None)))
        },
    }


def _write_checkpoint(folder: Path, state: dict, config_text: str) -> Path:
    """`model.safetensors` and `config.json` in `folder`, which appears complete or not at all."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        tensors = {k: v.contiguous() for k, v in state.items() if not k.endswith("num_batches_tracked")}
        save_file(tensors, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(config_text)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def save_random_checkpoint(
    name: str, folder: Path, weights: RandomWeights = RandomWeights(), **timm_kwargs: Any
) -> Path:
    """timm model `name` (an architecture, optionally with a `.tag`) with random weights, saved in the
    Hugging Face layout in `folder`, which appears complete or not at all; returns `folder`.

    `timm_kwargs` go to `timm.create_model` (e.g. `pretrained_cfg_overlay=dict(input_size=(3, 64, 64))`).
    An architecture timm registers headless (num_classes 0) gets a classifier of `HEADLESS_CLASSES`.
    """
    import torch

    timm = require_timm()
    torch.manual_seed(weights.seed)  # timm's own init, which the norms and layer scales then overwrite
    try:
        model = timm.create_model(name, pretrained=False, **timm_kwargs)
    except RuntimeError as exc:  # timm's "Unknown model"
        raise ValueError(f"{name!r} is not a timm model name ({exc}); give a timm architecture such as resnet50") from exc
    if model.num_classes == 0 and "num_classes" not in timm_kwargs:
        # A headless pretrained tag (DINOv2, SigLIP): written as the classifier fine-tuned from it would be,
        # its pretrained_cfg kept, HEADLESS_CLASSES classes at the root.
        model.reset_classifier(HEADLESS_CLASSES)
    _randomize_(model, weights)
    config = _json_config(model, model.pretrained_cfg.get("architecture", name.split(".")[0]))
    return _write_checkpoint(folder, model.state_dict(), json.dumps(config, indent=1))


def calibrate_on_photos(source: Path, dest: Path, photos) -> Path:
    """A copy of checkpoint `source` in `dest` that behaves on `photos` (timm-transformed pixels, one
    row per photo) as a trained model would; returns `dest`.

    Random weights make poor references for low-precision checks. Activations grow block after block
    (GhostNet's reach 1e6, past fp16's largest value 65504), and the logits of 1000 random classes
    are near-ties, so a bf16 rounding flips top-1 on a few photos however exact the graph is. Two
    changes, the rest of the weights untouched: the batch-norm statistics are measured on the
    photos, so every norm normalizes as after training; and the classifier rows of the first
    classes are imprinted with the photos' centred pooled features (photo i -> class i), so each
    photo has a clear winner, as with a trained model. Measured statistics alone bring the logits
    back to a trained model's range but leave the near-ties.
    """
    import torch

    model = load_timm_model(source)
    for norm in (m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)):
        norm.train()
        norm.momentum = 1.0  # the running statistics become those of this one batch
    with torch.no_grad():
        model(photos)
        model.eval()
        pooled = model.forward_features(photos)
        random_logits = model.forward_head(pooled).double()
        for classifier, features in _classifier_inputs(model, pooled):
            mean = features.mean(0)
            centred = features - mean
            rows = centred / centred.norm(dim=1, keepdim=True)
            # Each photo's own class scores 4x the largest random logit, so it wins clearly.
            scale = 4.0 * random_logits.abs().max() / (rows * centred).sum(1).min()
            weight = classifier.weight.view(classifier.weight.shape[0], -1)
            weight[: len(rows)] = (rows * scale).float()
            classifier.bias[: len(rows)] = -(rows * scale @ mean).float()
    return _write_checkpoint(dest, model.state_dict(), (Path(source) / "config.json").read_text())


def _classifier_inputs(model, pooled) -> list:
    """(layer, the features it reads) for each layer that writes logits: timm's classifier and the
    pre-logits features; or, for a distilled model, which averages a class and a distillation head
    (LeViT, EfficientFormer), each head's last linear and what reaches it (past LeViT's head norm)."""
    import torch

    heads = model.get_classifier()
    if not isinstance(heads, tuple):
        return [(heads, model.forward_head(pooled, pre_logits=True).flatten(1).double())]
    linears = [[m for m in head.modules() if isinstance(m, torch.nn.Linear)][-1] for head in heads]
    inputs: list = []
    hooks = [linear.register_forward_hook(lambda m, args, out: inputs.append(args[0].double())) for linear in linears]
    try:
        model.forward_head(pooled)
    finally:
        for hook in hooks:
            hook.remove()
    return list(zip(linears, inputs))


def timm_eval_transform(folder: Path):
    """timm's own eval transform (RGB PIL image -> normalized CHW tensor) for checkpoint `folder`'s pretrained_cfg."""
    from .checkpoint import Checkpoint

    require_timm()
    from timm.data import create_transform

    cfg = Checkpoint(Path(folder)).config.pretrained
    return create_transform(
        input_size=tuple(cfg.input_size),
        interpolation=cfg.interpolation,
        crop_pct=cfg.crop_pct,
        crop_mode=cfg.crop_mode,
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
    )


def timm_pixels(folder: Path, photos) -> "torch.Tensor":
    """Image files through timm's own eval transform for checkpoint `folder`'s pretrained_cfg: [N, C, H, W]."""
    import torch
    from PIL import Image

    transform = timm_eval_transform(folder)
    images = []
    for path in photos:
        with Image.open(path) as image:
            images.append(transform(image.convert("RGB")))
    return torch.stack(images)


def load_timm_model(folder: Path):
    """timm's own model for a checkpoint folder, holding its weights: fp32, eval mode, on the CPU.

    The checkpoint's input size is passed on: timm sizes some models by it (a ViT's position
    embedding), so a checkpoint saved at another size loads back as the model it was saved from.
    """
    import torch
    from safetensors.torch import load_file

    from .checkpoint import Checkpoint

    timm = require_timm()
    checkpoint = Checkpoint(Path(folder))
    config = checkpoint.config
    model = timm.create_model(
        config.architecture,
        pretrained=False,
        num_classes=config.num_classes,
        pretrained_cfg_overlay={"input_size": tuple(config.pretrained.input_size)},
    )
    if checkpoint.weights_path.suffix == ".safetensors":
        state = load_file(str(checkpoint.weights_path))
    else:
        state = torch.load(checkpoint.weights_path, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()
