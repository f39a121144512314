"""Image files the task reads: every format Pillow opens, converted to 8-bit RGB as timm's loader does, and the
files it must refuse (with the file named and the fix)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from support import IMAGES
from trtmc.tasks import InvalidInput, image_to_class_scores, load_image

CHELSEA = IMAGES / "chelsea.png"


def write_png16(pixels: np.ndarray, path) -> None:
    """A 16-bit-per-sample PNG written by hand (Pillow cannot write 16-bit RGB)."""
    height, width, channels = pixels.shape
    colour_type = {1: 0, 3: 2, 4: 6}[channels]
    rows = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_16_bit_grayscale_png_reads_as_its_8_bit_twin_not_clipped(tmp_path):
    gray8 = np.asarray(Image.open(CHELSEA).convert("L"))
    write_png16((gray8.astype(np.uint16) * 257)[..., None], tmp_path / "gray16.png")
    Image.fromarray(gray8, "L").save(tmp_path / "gray8.png")
    loaded = np.asarray(load_image(tmp_path / "gray16.png"))
    assert np.unique(loaded).size > 100  # clipping left 1 to 17 distinct values
    assert np.array_equal(loaded, np.asarray(load_image(tmp_path / "gray8.png")))


@pytest.mark.parametrize("channels", [3, 4])
def test_16_bit_colour_png_reads_as_its_8_bit_twin(tmp_path, channels):
    rgb8 = np.asarray(Image.open(CHELSEA).convert("RGB"))
    pixels = rgb8.astype(np.uint16) * 257
    if channels == 4:
        pixels = np.concatenate([pixels, np.full(pixels.shape[:2] + (1,), 65535, np.uint16)], axis=-1)
    write_png16(pixels, tmp_path / "colour16.png")
    assert np.array_equal(np.asarray(load_image(tmp_path / "colour16.png")), rgb8)


def test_every_format_and_mode_pillow_writes_becomes_rgb(tmp_path):
    photo = Image.open(CHELSEA)
    read = []
    for suffix in (".png", ".webp", ".bmp", ".gif", ".tiff", ".jpg"):
        for mode in ("L", "P", "CMYK", "RGBA", "LA", "1"):
            path = tmp_path / f"{mode}{suffix}"
            try:
                photo.convert(mode).save(path)
            except (OSError, KeyError, ValueError):
                continue  # this format cannot hold this mode
            loaded = load_image(path)
            assert loaded.mode == "RGB" and loaded.size == photo.size, path.name
            read.append((suffix, mode))
    formats, modes = {s for s, _ in read}, {m for _, m in read}
    assert formats == {".png", ".webp", ".bmp", ".gif", ".tiff", ".jpg"} and {"L", "CMYK", "RGBA", "P"} <= modes, read


def test_float_tiff_is_refused_with_the_fix(tmp_path):
    Image.fromarray(np.random.default_rng(0).random((8, 8), dtype=np.float32), "F").save(tmp_path / "float.tiff")
    with pytest.raises(InvalidInput, match=r"float.tiff: 'F' images .* no agreed range.*float32 HWC array"):
        load_image(tmp_path / "float.tiff")


def test_decompression_bomb_is_refused_as_invalid_input(tmp_path, monkeypatch):
    Image.new("RGB", (64, 64)).save(tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 64 // 4)  # twice over the limit: Pillow raises
    with pytest.raises(InvalidInput, match="bomb.png: refused as a possible decompression bomb"):
        load_image(tmp_path / "bomb.png")


def test_empty_nhwc_batch_says_no_images_were_given():
    # The batch is refused before the runtime is touched, so no bundle is needed.
    with pytest.raises(InvalidInput, match=r"no images given: the NHWC batch is empty \(shape \(0, 8, 8, 3\)\)"):
        image_to_class_scores(None, np.zeros((0, 8, 8, 3), np.float32))


def test_unreadable_file_names_the_formats_that_are_accepted(tmp_path):
    (tmp_path / "notes.txt").write_text("not an image")
    with pytest.raises(InvalidInput, match=r"notes.txt: not a readable image .*WebP, BMP, GIF, TIFF"):
        load_image(tmp_path / "notes.txt")
