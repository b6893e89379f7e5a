"""MixGRPO's reward flags: the spec they map to, and advantage_aggr / reward_aggr against a hand
computation (Python's statistics module, sample std as torch.std / MixGRPO use)."""

import statistics

import pytest
import torch

from fastvideo.config import ConfigError, build_parser, validate_args
from fastvideo.rewards.advantages import mix_advantages

G = 4
HPS = [0.30, 0.25, 0.35, 0.20, 0.10, 0.10, 0.40, 0.22]
PICK = [20.0, 21.0, 19.0, 22.5, 18.0, 18.5, 19.0, 21.0]
W = {"hpsv2": 0.25, "pickscore": 0.75}


def _group_norm_by_hand(values):
    out = []
    for g in range(0, len(values), G):
        group = values[g:g + G]
        mean, std = statistics.fmean(group), statistics.stdev(group)
        out += [(v - mean) / (std + 1e-8) for v in group]
    return out


def test_advantage_aggr_by_hand():
    expected = [W["hpsv2"] * a + W["pickscore"] * b
                for a, b in zip(_group_norm_by_hand(HPS), _group_norm_by_hand(PICK))]
    got = mix_advantages({"hpsv2": torch.tensor(HPS), "pickscore": torch.tensor(PICK)}, W, G, "advantage_aggr")
    torch.testing.assert_close(got, torch.tensor(expected), rtol=0, atol=1e-5)


def test_reward_aggr_by_hand():
    merged = [W["hpsv2"] * a + W["pickscore"] * b for a, b in zip(HPS, PICK)]
    got = mix_advantages({"hpsv2": torch.tensor(HPS), "pickscore": torch.tensor(PICK)}, W, G, "reward_aggr")
    torch.testing.assert_close(got, torch.tensor(_group_norm_by_hand(merged)), rtol=0, atol=1e-5)
    # The two mixes really differ (PickScore's scale dominates the merged reward).
    other = mix_advantages({"hpsv2": torch.tensor(HPS), "pickscore": torch.tensor(PICK)}, W, G, "advantage_aggr")
    assert (got - other).abs().max() > 0.1


def _cfg(tmp_path, *flags):
    argv = ["--data_json_path", "x.json", "--pretrained_model_name_or_path", str(tmp_path), *flags]
    return validate_args(build_parser().parse_args(argv))


def test_multi_reward_maps_to_our_rewards_with_normalised_weights(tmp_path):
    cfg = _cfg(tmp_path, "--reward_model", "multi_reward", "--hps_weight", "2", "--image_reward_weight", "1",
               "--pick_score_weight", "1", "--use_group")
    assert [(s.name, s.weight) for s in cfg.reward.spec] == [("hpsv2", 0.5), ("imagereward", 0.25),
                                                             ("pickscore", 0.25)]
    assert cfg.reward.extras.multi_reward_mix == "advantage_aggr"  # MixGRPO's default


def test_unified_reward_becomes_a_vlm_judge_per_rank(tmp_path, monkeypatch):
    from fastvideo.training.builders import rank_reward_specs

    monkeypatch.setenv("RANK", "3")
    cfg = _cfg(tmp_path, "--reward_model", "multi_reward", "--unified_reward_url", "http://a:1,http://b:2/",
               "--multi_reward_mix", "reward_aggr", "--use_group")
    # The configuration is the same on every rank; rank 3 builds its judge on server 3 mod 2.
    assert cfg.reward.spec[-1].url == "http://a:1/v1?model=UnifiedReward|http://b:2/v1?model=UnifiedReward"
    vlm = rank_reward_specs(cfg.reward.spec, 3)[-1]
    assert (vlm.kind, vlm.url, vlm.weight) == ("vlm", "http://b:2/v1?model=UnifiedReward", 0.25)
    assert rank_reward_specs(cfg.reward.spec, 2)[-1].url == "http://a:1/v1?model=UnifiedReward"
    assert cfg.reward.extras.multi_reward_mix == "reward_aggr"


@pytest.mark.parametrize("flags, message", [
    (["--reward_model", "hpsv2", "--rewards", "hpsv2"], "not both"),
    (["--rewards", "hpsv2", "--multi_reward_mix", "reward_aggr"], "needs --reward_model"),
    (["--reward_model", "hpsv2", "--use_hpsv2", "--use_group"], "not both"),
    (["--reward_model", "hpsv2", "--reward_mix", "reward_aggr", "--use_group"], "not both"),
    (["--rewards", "hpsv2,pickscore", "--reward_mix", "reward_aggr"], "needs --use_group"),
    (["--rewards", "hpsv2,pickscore", "--use_group", "--reward_mix", "reward_aggr", "--reward_group_norm"],
     "--reward_group_norm"),
    (["--reward_model", "multi_reward"], "needs --use_group"),
    (["--reward_model", "unified_reward", "--use_group"], "--unified_reward_url"),
    (["--reward_model", "hpsv2", "--use_group", "--reward_group_norm"], "--reward_group_norm"),
    (["--reward_model", "hpsv2", "--use_group", "--hps_weight", "0"], "positive sum"),
])
def test_bad_combinations_fail_early(tmp_path, flags, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, *flags)


def test_unified_reward_url_none_means_no_judge(tmp_path):
    """MixGRPO's own scripts pass --unified_reward_url None: no judge, as upstream."""
    cfg = _cfg(tmp_path, "--reward_model", "multi_reward", "--unified_reward_url", "None", "--use_group")
    assert [s.name for s in cfg.reward.spec] == ["hpsv2", "imagereward", "pickscore"]
    assert not any("unified_reward_url" in n for n in cfg.compat_notes)
    with pytest.raises(ConfigError, match="--unified_reward_url"):
        _cfg(tmp_path, "--reward_model", "unified_reward", "--unified_reward_url", "None", "--use_group")


def test_reward_mix_is_our_own_flag_and_replays(tmp_path):
    """--reward_mix works with --rewards too; MixGRPO's selection resolves to --rewards + --reward_mix,
    so the resolved configuration replays (judge servers included) to the same rewards."""
    from fastvideo.config import resolved_flags

    ours = _cfg(tmp_path, "--rewards", "hpsv2:0.25,pickscore:0.75", "--reward_mix", "reward_aggr", "--use_group")
    assert ours.reward.extras.multi_reward_mix == "reward_aggr"
    mixgrpo = _cfg(tmp_path, "--reward_model", "multi_reward", "--unified_reward_url", "http://a:1,http://b:2",
                   "--hps_weight", "3", "--use_group")
    flags = resolved_flags(mixgrpo.to_json())
    assert flags["reward_mix"] == "advantage_aggr"
    argv = []
    for k, v in flags.items():
        if k in ("rewards", "reward_mix", "use_group"):
            argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    again = _cfg(tmp_path, *argv)
    assert again.reward.spec == mixgrpo.reward.spec
    assert again.reward.extras.multi_reward_mix == "advantage_aggr"


def test_servers_of_one_entry_must_serve_one_reward():
    from fastvideo.rewards.combine import RewardSpecError, parse_reward_spec

    spec = parse_reward_spec("vlm:http://a:1/v1?model=J|http://b:2/v1?model=J:0.5")
    assert [(s.name, s.url, s.weight) for s in spec] == [("vlm/J", "http://a:1/v1?model=J|http://b:2/v1?model=J", 0.5)]
    with pytest.raises(RewardSpecError, match="must serve one reward"):
        parse_reward_spec("vlm:http://a:1/v1?model=J|http://b:2/v1?model=K")
