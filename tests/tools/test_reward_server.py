"""python -m fastvideo.tools.reward_server: health record, request errors, CLI checks."""

import json
import sys
import urllib.error
import urllib.request

import pytest
import torch

import fastvideo
from fastvideo.rewards.combine import RewardSpecError
from fastvideo.tools.reward_server import build_app, build_parser, build_rewards
from server_utils import serve_in_thread


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url, body):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def served():
    args = build_parser().parse_args(["--rewards", "compressibility:0.5", "--device", "cpu", "--batch_size", "4"])
    rewards, info, device = build_rewards(args)
    with serve_in_thread(build_app(rewards, info, str(device))) as (url, _):
        yield url


def test_health_names_rewards_and_versions(served):
    health = _get(f"{served}/health")
    assert health["status"] == "ok" and health["device"] == "cpu"
    assert health["flux_grpo_version"] == fastvideo.__version__
    assert health["rewards"]["compressibility"]["class"] == "JpegCompressibilityReward"
    assert health["rewards"]["compressibility"]["batch_size"] == 4


def test_bad_requests_get_4xx_with_the_reason(served):
    code, reply = _post(f"{served}/score/compressibility", b"\x00\x00")
    assert code == 400 and "too short" in reply["detail"]
    code, reply = _post(f"{served}/score/hpsv2", b"")
    assert code == 404 and "compressibility" in reply["detail"]


def test_server_refuses_to_serve_remote_entries():
    args = build_parser().parse_args(["--rewards", "remote:http://h:1/hpsv2", "--device", "cpu"])
    with pytest.raises(RewardSpecError, match="local rewards only"):
        build_rewards(args)


def test_model_files_flags_reach_the_reward():
    args = build_parser().parse_args(["--rewards", "aesthetic", "--device", "cpu",
                                      "--aesthetic_dir", "/nonexistent/aes"])
    with pytest.raises(FileNotFoundError, match="/nonexistent/aes"):
        build_rewards(args)


PLUGIN = '''
import torch

def build(device, batch_size):
    def mean_brightness(images, prompts):
        return images.mean(dim=(1, 2, 3)) if isinstance(images, torch.Tensor) else [0.0] * len(images)
    return mean_brightness

def wrong_count(device, batch_size):
    return lambda images, prompts: [1.0]
'''


def test_plugin_rewards_are_served(tmp_path, monkeypatch):
    from fastvideo.rewards.remote import RemoteReward

    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    args = build_parser().parse_args(["--plugin", "bright=my_plugin:build", "--plugin", "bad=my_plugin:wrong_count",
                                      "--device", "cpu"])
    rewards, info, _ = build_rewards(args)
    assert info["bright"]["plugin"] == "my_plugin:build"
    images = torch.rand(3, 3, 8, 8)
    with serve_in_thread(build_app(rewards, info)) as (url, _):
        assert torch.equal(RemoteReward(f"{url}/bright")(images, ["a", "b", "c"]), images.mean(dim=(1, 2, 3)))
        with pytest.raises(Exception, match="returned \\[1\\] scores for 3 images"):
            RemoteReward(f"{url}/bad", retries=0)(images, ["a", "b", "c"])


@pytest.mark.parametrize("flags, message", [
    ([], "nothing to serve"),
    (["--plugin", "nameonly"], "NAME=MODULE:FACTORY"),
])
def test_bad_plugin_flags(flags, message):
    with pytest.raises(ValueError, match=message):
        build_rewards(build_parser().parse_args(["--device", "cpu", *flags]))


def test_clip_dir_reaches_the_served_clip_edit_reward(tiny_rewards, tmp_path):
    """The server ignored --clip_dir for clip_edit (it looked in ./clip_ckpt): the trainer and the
    server now read one table of the reward-model flags (rewards.flags.model_reward_kwargs)."""
    from fastvideo.rewards.registry import build_reward

    args = build_parser().parse_args(["--rewards", "clip_edit", "--clip_dir", str(tiny_rewards.pickscore_dir),
                                      "--device", "cpu", "--batch_size", "2"])
    rewards, info, _ = build_rewards(args)
    direct = build_reward("clip_edit", clip_dir=tiny_rewards.pickscore_dir, batch_size=2)
    images, sources = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    assert torch.equal(rewards["clip_edit"](images, ["a cat", "a dog"], sources=sources),
                       direct(images, ["a cat", "a dog"], sources=sources))
