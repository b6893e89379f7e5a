"""The clipped GRPO policy loss. Pure functions with shapes in docstrings."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossStats:
    """Detached per-micro-batch statistics (tensors; reduced and logged by the trainer)."""

    ratio_mean: torch.Tensor
    ratio_abs_dev_max: torch.Tensor  # max |ratio - 1|
    clip_fraction: torch.Tensor


def candidate_steps(sampling_steps: int, train_last_step: bool = False) -> int:
    """How many transitions a sample may train on: 0 .. N-2 as upstream DanceGRPO (its [:, :-1] drops
    the last one), all N with ``train_last_step``."""
    return sampling_steps if train_last_step else sampling_steps - 1


def num_trained_steps(sampling_steps: int, timestep_fraction: float, train_last_step: bool = False) -> int:
    """T = int(candidates * timestep_fraction), at least 1 (N=16, 0.6 -> 9)."""
    return max(1, int(candidate_steps(sampling_steps, train_last_step) * timestep_fraction))


def timestep_selection(permutations: torch.Tensor, num_trained: int) -> torch.Tensor:
    """The first T indices of each sample's permutation. [B, n] -> [B, T]."""
    return permutations[:, :num_trained]


def clipped_policy_loss(
    log_prob_new: torch.Tensor,
    log_prob_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, LossStats]:
    """PPO-style clipped objective, averaged over the micro-batch.

    log_prob_new, log_prob_old, advantages: [B]. Returns (loss scalar, stats).
    loss = mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps))); the caller divides by
    (gradient_accumulation_steps * T).
    """
    ratio = torch.exp(log_prob_new - log_prob_old)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        stats = LossStats(
            ratio_mean=ratio.mean(),
            ratio_abs_dev_max=(ratio - 1).abs().max(),
            clip_fraction=((ratio - 1).abs() > clip_range).float().mean(),
        )
    return loss, stats
