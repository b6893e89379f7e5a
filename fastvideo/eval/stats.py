"""Comparing models on the same prompts and the same noise: summary statistics and win rates."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

Z95 = 1.959963984540054  # two-sided 95% normal quantile


@dataclass(frozen=True)
class RewardStats:
    mean: float
    std: float  # sample standard deviation (n - 1) over the n images
    ci95: tuple[float, float]  # normal-approximation interval of the mean
    win_rate: float | None  # vs the reference model on the same (prompt, image); None for the reference
    n: int


def reward_stats(scores: torch.Tensor, reference: torch.Tensor | None = None) -> RewardStats:
    """scores / reference: [P, K] for the same (prompt, image) pairs. A win is a higher score than
    the reference on the same pair; a tie counts half."""
    x = scores.double().reshape(-1)
    n = x.numel()
    mean = x.mean().item()
    std = x.std(unbiased=True).item() if n > 1 else 0.0
    half = Z95 * std / math.sqrt(n)
    win = None
    if reference is not None:
        ref = reference.double().reshape(-1)
        if ref.shape != x.shape:
            raise ValueError(f"win rate needs scores of the same pairs: {tuple(x.shape)} vs {tuple(ref.shape)}")
        win = ((x > ref).double() + 0.5 * (x == ref).double()).mean().item()
    return RewardStats(mean, std, (mean - half, mean + half), win, n)


def table_rows(labels: list[str], scores: list[dict[str, torch.Tensor]]) -> list[dict]:
    """One row per (model, reward): label, reward, mean, std, ci95_low, ci95_high, win_rate, n.
    The first model is the reference of the win rates."""
    rows = []
    for i, (label, per_reward) in enumerate(zip(labels, scores)):
        for name, s in per_reward.items():
            st = reward_stats(s, None if i == 0 else scores[0][name])
            rows.append({"model": label, "reward": name, "mean": st.mean, "std": st.std, "ci95_low": st.ci95[0],
                         "ci95_high": st.ci95[1], "win_rate": st.win_rate, "n": st.n})
    return rows


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def markdown_table(rows: list[dict], reference: str) -> str:
    head = ("| model | reward | mean | std | 95% CI | win rate vs " + reference + " | n |\n"
            "|---|---|---:|---:|---|---:|---:|\n")
    body = "".join(
        f"| {r['model']} | {r['reward']} | {r['mean']:.4g} | {r['std']:.3g} | [{r['ci95_low']:.4g}, {r['ci95_high']:.4g}]"
        f" | {_percent(r['win_rate'])} | {r['n']} |\n" for r in rows)
    return head + body
