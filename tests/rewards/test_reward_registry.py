"""Rewards as plugins (fastvideo/rewards/registry.py): ``--rewards pkg.module:Name:WEIGHT`` for a
reward class of a module outside fastvideo/, registration on import, duplicate names refused, and
the built-in names unchanged."""

from __future__ import annotations

import sys

import pytest
import torch

from fastvideo.rewards import registry
from fastvideo.rewards.base import UnknownRewardError
from fastvideo.rewards.combine import RewardSpec, RewardSpecError, build_multi_reward, parse_reward_spec

PLUGIN = '''
import torch
from fastvideo.rewards.base import BatchedReward
from fastvideo.rewards.registry import register_reward


class Brightness(BatchedReward):
    """The mean pixel value of each image (a reward nobody registered by name)."""

    name = "brightness"

    def __init__(self, gain: float = 1.0, device="cpu", batch_size: int = 8):
        super().__init__(device=device, batch_size=batch_size)
        self.gain = gain

    def _score(self, images, prompts):
        return self.gain * images.float().mean(dim=(1, 2, 3))


class Darkness(Brightness):
    name = "darkness"

    def _score(self, images, prompts):
        return -images.float().mean(dim=(1, 2, 3))


def prompt_length(device="cpu"):
    """A factory function: called with the arguments it takes, returns the reward."""
    return lambda images, prompts: torch.tensor([float(len(p)) for p in prompts])


register_reward("plugin_darkness", Darkness)
NOT_A_REWARD = 3
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))  # the test's registrations stay here
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_builtin_names_resolve_as_before():
    assert registry.available_rewards()[:4] == ("aesthetic", "clip", "clip_edit", "compressibility")
    assert registry.reward_class("compressibility").__name__ == "JpegCompressibilityReward"
    assert parse_reward_spec("compressibility:0.5,detail") == [RewardSpec("compressibility", 0.5),
                                                               RewardSpec("detail", 1.0)]


def test_a_plugin_class_is_named_by_module_and_class_with_a_weight(plugin):
    specs = parse_reward_spec(f"{plugin}:Brightness:0.25,compressibility:1.0")
    assert specs == [RewardSpec(f"{plugin}:Brightness", 0.25), RewardSpec("compressibility", 1.0)]
    assert parse_reward_spec(f"{plugin}:Brightness") == [RewardSpec(f"{plugin}:Brightness", 1.0)]
    images = torch.rand(3, 3, 8, 8)
    multi = build_multi_reward(specs[:1], reward_kwargs={f"{plugin}:Brightness": {"gain": 2.0}},
                               common_kwargs={"device": "cpu", "batch_size": 2, "dtype": None})
    out = multi(images, ["a", "b", "c"])
    # the plugin's own argument reached it, and the common ones it takes (batch_size); dtype it does not take
    assert torch.allclose(out.raw[f"{plugin}:Brightness"], 2.0 * images.mean(dim=(1, 2, 3)))
    assert multi.components[0][2].batch_size == 2
    assert torch.allclose(out.total, 0.25 * 2.0 * images.mean(dim=(1, 2, 3)))


def test_a_name_registered_on_import_and_a_factory_function(plugin):
    specs = parse_reward_spec(f"{plugin}:plugin_darkness:1.0,{plugin}:prompt_length:0.5")
    assert [s.name for s in specs] == [f"{plugin}:plugin_darkness", f"{plugin}:prompt_length"]
    assert "plugin_darkness" in registry.available_rewards()  # registered by the import
    images = torch.rand(2, 3, 4, 4)
    dark = registry.build_reward("plugin_darkness", device="cpu", dtype=None, batch_size=1)
    assert torch.allclose(dark(images, ["x", "y"]), -images.mean(dim=(1, 2, 3)))
    length = registry.build_reward(f"{plugin}:prompt_length", device="cpu", batch_size=4, dtype=None)
    assert length(images, ["abc", "a"]).tolist() == [3.0, 1.0]


def test_duplicate_names_are_refused(plugin):
    registry.reward_class(f"{plugin}:Brightness")
    import my_rewards

    registry.register_reward("plugin_darkness", my_rewards.Darkness)  # the same class again: a no-op
    with pytest.raises(ValueError, match="'plugin_darkness' is already registered .*Darkness.*Brightness"):
        registry.register_reward("plugin_darkness", my_rewards.Brightness)
    with pytest.raises(ValueError, match="'hpsv2' is already registered .*fastvideo.rewards.hps:HPSv2Reward"):
        registry.register_reward("hpsv2", my_rewards.Brightness)
    with pytest.raises(RewardSpecError, match="appears twice"):
        parse_reward_spec(f"{plugin}:Brightness:1,{plugin}:Brightness:2")


@pytest.mark.parametrize("entry, message", [
    ("no_such_module_xyz:Thing:1.0", "reward plugin 'no_such_module_xyz:Thing': cannot import 'no_such_module_xyz'"),
    ("my_rewards:Missing:1.0", "reward plugin 'my_rewards:Missing': my_rewards has no 'Missing'"),
    ("my_rewards:NOT_A_REWARD", "it is a int, not a reward"),
    ("hpsv9:1.0", "unknown reward 'hpsv9'; valid names: aesthetic"),
    ("hpsv2:abc", "weight 'abc' of reward 'hpsv2' is not a number"),
    ("a:b:c:d", "bad entry 'a:b:c:d'"),
])
def test_bad_plugin_entries_fail_in_one_line(plugin, entry, message):
    with pytest.raises((UnknownRewardError, RewardSpecError)) as info:
        parse_reward_spec(entry)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_plugins_unknown_argument_is_refused_with_what_it_takes(plugin):
    with pytest.raises(TypeError, match="does not take \\['gian'\\]; it accepts: gain, device, batch_size"):
        registry.build_reward(f"{plugin}:Brightness", gian=2.0, dtype=None)
