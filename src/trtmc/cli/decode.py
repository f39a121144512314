"""`trtmc decode`: an image as raw RGB float32 HWC, the input the C and C++ SDK consumers read."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="write an image as raw RGB float32 for the C and C++ SDK consumers",
        description="Decode an image file as the task does (RGB, values / 255) and write it as raw float32 HWC "
        "in [0, 1], native byte order, no header (.rgb.f32). Prints the image's height and width.",
        epilog="example:\n"
        "  build/sdk_consumer_c lite0.bundle chelsea.rgb.f32 $(trtmc decode examples/images/chelsea.png)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("image", type=Path, help="an image file Pillow reads (JPEG, PNG, WebP, BMP, GIF, TIFF, ...)")
    p.add_argument("-o", "--output", type=Path,
                   help="file to write (default: the image's name with the suffix .rgb.f32, in the current folder)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..files import write_bytes_atomically
    from ..tasks import decode_image

    pixels = decode_image(args.image)
    write_bytes_atomically(args.output or Path(args.image.name).with_suffix(".rgb.f32"), pixels.tobytes())
    print(f"{pixels.shape[0]} {pixels.shape[1]}")
    return 0
