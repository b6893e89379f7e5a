"""FLOP primitives shared by the model families' analytic FLOP counts (fastvideo.perf).

A matmul [m, k] x [k, n] costs 2*m*n*k FLOPs; element-wise work is not counted."""

from __future__ import annotations


def linear_flops(tokens: int, fan_in: int, fan_out: int) -> int:
    """nn.Linear on [tokens, fan_in]: 2 * tokens * fan_in * fan_out (bias adds are not counted)."""
    return 2 * tokens * fan_in * fan_out


def attention_flops(batch: int, q_len: int, kv_len: int, inner_dim: int) -> int:
    """Q K^T and A V over all heads: 2 * (2 * B * Lq * Lkv * inner_dim)."""
    return 4 * batch * q_len * kv_len * inner_dim
