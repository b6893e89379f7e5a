"""PNG output: per-image files round-trip exactly; one captioned grid per group."""

import numpy as np
import pytest
import torch
from PIL import Image

from fastvideo.sampling.images import save_group_grids, save_images, to_uint8


def _images(b=6, h=32, w=24):
    return torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(0))


def test_save_images_layout_and_pixels(tmp_path):
    imgs = _images()
    paths = save_images(imgs, tmp_path, iteration=12, rank=3)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        f"images/step_000012/flux_3_{i}.png" for i in range(6)]
    back = np.asarray(Image.open(paths[4]))
    expected = (imgs[4].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    assert back.shape == (32, 24, 3) and np.array_equal(back, expected)


def test_to_uint8_clamps_and_checks_shape():
    x = torch.tensor([-0.5, 0.0, 0.5, 1.0, 2.0]).view(1, 1, 1, 5).expand(1, 3, 1, 5)
    assert to_uint8(x)[0, 0, :, 0].tolist() == [0, 0, 128, 255, 255]
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        to_uint8(torch.rand(3, 4, 4))


def test_group_grids_one_file_per_group_with_reward_captions(tmp_path):
    imgs = _images(b=6)
    rewards = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    paths = save_group_grids(imgs, rewards, 3, tmp_path, iteration=5, rank=1, captions=["a cat", "a dog"])
    assert [p.name for p in paths] == ["group_1_0.png", "group_1_1.png"]
    grid = np.asarray(Image.open(paths[1]))
    assert grid.shape[1] == 3 * 24 and grid.shape[0] > 32
    # the second image of group 1 (sample 4) sits in column 1, below the title
    top = grid.shape[0] - 32 - 14
    cell = grid[top : top + 32, 24:48]
    assert np.array_equal(cell, to_uint8(imgs[4:5])[0].numpy())
    # caption rows under the images hold dark text pixels (the reward)
    assert (grid[top + 32 :, :24] < 128).any()
    # one caption per image is accepted too
    save_group_grids(imgs, rewards.tolist(), 3, tmp_path, 5, captions=["a"] * 6)


def test_group_grid_input_errors(tmp_path):
    with pytest.raises(ValueError, match="groups"):
        save_group_grids(_images(b=5), torch.zeros(5), 3, tmp_path, 0)
    with pytest.raises(ValueError, match="rewards"):
        save_group_grids(_images(b=6), torch.zeros(5), 3, tmp_path, 0)
    with pytest.raises(ValueError, match="captions"):
        save_group_grids(_images(b=6), torch.zeros(6), 3, tmp_path, 0, captions=["a"] * 4)
