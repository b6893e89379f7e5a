"""Comparing models on the same prompts and the same noise: summary statistics, win rates and the
paired difference against the reference model with its 95% Student t-interval over prompts."""

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


def _t_central_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's T with integer ``df`` degrees of freedom, by the finite series
    in theta = atan(t / sqrt(df)) (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) (1 + 1/2 cos^2 + 1.3/(2.4) cos^4 + ... up to cos^(df-2))
        term = total = 1.0
        for k in range(2, df, 2):
            term *= (k - 1) / k * c2
            total += term
        return s * total
    total = term = math.sqrt(c2) if df > 1 else 0.0  # cos + 2/3 cos^3 + ... up to cos^(df-2)
    for k in range(3, df - 1, 2):
        term *= (k - 1) / k * c2
        total += term
    return 2 / math.pi * (theta + s * total)


def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| <= t) = confidence (two-sided), T Student's with ``df`` >= 1 degrees of
    freedom: t_quantile(0.95, 5) = 2.5706 (bisection to double precision)."""
    if df < 1 or not 0 < confidence < 1:
        raise ValueError(f"t_quantile needs df >= 1 and 0 < confidence < 1, got {df}, {confidence}")
    lo, hi = 0.0, 1.0
    while _t_central_mass(hi, df) < confidence:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central_mass(mid, df) < confidence else (lo, mid)
        if hi - lo <= 1e-15 * hi:
            break
    return (lo + hi) / 2


@dataclass(frozen=True)
class PairedDifference:
    mean: float  # mean over all pairs of (model - reference)
    ci95: tuple[float, float]  # Student t-interval over prompts (nan with one prompt)
    prompts: int


def paired_difference(scores: torch.Tensor, reference: torch.Tensor) -> PairedDifference:
    """scores / reference: [P, K] on the same (prompt, noise) pairs. The K differences of a prompt
    are averaged first (images of one prompt are not independent draws from the prompt set), then
    a 95% t-interval with P - 1 degrees of freedom is put around the mean of the P prompt means."""
    if scores.shape != reference.shape:
        raise ValueError(f"a paired difference needs scores of the same pairs: {tuple(scores.shape)} vs "
                         f"{tuple(reference.shape)}")
    d = (scores.double() - reference.double()).reshape(scores.shape[0], -1).mean(dim=1)  # [P]
    p, mean = d.numel(), d.mean().item()
    if p < 2:
        return PairedDifference(mean, (float("nan"), float("nan")), p)
    half = t_quantile(0.95, p - 1) * d.std(unbiased=True).item() / math.sqrt(p)
    return PairedDifference(mean, (mean - half, mean + half), p)


def table_rows(labels: list[str], scores: list[dict[str, torch.Tensor]]) -> list[dict]:
    """One row per (model, reward): label, reward, mean, std, ci95_low, ci95_high, win_rate, n, and
    the paired difference to the first model (the reference; None on its own rows): diff_mean,
    diff_ci95_low, diff_ci95_high."""
    rows = []
    for i, (label, per_reward) in enumerate(zip(labels, scores)):
        for name, s in per_reward.items():
            st = reward_stats(s, None if i == 0 else scores[0][name])
            diff = None if i == 0 else paired_difference(s, scores[0][name])
            rows.append({"model": label, "reward": name, "mean": st.mean, "std": st.std, "ci95_low": st.ci95[0],
                         "ci95_high": st.ci95[1], "win_rate": st.win_rate, "n": st.n,
                         "diff_mean": diff and diff.mean, "diff_ci95_low": diff and diff.ci95[0],
                         "diff_ci95_high": diff and diff.ci95[1]})
    return rows


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _difference(r: dict) -> str:
    if r["diff_mean"] is None:
        return "—"
    return f"{r['diff_mean']:+.4g} [{r['diff_ci95_low']:.4g}, {r['diff_ci95_high']:.4g}]"


def markdown_table(rows: list[dict], reference: str) -> str:
    head = (f"| model | reward | mean | std | 95% CI | win rate vs {reference} | n "
            f"| difference vs {reference} [95% t-CI, paired by prompt] |\n"
            "|---|---|---:|---:|---|---:|---:|---|\n")
    body = "".join(
        f"| {r['model']} | {r['reward']} | {r['mean']:.4g} | {r['std']:.3g} | [{r['ci95_low']:.4g}, {r['ci95_high']:.4g}]"
        f" | {_percent(r['win_rate'])} | {r['n']} | {_difference(r)} |\n" for r in rows)
    return head + body
