"""Group-relative advantages (GRPO). Pure functions: no I/O, no collectives."""

from __future__ import annotations

import torch

EPS = 1e-8


def trimmed_stats(groups: torch.Tensor, trim_ratio: float, unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, G] -> (mean [n, 1], std [n, 1]) of each row; with trim_ratio > 0 of its G - k largest
    values, k = min(int(G * trim_ratio), G - 1) (MixGRPO's --trimmed_ratio drops the lowest k)."""
    if trim_ratio > 0:
        k = min(int(groups.shape[1] * trim_ratio), groups.shape[1] - 1)
        groups = groups.sort(dim=1).values[:, k:]
    return groups.mean(dim=1, keepdim=True), groups.std(dim=1, unbiased=unbiased, keepdim=True)


def group_advantages(rewards: torch.Tensor, group_size: int, clip_max: float, unbiased: bool = True,
                     trim_ratio: float = 0.0) -> torch.Tensor:
    """Per-group normalised advantages.

    rewards: [B] with B = num_groups * group_size, the G samples of a group contiguous.
    Returns [B]: (r - mean_group) / (std_group + 1e-8), clipped to +-clip_max. std is the sample
    std by default (torch.std, as upstream DanceGRPO's ``group_rewards.std()``); ``unbiased=False``
    gives the population std (Flow-GRPO). A group of identical rewards gets advantage 0.
    trim_ratio: MixGRPO's trimming, the mean and std over the group without its lowest rewards
    (trimmed_stats); every sample still gets an advantage.
    """
    if group_size < 2 or rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size} >= 2")
    r = rewards.float().view(-1, group_size)
    mean, std = trimmed_stats(r, trim_ratio, unbiased)
    adv = (r - mean) / (std + EPS)
    return adv.clamp(-clip_max, clip_max).reshape(-1)


def batch_advantages(rewards: torch.Tensor, clip_max: float, unbiased: bool = True) -> torch.Tensor:
    """Advantages normalised over the whole (gathered) batch: upstream's behaviour without
    --use_group, ``(r - mean) / (std + 1e-8)`` with torch.std's sample std by default. [B] -> [B]."""
    if rewards.ndim != 1 or rewards.numel() < 2:
        raise ValueError(f"batch advantages need at least 2 rewards; got shape {tuple(rewards.shape)}")
    r = rewards.float()
    return ((r - r.mean()) / (r.std(unbiased=unbiased) + EPS)).clamp(-clip_max, clip_max)


def zero_std_ratio(rewards: torch.Tensor, group_size: int, tol: float = 0.0) -> torch.Tensor:
    """Share of groups whose rewards are all equal (they carry no learning signal). [B] -> scalar."""
    r = rewards.float().view(-1, group_size)
    spread = r.max(dim=1).values - r.min(dim=1).values
    return (spread <= tol).float().mean()
