"""Group-relative advantages (GRPO). Pure functions: no I/O, no collectives."""

from __future__ import annotations

import torch

EPS = 1e-8
GLOBAL_STD_EPS = 1e-4  # Flow-GRPO / DiffusionNFT: np.std(all rewards) + 1e-4


def trimmed_stats(groups: torch.Tensor, trim_ratio: float, unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, G] -> (mean [n, 1], std [n, 1]) of each row; with trim_ratio > 0 of its G - k largest
    values, k = min(int(G * trim_ratio), G - 1) (MixGRPO's --trimmed_ratio drops the lowest k)."""
    if trim_ratio > 0:
        k = min(int(groups.shape[1] * trim_ratio), groups.shape[1] - 1)
        groups = groups.sort(dim=1).values[:, k:]
    return groups.mean(dim=1, keepdim=True), groups.std(dim=1, unbiased=unbiased, keepdim=True)


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] -> [B / G, G] float32 rows of G contiguous rewards; ValueError when B does not split."""
    if group_size < 2 or rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size} >= 2")
    return rewards.float().view(-1, group_size)


def _masked_mean(rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[n, G] -> [n, 1]: each row's mean over its ``valid`` entries (0 for a row with none)."""
    count = valid.sum(dim=1, keepdim=True)
    return torch.where(valid, rows, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)


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
    r = _groups(rewards, group_size)
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


def masked_standardize(groups: torch.Tensor, valid: torch.Tensor, unbiased: bool = True,
                       eps: float = EPS) -> torch.Tensor:
    """(r - mean) / (std + eps) per row of ``groups`` [n, G] over the entries where ``valid`` [n, G]
    (bool) holds; the others, and every entry of a row with fewer than 2 valid ones (no spread to
    normalise by: the group is skipped), get 0. Dropped samples thus add no policy-gradient signal.

    The rows' statistics are the ones torch.mean / torch.std would give over the valid entries
    alone (the same formula, not the same kernel: equal up to rounding)."""
    r = groups.float()
    count = valid.sum(dim=1, keepdim=True)
    mean = _masked_mean(r, valid)
    dev = torch.where(valid, r - mean, 0.0)
    var = (dev * dev).sum(dim=1, keepdim=True) / (count - int(unbiased)).clamp(min=1)
    # A row with one valid entry has dev 0 there (and no spread): 0, like a skipped group.
    return torch.where(valid, dev / (var.sqrt() + eps), 0.0)


def finite_group_advantages(rewards: torch.Tensor, group_size: int, clip_max: float,
                            unbiased: bool = True, trim_ratio: float = 0.0) -> torch.Tensor:
    """:func:`group_advantages` where non-finite rewards are dropped: each group's advantages come
    from its finite rewards (untrimmed); a dropped sample, and a group with fewer than 2 finite
    rewards, get 0. All finite: exactly :func:`group_advantages` (with trim_ratio). [B] -> [B]."""
    if bool(torch.isfinite(rewards).all()):
        return group_advantages(rewards, group_size, clip_max, unbiased, trim_ratio)
    r = _groups(rewards, group_size)
    return masked_standardize(r, torch.isfinite(r), unbiased).clamp(-clip_max, clip_max).reshape(-1)


def finite_batch_advantages(rewards: torch.Tensor, clip_max: float, unbiased: bool = True) -> torch.Tensor:
    """:func:`batch_advantages` over the finite rewards; non-finite ones get 0 (all of them when
    fewer than 2 are finite). All finite: exactly :func:`batch_advantages`. [B] -> [B]."""
    if bool(torch.isfinite(rewards).all()):
        return batch_advantages(rewards, clip_max, unbiased)
    r = rewards.float().view(1, -1)
    return masked_standardize(r, torch.isfinite(r), unbiased).clamp(-clip_max, clip_max).reshape(-1)


def global_std_advantages(rewards: torch.Tensor, group_size: int, clip_max: float,
                          unbiased: bool = False) -> torch.Tensor:
    """(r - group mean) / (std of every reward + 1e-4), clipped to +-clip_max: Flow-GRPO's and
    DiffusionNFT's ``config.sample.global_std`` (their PerPromptStatTracker). [B] -> [B].

    rewards: the whole iteration's rewards (gathered over ranks), groups of G contiguous. The std
    is over all of them (population with unbiased=False, as np.std). A non-finite reward is left
    out of both statistics and gets 0; a group's only finite reward is its mean, so it gets 0 too."""
    r = _groups(rewards, group_size)
    valid = torch.isfinite(r)
    mean = _masked_mean(r, valid)
    finite = r[valid]
    std = finite.std(unbiased=unbiased) if finite.numel() > 1 else torch.zeros(())
    adv = torch.where(valid, (r - mean) / (std + GLOBAL_STD_EPS), 0.0)
    return adv.clamp(-clip_max, clip_max).reshape(-1)
