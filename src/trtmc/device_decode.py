"""Decoding JPEG files where the engine runs: the pipeline's `decoder="torchvision"` option.

The default pipeline decodes and crops every file with PIL in worker processes, timm's exact transform; on the
H200 machine its 16 processes crop about 1,386 photos a second, which bounds a folder's rate
(benchmarks/NOTES.md, run 5). Here the host only reads each JPEG's bytes; a batch of them is decoded by
`torchvision.io.decode_jpeg` on the engine's device (nvJPEG on a GPU, libjpeg-turbo on a CPU), then resized and
center-cropped there (`PreprocessSpec.crop_tensor`). The pixels differ slightly from timm's (another JPEG
decoder's rounding on a GPU, torch's antialiased resize for PIL's), so this is an option beside the exact
default, and the difference is reported against it (top-1 agreement on the shipped photos). Files that are not
JPEGs, and JPEGs the decoder refuses, go through PIL as in the default path.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import torch

from .preprocess import PreprocessSpec

JPEG_MAGIC = b"\xff\xd8\xff"
# The default path for one file: its 8-bit crop by PIL, or why it cannot be read (`pipeline.crop_file`).
CropWithPil = Callable[[str], "np.ndarray | str"]


def require_torchvision() -> None:
    """Refuse the option up front where torchvision is not installed."""
    try:
        import torchvision.io  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            "--decoder torchvision needs torchvision (pip install torchvision, the build matching your torch); "
            "or leave --decoder at its default, pil"
        ) from exc


def read_files(crop_with_pil: CropWithPil, paths: list[str]) -> list[bytearray | np.ndarray | str]:
    """In a reading thread: each JPEG's bytes (read into a writable buffer that the decoder takes as it
    is); any other file cropped by PIL (or why it cannot be read)."""
    out: list[bytearray | np.ndarray | str] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                del data[f.readinto(data):]  # in place: a file that shrank meanwhile
        except OSError:
            data = bytearray()  # PIL names the problem
        out.append(data if data.startswith(JPEG_MAGIC) else crop_with_pil(path))
    return out


def decode_and_crop(
    spec: PreprocessSpec, encoded: list[tuple[str, bytearray]], device: str, crop_with_pil: CropWithPil
) -> list[torch.Tensor | np.ndarray | str]:
    """Each (path, JPEG bytes) decoded on `device` and cropped there: 8-bit HWC on `device`; a file the
    decoder refuses goes through PIL instead (its host crop, or its error)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    datas = [torch.frombuffer(data, dtype=torch.uint8) for _, data in encoded]
    try:
        images = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:  # one bad file fails the whole batch: decode them one by one
        images = []
        for data in datas:
            try:
                images.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                images.append(None)
    return [crop_with_pil(path) if image is None else spec.crop_tensor(image)
            for (path, _), image in zip(encoded, images)]
