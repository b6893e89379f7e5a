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
