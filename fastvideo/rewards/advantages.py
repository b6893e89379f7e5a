"""Advantages from several rewards' raw scores: per-group standardisation and MixGRPO's mixes.

:func:`group_normalize` is the within-group standardisation (r - mean) / (std + eps) over the G
consecutive samples of one prompt; rewards/combine.py weights normalised rewards with it.
:func:`mix_advantages` is ``--reward_mix`` (MixGRPO's ``--multi_reward_mix``, mapped by fastvideo.compat), with
std the unbiased sample std (torch's default, which MixGRPO uses):

- ``advantage_aggr``: A = sum_k w_k * (r_k - mean_g(r_k)) / (std_g(r_k) + 1e-8)
  (each reward's advantages per group, then their weighted sum; not normalised again);
- ``reward_aggr``:    R = sum_k w_k * r_k, A = (R - mean_g(R)) / (std_g(R) + 1e-8).

A module of its own below combine.py, which uses it, and importable without the reward models.
"""

from __future__ import annotations

from typing import Mapping

import torch

from fastvideo.grpo.advantages import masked_standardize

MIX_MODES = ("advantage_aggr", "reward_aggr")
EPS = 1e-8


def group_normalize(
    scores: torch.Tensor, num_generations: int, eps: float = 1e-8, unbiased: bool = True, trim_ratio: float = 0.0,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B]`` -> ``[B]``: (r - group mean) / (group std + eps) over consecutive groups of G.

    unbiased=True matches torch.std's default, which DanceGRPO's advantages use. trim_ratio > 0:
    mean and std without each group's lowest int(G * trim_ratio) scores (MixGRPO's --trimmed_ratio).
    ``valid`` [B] bool (None: all): the samples kept; when some are dropped (non-finite rewards) the
    statistics come from the kept ones alone, untrimmed, and dropped samples and groups with fewer
    than 2 kept get 0 (grpo.advantages.masked_standardize).
    """
    if num_generations < 2:
        raise ValueError(f"group normalisation needs num_generations >= 2; got {num_generations}")
    if scores.ndim != 1 or scores.numel() % num_generations:
        raise ValueError(
            f"scores {list(scores.shape)} cannot be split into groups of {num_generations}: "
            "a batch must hold whole groups"
        )
    groups = scores.float().view(-1, num_generations)
    if valid is not None and not bool(valid.all()):
        return masked_standardize(groups, valid.view(-1, num_generations), unbiased, eps).view(-1)
    stats = groups
    if trim_ratio > 0:
        k = min(int(num_generations * trim_ratio), num_generations - 1)
        stats = groups.sort(dim=1).values[:, k:]
    mean = stats.mean(dim=1, keepdim=True)
    std = stats.std(dim=1, keepdim=True, unbiased=unbiased)
    return ((groups - mean) / (std + eps)).view(-1)


def mix_advantages(raw: Mapping[str, torch.Tensor], weights: Mapping[str, float], group_size: int,
                   mode: str, trim_ratio: float = 0.0) -> torch.Tensor:
    """MixGRPO's advantages from raw per-reward scores ([B] each, groups of G contiguous). [B].

    A sample with a non-finite score under any reward is dropped from its group (advantage 0)."""
    if mode not in MIX_MODES:
        raise ValueError(f"unknown mix {mode!r}; use one of {MIX_MODES}")
    names = list(weights)
    valid = finite_samples(raw)
    if mode == "advantage_aggr":
        return sum(weights[n] * group_normalize(raw[n].float(), group_size, EPS, True, trim_ratio, valid)
                   for n in names)
    merged = sum(weights[n] * raw[n].float() for n in names)
    return group_normalize(merged, group_size, EPS, True, trim_ratio, valid)


def finite_samples(raw: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """[B] bool: the samples every reward scored with a finite number."""
    valid = None
    for scores in raw.values():
        ok = torch.isfinite(scores)
        valid = ok if valid is None else valid & ok
    return valid
