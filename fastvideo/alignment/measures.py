"""Measures for comparing two runs' numbers: relative errors, PSNR, Pearson correlation (float64, NumPy)."""

from __future__ import annotations

import math

import numpy as np


def relative_errors(a: np.ndarray, b: np.ndarray, floor: float = 1e-8) -> np.ndarray:
    """|a - b| / max(|a|, floor), elementwise; A is the reference."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.abs(a - b) / np.maximum(np.abs(a), floor)


def psnr(a: np.ndarray, b: np.ndarray, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB of two equally shaped images; inf when identical."""
    if a.shape != b.shape:
        raise ValueError(f"images differ in shape: {a.shape} vs {b.shape}")
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(peak * peak / mse)


def pearson(x, y) -> float:
    """Pearson correlation; NaN with fewer than 2 points or a constant series."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 2:
        return math.nan
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(np.sum(dx * dx) * np.sum(dy * dy)))
    return math.nan if denom == 0 else float(np.sum(dx * dy) / denom)
