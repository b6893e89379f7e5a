"""JPEG compressibility (DDPO): minus the JPEG size in kB."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from fastvideo.rewards import build_reward


def test_flat_image_scores_above_noise(make_images):
    r = build_reward("compressibility")
    flat = torch.full((1, 3, 64, 64), 0.4)
    noise = make_images(1, 64, 64)
    scores = r(torch.cat([flat, noise]), ["", ""])
    assert scores[0] > scores[1]
    assert scores[1] < -5.0  # 64x64 noise at q=95 is several kB
    assert scores.dtype == torch.float32


def test_value_is_minus_jpeg_kilobytes(make_images):
    x = make_images(2, 33, 20)
    r = build_reward("compressibility", quality=80)
    expected = []
    for a in (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG", quality=80)
        expected.append(-len(buf.getvalue()) / 1000)
    torch.testing.assert_close(r(x, ["a", "b"]), torch.tensor(expected))


def test_pil_input_and_batching(make_pils):
    pils = make_pils([(16, 16), (30, 10), (8, 40)])
    r1 = build_reward("compressibility", batch_size=1)
    r8 = build_reward("compressibility")
    assert torch.equal(r1(pils, ["a"] * 3), r8(pils, ["b"] * 3))  # prompts are ignored


def test_higher_quality_costs_more_bytes(make_images):
    x = make_images(1, 32, 32)
    assert build_reward("compressibility", quality=95)(x, [""]) < build_reward(
        "compressibility", quality=50)(x, [""])


@pytest.mark.parametrize("quality", [0, 101, 9.5])
def test_bad_quality(quality):
    with pytest.raises(ValueError, match="quality"):
        build_reward("compressibility", quality=quality)


def test_grayscale_pil_is_accepted():
    img = Image.fromarray(np.zeros((8, 8), dtype=np.uint8), mode="L")
    assert build_reward("compressibility")([img], [""]).shape == (1,)
