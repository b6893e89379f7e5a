"""Which blocks --selective_checkpointing recomputes: upstream DanceGRPO's even spacing."""

from __future__ import annotations


def spaced_blocks(n: int, fraction: float) -> list[int]:
    """Indices (0-based) of the round(fraction * n) checkpointed blocks among n, spaced evenly as
    upstream's apply_fsdp_checkpointing picks them: block k (1-based) when k * fraction reaches the
    next half (0.5, 1.5, ...). fraction 1: every block; 0.5 of 4: blocks 0 and 2."""
    chosen, cut = [], 0.5
    for k in range(1, n + 1):
        if k * fraction >= cut:
            chosen.append(k - 1)
            cut += 1
    return chosen
