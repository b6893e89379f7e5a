"""--rewards parsing, weighted combination and per-group normalisation."""

import pytest
import torch

from fastvideo.rewards import (
    MultiReward,
    RewardSpec,
    RewardSpecError,
    UnknownRewardError,
    build_multi_reward,
    format_reward_spec,
    group_normalize,
    legacy_reward_spec,
    parse_reward_spec,
    resolve_reward_specs,
)


class Fixed:
    """A reward returning fixed scores, to check the arithmetic by hand."""

    def __init__(self, name, values):
        self.name = name
        self.values = torch.tensor(values, dtype=torch.float32)
        self.calls = 0

    def __call__(self, images, prompts):
        self.calls += 1
        assert len(prompts) == len(self.values)
        return self.values.clone()


def test_parse_spec():
    assert parse_reward_spec("hpsv2:1.0,pickscore:0.5") == [
        RewardSpec("hpsv2", 1.0), RewardSpec("pickscore", 0.5)]
    assert parse_reward_spec(" clip , compressibility:-2e-1 ") == [
        RewardSpec("clip", 1.0), RewardSpec("compressibility", -0.2)]
    assert format_reward_spec(parse_reward_spec("hpsv2:1,pickscore:0.5")) == "hpsv2:1,pickscore:0.5"


@pytest.mark.parametrize(
    "spec, error, match",
    [
        ("", RewardSpecError, "non-empty"),
        ("hpsv2:1.0,", RewardSpecError, "stray comma"),
        ("hpsv2:abc", RewardSpecError, "'abc' of reward 'hpsv2' is not a number"),
        ("hpsv2:1:2", RewardSpecError, "name:weight"),
        (":1.0", RewardSpecError, "name:weight"),
        ("hpsv2:nan", RewardSpecError, "finite"),
        ("hpsv2:1,hpsv2:2", RewardSpecError, "twice"),
        ("hpsv2:0,clip:0", RewardSpecError, "all reward weights are zero"),
        ("nosuchreward:1", UnknownRewardError,
         "valid names: aesthetic, clip, clip_edit, compressibility, detail, hpsv2, imagereward, pickscore, saturation"),
    ],
)
def test_parse_spec_errors(spec, error, match):
    with pytest.raises(error, match=match):
        parse_reward_spec(spec)


def test_legacy_flags():
    assert legacy_reward_spec(use_hpsv2=True) == [RewardSpec("hpsv2", 1.0)]
    both = [RewardSpec("hpsv2", 1.0), RewardSpec("pickscore", 1.0)]
    assert legacy_reward_spec(True, True) == both
    assert legacy_reward_spec() == []
    assert resolve_reward_specs(None, use_hpsv2=True) == [RewardSpec("hpsv2", 1.0)]
    assert resolve_reward_specs("hpsv2:2", use_hpsv2=True) == [RewardSpec("hpsv2", 2.0)]
    with pytest.raises(RewardSpecError, match="--use_pickscore is set but --rewards"):
        resolve_reward_specs("hpsv2:1", use_pickscore=True)


def test_weighted_sum_without_normalisation():
    a = Fixed("a", [1.0, 2.0, 3.0, 4.0])
    b = Fixed("b", [10.0, 0.0, -10.0, 5.0])
    out = MultiReward([("a", 1.0, a), ("b", 0.5, b)])(None, ["p"] * 4)
    assert torch.equal(out.total, torch.tensor([6.0, 2.0, -2.0, 6.5]))
    assert set(out.raw) == {"a", "b"} and torch.equal(out.raw["b"], b.values)
    assert a.calls == b.calls == 1


def test_group_normalisation_by_hand():
    r = torch.tensor([1.0, 3.0, 10.0, 10.0, 2.0, 4.0])  # groups of 2: (1,3) (10,10) (2,4)
    s = 2 ** 0.5  # unbiased std of two values 2 apart
    expected = torch.tensor([-1 / s, 1 / s, 0.0, 0.0, -1 / s, 1 / s])
    torch.testing.assert_close(group_normalize(r, 2), expected)
    # biased: std of (1, 3) is 1
    torch.testing.assert_close(group_normalize(r, 2, unbiased=False)[:2], torch.tensor([-1.0, 1.0]))
    with pytest.raises(ValueError, match="whole groups"):
        group_normalize(r, 4)
    with pytest.raises(ValueError, match=">= 2"):
        group_normalize(r, 1)


def test_normalised_combination():
    a = Fixed("a", [0.30, 0.32, 0.20, 0.40])        # HPS-like scale
    b = Fixed("b", [-100.0, -50.0, -80.0, -80.0])   # compressibility-like scale
    multi = MultiReward([("a", 1.0, a), ("b", 2.0, b)], normalize=True, num_generations=2)
    out = multi(None, ["p"] * 4)
    expected = group_normalize(a.values, 2) + 2.0 * group_normalize(b.values, 2)
    torch.testing.assert_close(out.total, expected)
    # within each group the scale of the raw rewards no longer matters
    assert out.total[0] < out.total[1] and out.total[2] < out.total[3]
    assert torch.equal(out.raw["b"], b.values)  # raw scores are logged unnormalised
    with pytest.raises(ValueError, match="num_generations"):
        MultiReward([("a", 1.0, a)], normalize=True)


def test_build_multi_reward(make_images):
    spec = "compressibility:2.0"
    multi = build_multi_reward(
        spec, reward_kwargs={"compressibility": {"quality": 90}, "hpsv2": {"hps_ckpt_dir": "x"}},
        common_kwargs={"device": "cpu", "batch_size": 2},
    )
    assert multi.names == ["compressibility"]
    x = make_images(3, 16, 16)
    out = multi(x, ["a", "b", "c"])
    single = multi.components[0][2]
    assert single.quality == 90 and single.batch_size == 2
    torch.testing.assert_close(out.total, 2.0 * out.raw["compressibility"])


def test_build_multi_reward_with_models(tiny_rewards, make_images, prompts):
    multi = build_multi_reward(
        "hpsv2:1.0,pickscore:0.5",
        reward_kwargs={
            "hpsv2": {"hps_ckpt_dir": tiny_rewards.hps_ckpt_dir,
                      "model_name": tiny_rewards.hps_model_name},
            "pickscore": {"pickscore_dir": tiny_rewards.pickscore_dir},
        },
        normalize=True, num_generations=2,
    )
    out = multi(make_images(4), prompts)
    expected = group_normalize(out.raw["hpsv2"], 2) + 0.5 * group_normalize(out.raw["pickscore"], 2)
    torch.testing.assert_close(out.total, expected)


def test_combine_of_chunked_raw_scores_equals_whole_batch_call():
    """score_raw on slices, concatenated, then combine == __call__ on the whole batch (what the
    overlapped reward pipeline relies on), with group normalisation over groups of 4."""
    from fastvideo.rewards.combine import MultiReward

    gen = torch.Generator().manual_seed(3)
    images = torch.rand(8, 3, 16, 16, generator=gen)
    prompts = [f"p{i // 4}" for i in range(8)]
    mean = lambda ims, ps: ims.mean(dim=(1, 2, 3))  # noqa: E731
    top = lambda ims, ps: ims[:, 0, 0, 0] * 10  # noqa: E731
    multi = MultiReward([("mean", 1.0, mean), ("top", 0.5, top)], normalize=True, num_generations=4)
    whole = multi(images, prompts)
    parts = [multi.score_raw(images[s:s + 3], prompts[s:s + 3]) for s in range(0, 8, 3)]
    joined = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    out = multi.combine(joined)
    assert torch.equal(out.total, whole.total)
    assert all(torch.equal(out.raw[k], whole.raw[k]) for k in whole.raw)
    assert not torch.allclose(out.total, 1.0 * joined["mean"] + 0.5 * joined["top"])  # normalised
