"""Reward protocol helpers: input checks, conversions, weights-only loading, registry."""

import numpy as np
import pytest
import torch
from PIL import Image

from fastvideo.rewards import (
    BatchedReward,
    CheckpointError,
    RewardInputError,
    UnknownRewardError,
    available_rewards,
    build_reward,
    check_inputs,
    load_weights_only,
    pil_to_tensor,
    pils_to_tensor,
    tensor_to_pils,
)


def test_registry_names():
    assert available_rewards() == ("aesthetic", "clip", "clip_edit", "compressibility", "detail", "hpsv2", "imagereward",
                                   "pickscore", "saturation", "videoalign")


def test_unknown_reward_lists_valid_names():
    with pytest.raises(UnknownRewardError) as err:
        build_reward("hpsv9")
    for name in ("clip", "compressibility", "hpsv2", "pickscore"):
        assert name in str(err.value)


def test_build_reward_rejects_unknown_kwargs():
    with pytest.raises(TypeError, match="quality"):
        build_reward("compressibility", qualty=90)


def test_pil_tensor_round_trip_is_exact(make_images):
    x = make_images(2, 9, 7)
    pils = tensor_to_pils(x)
    assert [p.size for p in pils] == [(7, 9), (7, 9)]
    assert torch.equal(pils_to_tensor(pils), x)
    # Values off the 8-bit grid round to the nearest level, like diffusers' numpy_to_pil.
    y = torch.full((1, 3, 2, 2), 0.5)
    assert np.asarray(tensor_to_pils(y)[0])[0, 0, 0] == 128


def test_pil_to_tensor_converts_modes():
    rgba = Image.new("RGBA", (3, 2), (255, 0, 0, 10))
    gray = Image.new("L", (3, 2), 51)
    assert pil_to_tensor(rgba).shape == (3, 2, 3)
    assert torch.allclose(pil_to_tensor(gray), torch.full((3, 2, 3), 0.2))


@pytest.mark.parametrize(
    "images, match",
    [
        (torch.rand(3, 8, 8), r"\[B, 3, H, W\].*unsqueeze"),
        (torch.rand(2, 8, 8, 3), "channels-last"),
        (torch.rand(2, 4, 8, 8), r"\[B, 3, H, W\]"),
        (torch.randint(0, 255, (2, 3, 8, 8)), "floating point"),
        (torch.rand(2, 3, 8, 8) * 2 - 1, r"\[0, 1\].*x / 2 \+ 0.5"),
        (torch.full((2, 3, 8, 8), float("nan")), "NaN"),
        (["not an image", "x"], "PIL"),
        ("img.png", "list of PIL"),
    ],
)
def test_bad_images_are_rejected(images, match):
    with pytest.raises(RewardInputError, match=match):
        check_inputs(images, ["a", "b"])


def test_bad_prompts_are_rejected():
    x = torch.rand(2, 3, 8, 8)
    with pytest.raises(RewardInputError, match="list of strings"):
        check_inputs(x, "one prompt")
    with pytest.raises(RewardInputError, match="2 images but 3 prompts"):
        check_inputs(x, ["a", "b", "c"])
    with pytest.raises(RewardInputError, match="str"):
        check_inputs(x, ["a", 3])
    with pytest.raises(RewardInputError, match="empty"):
        check_inputs(torch.rand(0, 3, 8, 8), [])


class _Pickled:
    pass


def test_weights_only_refuses_pickled_objects(tmp_path):
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"state_dict": {"w": torch.ones(2)}}, good)
    torch.save({"state_dict": {"w": torch.ones(2)}, "obj": _Pickled()}, bad)
    assert torch.equal(load_weights_only(good)["state_dict"]["w"], torch.ones(2))
    with pytest.raises(CheckpointError, match="refusing to load .*pickled Python objects"):
        load_weights_only(bad)


class _Recorder(BatchedReward):
    name = "recorder"

    def __init__(self, batch_size):
        super().__init__(batch_size=batch_size)
        self.chunks = []

    def _score(self, images, prompts):
        self.chunks.append(len(prompts))
        return images.mean(dim=(1, 2, 3)).double()


def test_batched_reward_chunks_and_returns_float32_cpu(make_images):
    r = _Recorder(batch_size=3)
    x = make_images(7, 4, 4)
    out = r(x, ["p"] * 7)
    assert r.chunks == [3, 3, 1]
    assert out.dtype == torch.float32 and out.device.type == "cpu" and out.shape == (7,)
    assert torch.allclose(out, x.mean(dim=(1, 2, 3)))
    with pytest.raises(ValueError, match="batch_size"):
        _Recorder(batch_size=0)
