"""The trainer's reward flags build the newer rewards with the right files, or fail by name."""

import pytest
import torch

from fastvideo.config import ConfigError, build_parser, validate_args
from fastvideo.training import builders


def _cfg(tmp_path, *extra):
    argv = ["--data_json_path", str(tmp_path / "x.json"), "--pretrained_model_name_or_path",
            str(tmp_path), "--output_dir", str(tmp_path / "out"), *extra]
    return validate_args(build_parser().parse_args(argv))


def test_aesthetic_flags_build_the_reward(tmp_path, tiny_rewards, make_images):
    from fastvideo.rewards import build_reward

    cfg = _cfg(tmp_path, "--rewards", "aesthetic:2", "--aesthetic_dir", str(tiny_rewards.aesthetic_dir),
               "--aesthetic_clip_name", tiny_rewards.aesthetic_clip_name, "--reward_batch_size", "3")
    multi = builders.build_rewards(cfg, torch.device("cpu"))
    assert multi.names == ["aesthetic"]
    images = make_images(4)
    direct = build_reward("aesthetic", aesthetic_dir=tiny_rewards.aesthetic_dir,
                          clip_model_name=tiny_rewards.aesthetic_clip_name)(images, ["p"] * 4)
    out = multi(images, ["p"] * 4)
    torch.testing.assert_close(out.raw["aesthetic"], direct)
    torch.testing.assert_close(out.total, 2 * direct)


def test_missing_aesthetic_folder_names_the_files(tmp_path):
    cfg = _cfg(tmp_path, "--rewards", "aesthetic", "--aesthetic_dir", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="sac\\+logos\\+ava1-l14-linearMSE.pth"):
        builders.build_rewards(cfg, torch.device("cpu"))


@pytest.mark.parametrize("flags, message", [
    (["--reward_timeout", "0"], "--reward_timeout"),
    (["--reward_retries", "-1"], "--reward_retries"),
    (["--vlm_concurrency", "0"], "--vlm_concurrency"),
])
def test_bad_remote_settings_fail_early(tmp_path, flags, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, "--rewards", "compressibility", *flags)


def test_image_reward_flags_build_the_reward(tmp_path, tiny_rewards, make_images):
    cfg = _cfg(tmp_path, "--rewards", "imagereward:0.5,compressibility:0.1",
               "--image_reward_dir", str(tiny_rewards.image_reward_dir))
    multi = builders.build_rewards(cfg, torch.device("cpu"))
    assert multi.names == ["imagereward", "compressibility"]
    out = multi(make_images(2), ["a red cube", "a dog"])
    assert out.raw["imagereward"].shape == (2,) and torch.isfinite(out.raw["imagereward"]).all()


def test_missing_image_reward_files_are_named(tmp_path):
    (tmp_path / "ir").mkdir()
    (tmp_path / "ir" / "ImageReward.pt").write_bytes(b"")
    cfg = _cfg(tmp_path, "--rewards", "imagereward", "--image_reward_dir", str(tmp_path / "ir"))
    with pytest.raises(FileNotFoundError, match="med_config.json, vocab.txt"):
        builders.build_rewards(cfg, torch.device("cpu"))
