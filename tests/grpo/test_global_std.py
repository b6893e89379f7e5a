"""--global_std: Flow-GRPO's and DiffusionNFT's config.sample.global_std (per-prompt mean, the std
of every reward of the iteration + 1e-4), against their PerPromptStatTracker."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fastvideo.config import ConfigError, GRPOSettings, build_parser, validate_args
from fastvideo.grpo.advantages import global_std_advantages, group_advantages
from upstream_facts import STAT_REWARDS, load_facts

BASE = ["--data_json_path", "x", "--pretrained_model_name_or_path", "x", "--rewards", "compressibility:1"]
NAN = float("nan")


def _numpy_reference(rewards: np.ndarray, G: int) -> np.ndarray:
    """Written from the formula: each group's mean, np.std (population) of all rewards + 1e-4."""
    groups = rewards.reshape(-1, G)
    return ((groups - groups.mean(axis=1, keepdims=True)) / (np.std(rewards) + 1e-4)).reshape(-1)


def test_global_std_is_the_group_mean_over_the_std_of_everything():
    gen = torch.Generator().manual_seed(0)
    # three groups of 4 on very different scales: the per-group std would differ 100x
    r = torch.randn(12, generator=gen, dtype=torch.float64) * torch.tensor([0.01] * 4 + [1.0] * 4 + [0.1] * 4,
                                                                              dtype=torch.float64)
    adv = global_std_advantages(r.float(), 4, clip_max=50.0)
    np.testing.assert_allclose(adv.numpy(), _numpy_reference(r.numpy(), 4), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(adv, group_advantages(r.float(), 4, 50.0, unbiased=False), atol=1e-2)
    sample = global_std_advantages(r.float(), 4, clip_max=50.0, unbiased=True)  # --adv_std sample
    expected = (r.view(3, 4) - r.view(3, 4).mean(1, keepdim=True)) / (r.std() + 1e-4)
    torch.testing.assert_close(sample, expected.view(-1).float(), rtol=1e-5, atol=1e-6)
    assert global_std_advantages(torch.tensor([0.0, 0, 0, 100]), 4, clip_max=1.0).max() == 1.0  # clipped


def test_global_std_equals_flow_grpos_stat_tracker():
    """Flow-GRPO's PerPromptStatTracker(global_std=True) on 3 prompts x G 8 (its outputs kept in
    tests/fixtures/upstream_facts.json, from flow_grpo ac4c86e flow_grpo/stat_tracking.py)."""
    facts = load_facts()["flow_grpo_stat_tracker"]
    upstream = np.asarray(facts["global"])
    ours = global_std_advantages(torch.tensor(STAT_REWARDS, dtype=torch.float64).float(), 8, clip_max=100.0)
    np.testing.assert_allclose(ours.numpy(), upstream, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(facts["per_prompt"]) - upstream).max() > 0.1  # upstream's other mode differs


def test_nonfinite_rewards_stay_out_of_both_statistics():
    r = torch.tensor([1.0, NAN, 3.0, 5.0, 2.0, 4.0, 6.0, 8.0, NAN, 7.0, NAN, NAN])
    adv = global_std_advantages(r, 4, clip_max=50.0)
    finite = r[torch.isfinite(r)]
    std = finite.std(unbiased=False) + 1e-4
    torch.testing.assert_close(adv[[0, 2, 3]], (r[[0, 2, 3]] - 3.0) / std)
    torch.testing.assert_close(adv[4:8], (r[4:8] - 5.0) / std)
    assert adv[1] == 0 and adv[8:].abs().sum() == 0  # dropped; a group with one finite reward: 0
    assert torch.isfinite(adv).all()


def _objective_on_rank(rank, rewards_by_rank, G=4, **grpo):
    """GRPOObjective.group_advantages on one rank of a 2-rank data-parallel group (gather stubbed)."""
    from fastvideo.algorithms.grpo import GRPOObjective

    fields = dict(use_group=True, adv_std="population", train_last_step=False, timestep_fraction=0.5,
                  clip_range=0.2, adv_clip_max=5.0, loss_coef=1.0, global_std=True)
    obj = GRPOObjective.__new__(GRPOObjective)
    obj.g = GRPOSettings(**{**fields, **grpo})
    obj.num_generations, obj.device = G, torch.device("cpu")
    obj.dims = SimpleNamespace(dp_rank=rank, gather_dp=lambda t: torch.cat(rewards_by_rank))
    return obj.group_advantages(rewards_by_rank[rank])


def test_the_objective_divides_by_every_ranks_rewards():
    gen = torch.Generator().manual_seed(2)
    ranks = [torch.rand(8, generator=gen), 10 * torch.rand(8, generator=gen)]  # rank 1's spread is 10x
    everything = torch.cat(ranks)
    expected = torch.from_numpy(_numpy_reference(everything.double().numpy(), 4)).float().clamp(-5, 5)
    for rank in (0, 1):
        torch.testing.assert_close(_objective_on_rank(rank, ranks), expected[rank * 8:(rank + 1) * 8],
                                   rtol=1e-5, atol=1e-6)
    # without the flag a rank's groups are normalised alone, as before
    local = _objective_on_rank(0, ranks, global_std=False)
    torch.testing.assert_close(local, group_advantages(ranks[0], 4, 5.0, unbiased=False))


@pytest.mark.parametrize("flags, match", [
    (["--global_std"], "needs --use_group"),
    (["--global_std", "--use_group", "--trimmed_ratio", "0.25"], "pick one"),
])
def test_global_std_flag_errors(flags, match):
    with pytest.raises(ConfigError, match=match):
        validate_args(build_parser().parse_args(BASE + flags))


def test_global_std_reaches_the_settings_and_defaults_off():
    assert validate_args(build_parser().parse_args(BASE + ["--use_group", "--global_std"])).grpo.global_std
    assert not validate_args(build_parser().parse_args(BASE + ["--use_group"])).grpo.global_std
    assert GRPOSettings.flags_from_resolved({"use_group": True})["global_std"] is False  # an older config.json


def test_global_std_with_a_reward_mix_is_refused():
    from fastvideo.algorithms.base import ObjectiveContext
    from fastvideo.algorithms.grpo import GRPOObjective
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.sampling.randomness import RandomSource

    fields = dict(use_group=True, adv_std="population", train_last_step=False, timestep_fraction=0.5,
                  clip_range=0.2, adv_clip_max=5.0, loss_coef=1.0, global_std=True)
    cfg = SimpleNamespace(grpo=GRPOSettings(**fields), update=None, mix=None,
                          rollout=SimpleNamespace(num_generations=4, eta=0.5, shift=3.0))
    context = ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0), device=torch.device("cpu"),
                               randomness=RandomSource(3), reward=SimpleNamespace(mix="reward_aggr"))
    with pytest.raises(ConfigError, match="--global_std does not apply with --reward_mix"):
        GRPOObjective(context)
