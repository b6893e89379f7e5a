"""Wan2.2-A14B's two experts as one module, and which expert a timestep goes to.

A two-expert folder (Wan-AI/Wan2.2-T2V-A14B-Diffusers; ``make_tiny_wan --variant a14b``) has
transformer/ (the high-noise expert) and transformer_2/ (the low-noise one) and model_index.json's
``boundary_ratio``. WanPipeline.__call__ computes ``boundary_timestep = boundary_ratio *
scheduler.config.num_train_timesteps`` and, at each step's timestep t, calls ``transformer`` with
``guidance_scale`` when ``t >= boundary_timestep``, else ``transformer_2`` with ``guidance_scale_2``
(None: the same as guidance_scale). ``WanExperts`` holds both under their folder names, so that its
state dict's keys are ``transformer.<name>`` and ``transformer_2.<name>`` and FSDP wraps it as one model
(each expert's blocks their own units); its forward takes the expert's index first. Imports torch only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

EXPERTS = ("transformer", "transformer_2")  # high noise, low noise (WanPipeline's attribute names)
HIGH, LOW = 0, 1


def folder_experts(root) -> tuple[float, int] | None:
    """(boundary_ratio, the scheduler's num_train_timesteps) of a two-expert folder: model_index.json
    names a class for transformer_2 and a boundary_ratio; None for a one-expert folder (Wan2.1, TI2V-5B:
    ``transformer_2: [null, null]``, ``boundary_ratio: null``) or a folder without model_index.json."""
    root = Path(root)
    try:
        index = json.loads((root / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    second = index.get("transformer_2") if isinstance(index, dict) else None
    ratio = index.get("boundary_ratio") if isinstance(index, dict) else None
    if not (isinstance(second, list) and len(second) == 2 and second[1]) or ratio is None:
        return None
    try:
        sched = json.loads((root / "scheduler" / "scheduler_config.json").read_text(encoding="utf-8"))
        train_steps = int(sched.get("num_train_timesteps", 1000))
    except (OSError, ValueError, TypeError):
        train_steps = 1000  # the schedulers' default
    return float(ratio), train_steps


class WanExperts(torch.nn.Module):
    """The high-noise ``transformer`` and the low-noise ``transformer_2`` of Wan2.2-A14B.
    forward(expert, **kwargs) is the chosen expert's forward (HIGH or LOW); ``config`` is the high-noise
    expert's (both have the same architecture in the published folders)."""

    def __init__(self, transformer: torch.nn.Module, transformer_2: torch.nn.Module, boundary_ratio: float,
                 num_train_timesteps: int = 1000):
        super().__init__()
        self.transformer = transformer
        self.transformer_2 = transformer_2
        self.boundary_ratio = float(boundary_ratio)
        self.num_train_timesteps = int(num_train_timesteps)

    @property
    def config(self):
        return self.transformer.config

    @property
    def diffusers_class_name(self) -> str:
        """Each expert's class (what a checkpoint's transformer config records)."""
        return type(self.transformer).__name__

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype

    @property
    def blocks(self) -> list[torch.nn.Module]:
        """Both experts' blocks, the high-noise expert's first (gradient checkpointing, compilation)."""
        return [*self.transformer.blocks, *self.transformer_2.blocks]

    @property
    def boundary_timestep(self) -> float:
        """WanPipeline's ``boundary_ratio * scheduler.config.num_train_timesteps``."""
        return self.boundary_ratio * self.num_train_timesteps

    def experts(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        return self.transformer, self.transformer_2

    def forward(self, expert: int = HIGH, **kwargs):
        """The expert's forward (default the high-noise one: one expert's pass, what the cost model times)."""
        return self.experts()[expert](**kwargs)


def high_noise(t: torch.Tensor, boundary_timestep: float) -> torch.Tensor:
    """bool [B]: the rows whose timestep t [B] goes to the high-noise expert (WanPipeline's
    ``t >= boundary_timestep``; the boundary itself is high noise)."""
    return t >= boundary_timestep


def expert_rows(t: torch.Tensor, boundary_timestep: float, shared: bool) -> list[tuple[int, torch.Tensor]]:
    """[(expert, int64 row indices)] to call for timesteps t [B]. ``shared``: t is the same step on every
    rank (the rollout's schedule), or there is one rank: only the experts some row needs are called.
    Otherwise (an update's per-sample timesteps, which differ across ranks) both experts are called so
    that every rank runs the same sharded units' collectives in the same order: an expert no row needs
    gets row 0 as a stand-in (``stand_in``: its output counts 0 times)."""
    high = high_noise(t, boundary_timestep)
    pairs = [(HIGH, torch.nonzero(high).flatten()), (LOW, torch.nonzero(~high).flatten())]
    return [(e, rows) for e, rows in pairs if rows.numel() or not shared]


def stand_in(rows: torch.Tensor) -> bool:
    """Whether an expert's call of expert_rows is a stand-in (no row of its own: row 0, weighed 0)."""
    return rows.numel() == 0
