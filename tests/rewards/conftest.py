import os

import numpy as np
import pytest
import torch
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = ["a red cube on a table", "a dog running on a beach", "blue sky over mountains", "x"]


@pytest.fixture(scope="session")
def hps_reward(tiny_rewards):
    from fastvideo.rewards import build_reward

    return build_reward(
        "hpsv2", hps_ckpt_dir=tiny_rewards.hps_ckpt_dir, model_name=tiny_rewards.hps_model_name,
        batch_size=3,
    )


@pytest.fixture(scope="session")
def pickscore_reward(tiny_rewards):
    from fastvideo.rewards import build_reward

    return build_reward("pickscore", pickscore_dir=tiny_rewards.pickscore_dir, batch_size=3)


@pytest.fixture(scope="session")
def clip_reward(tiny_rewards):
    from fastvideo.rewards import build_reward

    return build_reward("clip", clip_dir=tiny_rewards.pickscore_dir, batch_size=3)


def random_images(n: int, h: int = 40, w: int = 48, seed: int = 0) -> torch.Tensor:
    """[n, 3, h, w] in [0, 1], exactly representable in 8 bits (so PIL round trips are exact)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), generator=g).float() / 255.0


def random_pils(sizes, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


@pytest.fixture
def make_images():
    return random_images


@pytest.fixture
def make_pils():
    return random_pils


@pytest.fixture
def prompts():
    return list(PROMPTS)
