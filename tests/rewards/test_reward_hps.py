"""HPSv2.1 reward on tiny weights: behaviour, preprocessing and error paths.

Parity with the hpsv2 package itself is in test_reward_hps_parity.py.
"""

import shutil

import pytest
import torch

from fastvideo.rewards import CheckpointError, RewardInputError, build_reward
from fastvideo.rewards.base import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from fastvideo.rewards.hps import HPSv2Reward, hps_preprocess


def test_deterministic_and_float32(hps_reward, make_images, prompts):
    x = make_images(4)
    a, b = hps_reward(x, prompts), hps_reward(x, prompts)
    assert a.dtype == torch.float32 and a.shape == (4,)
    assert torch.equal(a, b)
    # normalised features: the score is a cosine, and the random images must not all tie
    assert a.abs().max() <= 1.0 and a.std() > 1e-3


def test_batch_equals_single_calls(hps_reward, make_images, prompts):
    x = make_images(4)
    batched = hps_reward(x, prompts)  # batch_size=3: chunks of 3 + 1
    singles = torch.cat([hps_reward(x[i : i + 1], prompts[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, singles, atol=1e-5, rtol=0)


def test_each_image_scored_against_its_own_prompt(hps_reward, make_images, prompts):
    x = make_images(2)
    ab = hps_reward(x, prompts[:2])
    ba = hps_reward(x.flip(0), prompts[:2][::-1])
    torch.testing.assert_close(ba, ab.flip(0), atol=1e-6, rtol=0)
    # and the prompt matters: image 0 with prompt 1 scores differently
    crossed = hps_reward(x, prompts[:2][::-1])
    assert (crossed - ab).abs().min() > 1e-4


def test_pil_and_tensor_inputs_agree(hps_reward, make_images, prompts):
    from fastvideo.rewards import tensor_to_pils

    x = make_images(3, 50, 31)
    torch.testing.assert_close(
        hps_reward(tensor_to_pils(x), prompts[:3]), hps_reward(x, prompts[:3]), atol=1e-6, rtol=0
    )


def test_mixed_sizes_in_a_list(hps_reward, make_pils, prompts):
    pils = make_pils([(40, 48), (32, 32), (20, 70)])
    scores = hps_reward(pils, prompts[:3])
    singles = torch.cat([hps_reward([p], [q]) for p, q in zip(pils, prompts)])
    torch.testing.assert_close(scores, singles, atol=1e-5, rtol=0)


def test_hps_weights_are_the_ones_used(tiny_rewards, hps_reward, make_images, prompts):
    """The HPS state_dict (not only the base open_clip weights) drives the score."""
    import open_clip

    base = open_clip.create_model(tiny_rewards.hps_model_name, pretrained=None)
    base.load_state_dict(torch.load(tiny_rewards.hps_ckpt_dir / "open_clip_pytorch_model.bin"))
    tuned = torch.load(tiny_rewards.hps_ckpt_dir / "HPS_v2.1_compressed.pt")["state_dict"]
    key = "visual.proj"
    assert torch.equal(hps_reward.model.state_dict()[key], tuned[key].float())
    assert not torch.equal(hps_reward.model.state_dict()[key], base.state_dict()[key])


def test_preprocess_resizes_longer_side_and_pads():
    # A white 20x10 (h x w) image into 8x8: resized to 8x4, padded 2 columns each side.
    x = torch.ones(1, 3, 20, 10)
    out = hps_preprocess(x, 8)
    assert out.shape == (1, 3, 8, 8)
    mean = torch.tensor(OPENAI_CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(OPENAI_CLIP_STD).view(3, 1, 1)
    pixels = out[0] * std + mean
    torch.testing.assert_close(pixels[:, :, :2], torch.zeros(3, 8, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(pixels[:, :, 6:], torch.zeros(3, 8, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(pixels[:, :, 2:6], torch.ones(3, 8, 4), atol=1e-5, rtol=0)
    # Odd padding: the extra column goes right/bottom (pad // 2 left, the rest right).
    odd = hps_preprocess(torch.ones(1, 3, 8, 5), 8) * std + mean
    assert odd[0, 0, 0, 0].abs() < 1e-6 and odd[0, 0, 0, 1] > 0.99
    assert odd[0, 0, 0, 5] > 0.99 and odd[0, 0, 0, 6].abs() < 1e-6
    # Already-sized non-square images are padded too (hpsv2 would fail on them).
    assert hps_preprocess(torch.ones(1, 3, 8, 6), 8).shape == (1, 3, 8, 8)


def test_wrong_image_shapes(hps_reward, prompts):
    with pytest.raises(RewardInputError, match=r"\[B, 3, H, W\]"):
        hps_reward(torch.rand(3, 32, 32), prompts[:1])
    with pytest.raises(RewardInputError, match="channels-last"):
        hps_reward(torch.rand(1, 32, 32, 3), prompts[:1])
    with pytest.raises(RewardInputError, match="1 images but 2 prompts"):
        hps_reward(torch.rand(1, 3, 32, 32), prompts[:2])


def _hps_kwargs(tiny, folder):
    return dict(
        hps_ckpt_dir=folder, model_name=tiny.hps_model_name, model_config=tiny.hps_model_config
    )


def test_missing_folder_names_files_and_sources(tiny_rewards, tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        HPSv2Reward(**_hps_kwargs(tiny_rewards, tmp_path / "nope"))
    msg = str(err.value)
    for needle in ("open_clip_pytorch_model.bin", "HPS_v2.1_compressed.pt", "xswu/HPSv2",
                   "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"):
        assert needle in msg


def test_missing_file_is_named(tiny_rewards, tmp_path):
    folder = tmp_path / "hps"
    folder.mkdir()
    shutil.copy(tiny_rewards.hps_ckpt_dir / "open_clip_pytorch_model.bin", folder)
    with pytest.raises(FileNotFoundError, match="lacks HPS_v2.1_compressed.pt.*xswu/HPSv2"):
        HPSv2Reward(**_hps_kwargs(tiny_rewards, folder))


def _copy_with_hps(tiny, folder, payload):
    folder.mkdir()
    shutil.copy(tiny.hps_ckpt_dir / "open_clip_pytorch_model.bin", folder)
    torch.save(payload, folder / "HPS_v2.1_compressed.pt")
    return folder


def test_checkpoint_without_state_dict(tiny_rewards, tmp_path):
    sd = torch.load(tiny_rewards.hps_ckpt_dir / "HPS_v2.1_compressed.pt")["state_dict"]
    folder = _copy_with_hps(tiny_rewards, tmp_path / "hps", {"model": sd})
    with pytest.raises(CheckpointError, match=r"no 'state_dict' entry.*\['model'\]"):
        HPSv2Reward(**_hps_kwargs(tiny_rewards, folder))


class Payload:
    """Stands in for any pickled object; weights-only loading must refuse it."""


def test_checkpoint_with_pickled_object_is_refused(tiny_rewards, tmp_path):
    sd = torch.load(tiny_rewards.hps_ckpt_dir / "HPS_v2.1_compressed.pt")["state_dict"]
    folder = _copy_with_hps(tiny_rewards, tmp_path / "hps", {"state_dict": sd, "args": Payload()})
    with pytest.raises(CheckpointError, match="refusing to load .*pickled Python objects"):
        HPSv2Reward(**_hps_kwargs(tiny_rewards, folder))


def test_checkpoint_for_another_model(tiny_rewards, tmp_path):
    folder = _copy_with_hps(tiny_rewards, tmp_path / "hps", {"state_dict": {"w": torch.ones(1)}})
    with pytest.raises(CheckpointError, match="does not match the model"):
        HPSv2Reward(**_hps_kwargs(tiny_rewards, folder))


def test_unknown_model_name(tiny_rewards):
    with pytest.raises(ValueError, match="no model config named 'ViT-Q-99'"):
        build_reward("hpsv2", hps_ckpt_dir=tiny_rewards.hps_ckpt_dir, model_name="ViT-Q-99")
