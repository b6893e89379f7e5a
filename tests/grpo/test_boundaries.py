"""Boundaries (#39 test 23): advantage clipping of an outlier, on the plain and the non-finite path,
against DanceGRPO's formula written out; an evaluation statistic over one image."""

from __future__ import annotations

import math

import torch

from fastvideo.eval.stats import reward_stats
from fastvideo.grpo.advantages import finite_group_advantages, group_advantages

G, CLIP = 50, 5.0


def _dancegrpo(group: torch.Tensor) -> torch.Tensor:
    """train_grpo_flux.py: (group_rewards - mean) / (std + 1e-8), torch.std (sample), unclipped."""
    return (group - group.mean()) / (group.std() + 1e-8)


def test_an_outlier_is_clipped_and_the_rest_of_its_group_is_not():
    rewards = torch.zeros(G)
    rewards[7] = 10.0  # z = (G - 1) / sqrt(G) = 6.93 > 5: only a group this large can exceed the clip
    raw = _dancegrpo(rewards)
    assert raw[7] > CLIP + 1.5
    adv = group_advantages(rewards, G, CLIP)
    assert adv[7] == CLIP
    others = torch.arange(G) != 7
    torch.testing.assert_close(adv[others], raw[others])  # -1/sqrt(G)-ish, far inside the clip
    # the non-finite path (a dropped sample) clips the same way
    with_nan = torch.cat([rewards, torch.tensor([float("nan")])])
    adv_nan = finite_group_advantages(with_nan, G + 1, CLIP)
    assert adv_nan[7] == CLIP and adv_nan[-1] == 0
    negative = finite_group_advantages(-with_nan, G + 1, CLIP)
    assert negative[7] == -CLIP


def test_evaluation_statistics_over_one_image():
    one = torch.tensor([[0.25]])
    s = reward_stats(one, reference=torch.tensor([[0.25]]))
    assert (s.n, s.mean, s.std, s.ci95, s.win_rate) == (1, 0.25, 0.0, (0.25, 0.25), 0.5)  # a tie counts half
    assert not any(math.isnan(v) for v in (s.std, *s.ci95))
    two = reward_stats(torch.tensor([[0.0, 1.0]]))
    assert two.std == torch.tensor([0.0, 1.0], dtype=torch.float64).std().item() and two.n == 2
