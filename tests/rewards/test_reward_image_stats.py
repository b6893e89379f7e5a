"""Image-statistics rewards (detail = Laplacian energy, saturation): hand-computed values and PIL parity."""

import numpy as np
import pytest
import torch
from PIL import Image

from fastvideo.rewards import build_reward


def test_detail_flat_is_zero_and_checkerboard_is_four():
    r = build_reward("detail")
    flat = torch.full((1, 3, 8, 8), 0.3)
    yy, xx = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    board = ((yy + xx) % 2).float().expand(3, 8, 8).unsqueeze(0)  # grey checkerboard, luma 0/1
    scores = r(torch.cat([flat, board]), ["", ""])
    assert scores[0].item() == pytest.approx(0.0, abs=1e-6)
    # every interior pixel: |4*v - 4*(1 - v)| = 4 for v in {0, 1}
    assert scores[1].item() == pytest.approx(4.0, abs=1e-5)


def test_detail_matches_hand_laplacian_on_a_ramp_with_a_step():
    # Luma of a pure-red image is 0.299 * R; a vertical step of height 1 in R at column 3.
    img = torch.zeros(1, 3, 5, 6)
    img[0, 0, :, 3:] = 1.0
    score = build_reward("detail")(img, [""]).item()
    # interior 3x4 pixels; columns 2 and 3 (of 1..4) see |±0.299|, the others 0
    assert score == pytest.approx(2 * 3 * 0.299 / 12, rel=1e-5)


def test_detail_prefers_noise_to_a_blur(make_images):
    x = make_images(1, 32, 32)
    blurred = torch.nn.functional.avg_pool2d(x, 5, stride=1, padding=2, count_include_pad=False)
    s = build_reward("detail")(torch.cat([x, blurred]), ["", ""])
    assert s[0] > 3 * s[1]


def test_saturation_matches_pil_hsv(make_images):
    x = make_images(3, 17, 11)
    scores = build_reward("saturation")(x, ["a"] * 3)
    pils = [Image.fromarray(a) for a in (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()]
    expected = [np.asarray(im.convert("HSV"))[..., 1].astype(np.float64).mean() / 255 for im in pils]
    # PIL quantises S to 8 bits: agree to within one step
    assert scores.tolist() == pytest.approx(expected, abs=1 / 255)
    grey = build_reward("saturation")(torch.full((1, 3, 4, 4), 0.5), [""])
    assert grey.item() == 0.0


def test_pil_and_tensor_inputs_agree(make_images):
    x = (make_images(2, 16, 16) * 255).round() / 255
    pils = [Image.fromarray(a) for a in (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()]
    for name in ("detail", "saturation"):
        r = build_reward(name)
        assert torch.allclose(r(x, ["", ""]), r(pils, ["", ""]), atol=1e-6)


def test_detail_refuses_tiny_images():
    with pytest.raises(ValueError, match="at least 3x3"):
        build_reward("detail")(torch.zeros(1, 3, 2, 8), [""])
