"""The reward and advantage statistics a run logs (training/metrics.py reward_metrics): over every
data-parallel rank's samples, population standard deviations, the largest advantage magnitude."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from fastvideo.algorithms.base import RewardResult
from fastvideo.training.metrics import reward_metrics


class TwoRanks:
    """gather_dp as on rank 0 of two: this rank's values, then the other rank's."""

    def __init__(self, other: dict):
        self.other = other

    def gather_dp(self, t):
        for mine, theirs in self.other.items():
            if t.shape == mine.shape and torch.equal(t, mine):
                return torch.cat([t, theirs])
        raise AssertionError(f"an unexpected gather: {t}")


def test_reward_std_and_adv_abs_max_are_over_every_rank():
    """Issue #39 test 26: reward_std is the population std of all ranks' rewards (not this rank's, not
    the unbiased one) and adv_abs_max the largest |advantage| anywhere (here on the other rank, and
    negative)."""
    rewards, other_rewards = torch.tensor([1.0, 3.0]), torch.tensor([5.0, 11.0])
    adv, other_adv = torch.tensor([0.5, -2.0]), torch.tensor([-3.0, 1.0])
    per, other_per = torch.tensor([2.0, 4.0]), torch.tensor([6.0, 8.0])
    dims = TwoRanks({rewards: other_rewards, adv: other_adv, per: other_per})
    cfg = SimpleNamespace(rollout=SimpleNamespace(num_generations=2), grpo=SimpleNamespace(use_group=True))
    rec = reward_metrics(dims, "cpu", RewardResult(rewards, {"r": per}), adv, cfg)
    assert rec["reward_mean"] == pytest.approx(5.0)
    assert rec["reward_std"] == pytest.approx(math.sqrt((16 + 4 + 0 + 36) / 4))  # 3.742; unbiased: 4.320
    assert rec["reward/r_mean"] == pytest.approx(5.0) and rec["reward/r_std"] == pytest.approx(math.sqrt(5.0))
    assert rec["adv_abs_max"] == 3.0
    assert rec["adv_mean"] == pytest.approx(-0.875)
    assert rec["adv_std"] == pytest.approx(torch.tensor([0.5, -2.0, -3.0, 1.0]).std(unbiased=False).item())
    assert rec["_samples"] == 4 and rec["zero_std_ratio"] == 0.0
