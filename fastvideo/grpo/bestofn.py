"""Best-of-n group sampling (--bestofn K): which samples of each prompt's group the update trains.

DanceGRPO's HunyuanVideo trainer (XueZeyue/DanceGRPO at 15cc71d, fastvideo/train_grpo_hunyuan.py,
train_one_step) rolls out and scores every sample, computes the advantages over the full group, then
keeps the K / 2 samples of the highest and the K / 2 of the lowest score (``argsort`` of the weighted
advantages: ``sorted[-K//2:]`` and ``sorted[:K//2]``) and trains on those alone. Its launcher
(scripts/finetune/finetune_hunyuan_grpo.sh) passes 24 samples a prompt and ``--bestofn 8``.

Upstream selects over the rank's whole batch (one prompt there: train_batch_size 1); here within each
prompt's group, the same rows for that launcher. Pure functions: no I/O, no collectives."""

from __future__ import annotations

import torch


def best_of_n_rows(scores: torch.Tensor, group_size: int, keep: int) -> torch.Tensor:
    """[B] scores (B = groups x group_size, each group's samples contiguous) -> the kept rows, int64
    [groups x keep] ascending: in each group the keep // 2 lowest and the keep // 2 highest scores
    (ties: the earlier row ranks lower, a stable sort). keep even, 2 <= keep <= group_size; keep ==
    group_size keeps every row (upstream then trains the whole group)."""
    if keep % 2 or not 2 <= keep <= group_size or scores.ndim != 1 or scores.numel() % group_size:
        raise ValueError(f"best-of-n: keep {keep} must be even and in [2, {group_size}], and scores "
                         f"{tuple(scores.shape)} must split into groups of {group_size}")
    groups = scores.detach().float().cpu().view(-1, group_size)
    order = torch.sort(groups, dim=1, stable=True).indices
    half = keep // 2
    picked = torch.cat([order[:, :half], order[:, group_size - half:]], dim=1)
    offsets = torch.arange(groups.shape[0]).unsqueeze(1) * group_size
    return (picked + offsets).sort(dim=1).values.reshape(-1)
