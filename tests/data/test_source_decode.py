"""Editing sources decoded as the stock pipelines decode them (issue #51 item 1): every 8-bit mode
and an EXIF-rotated file equal diffusers' ``load_image`` pixel for pixel; a 16-bit grayscale PNG
(which PIL's RGB conversion clips to white) equals its values scaled to 8 bits; 32-bit integer and
float images are refused in one line; an oversized or bomb header is refused before decoding."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from fastvideo.data.sources import MAX_SOURCE_PIXELS, SourceImageError, open_rgb

RNG = np.random.default_rng(0)


def _rgb(h=24, w=40):
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _stock(path) -> np.ndarray:
    from diffusers.utils import load_image

    return np.asarray(load_image(str(path)))


EIGHT_BIT = {  # mode -> (image, file suffix)
    "RGB": lambda: (Image.fromarray(_rgb()), ".png"),
    "RGBA": lambda: (Image.fromarray(np.dstack([_rgb(), RNG.integers(0, 256, (24, 40), dtype=np.uint8)])), ".png"),
    "L": lambda: (Image.fromarray(_rgb()[..., 0]), ".png"),
    "LA": lambda: (Image.fromarray(_rgb()[..., :2].copy(), mode="LA"), ".png"),
    "P": lambda: (Image.fromarray(_rgb()).quantize(16), ".png"),
    "1": lambda: (Image.fromarray(_rgb()[..., 0] > 127), ".png"),
    "CMYK": lambda: (Image.fromarray(_rgb()).convert("CMYK"), ".jpg"),
    "RGB TIFF": lambda: (Image.fromarray(_rgb()), ".tif"),
}


@pytest.mark.parametrize("mode", sorted(EIGHT_BIT))
def test_each_8_bit_mode_decodes_as_diffusers_load_image(mode, tmp_path):
    im, suffix = EIGHT_BIT[mode]()
    path = tmp_path / f"source{suffix}"
    im.save(path)
    ours = np.asarray(open_rgb(path))
    assert ours.dtype == np.uint8 and ours.shape == (24, 40, 3)
    np.testing.assert_array_equal(ours, _stock(path))


def test_the_exif_orientation_is_applied_as_load_image_applies_it(tmp_path):
    pixels = _rgb(24, 40)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "rotated.jpg"
    Image.fromarray(pixels).save(path, exif=exif.tobytes(), quality=100)
    ours = np.asarray(open_rgb(path))
    assert ours.shape == (40, 24, 3)  # displayed upright: the sides swap
    np.testing.assert_array_equal(ours, _stock(path))


def test_16_bit_grayscale_is_scaled_to_8_bits_not_clipped_to_white(tmp_path):
    values = (np.arange(24 * 40).reshape(24, 40) * 68).astype(np.uint16)  # 0 .. 65212
    path = tmp_path / "gray16.png"
    Image.fromarray(values).save(path)
    ours = np.asarray(open_rgb(path))
    expected = np.round(values.astype(np.float64) * 255 / 65535).astype(np.uint8)
    for channel in range(3):
        np.testing.assert_array_equal(ours[..., channel], expected)
    # what PIL's conversion (and so load_image) makes of it: every value over 255 clipped, white
    np.testing.assert_array_equal(_stock(path)[..., 0], np.minimum(values, 255))


@pytest.mark.parametrize("mode, values, words", [("F", np.linspace(0, 1, 24 * 40, dtype=np.float32), "32-bit float"),
                                                 ("I", np.arange(24 * 40, dtype=np.int32) * 1000, "32-bit integer")])
def test_images_without_a_known_range_are_refused_in_one_line(mode, values, words, tmp_path):
    path = tmp_path / "wide.tif"
    Image.fromarray(values.reshape(24, 40)).save(path)
    assert Image.open(path).mode == mode
    with pytest.raises(SourceImageError, match=f"{words} image .*save it as an 8- or 16-bit PNG") as err:
        open_rgb(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def _png_header_only(path, width: int, height: int) -> None:
    """A PNG whose header claims width x height 8-bit gray pixels, with no image data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side, words", [(4104, "over the 16.8 MP a source may have"),
                                         (100_000, "claims more pixels than PIL decodes")])
def test_an_oversized_header_is_refused_before_decoding(side, words, tmp_path):
    assert side * side > MAX_SOURCE_PIXELS
    path = tmp_path / "huge.png"
    _png_header_only(path, side, side)
    with pytest.raises(SourceImageError, match=words):
        open_rgb(path)
