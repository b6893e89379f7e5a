"""The objective protocol: what the trainer asks of an RL algorithm.

    objective = registry.build_objective("grpo", context)   # or "my_pkg.my_module:MyObjective"
    adv = objective.advantages(rewards)                     # RewardResult -> [B]
    for micro in objective.plan_update(traj, iteration):    # micro-batches of Terms
        for term in micro:
            loss = objective.loss(policy, traj, adv, term, stats)   # scaled; backward is the caller's
    means, maxes = objective.summarize(stats)
    objective.after_update(policy, iteration)

An objective is built by a factory ``factory(context) -> Objective`` (usually its class); the
context carries its own settings (``settings``: the section of its ``settings`` class, see
fastvideo.settings.ObjectiveSettings), the update's micro-batch size and accumulation (``update``)
and the run's parts it may need (parallel dims, rewards, randomness, device, a weight copier).
fastvideo.algorithms.registry makes it selectable with ``--algorithm name``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from fastvideo.errors import ConfigError


@dataclass
class RewardResult:
    total: torch.Tensor  # [B] float32 on the CPU, the weighted sum used for advantages
    per_reward: dict[str, torch.Tensor]  # name -> [B] raw scores (for logging and MixGRPO's mixing)


@dataclass
class Term:
    """One forward/backward unit of an update: the micro-batch's sample rows and, for objectives
    that train on stored transitions, the transition each row trains on.

    rows [b] int64 (CPU), rows of the Trajectory; steps [b] int64 (CPU) or None. A term of
    ``timesteps`` k > 1 is k of them stacked along the batch (stack_timesteps: rows and steps
    concatenated, b = k x the micro-batch's samples), one forward and backward for all; an
    objective's loss, a sum over rows scaled by rows.numel(), is the same sum."""

    micro_batch: int
    rows: torch.Tensor
    steps: torch.Tensor | None = None
    timesteps: int = 1


def stack_timesteps(micro_batches: list[list[Term]], k: int) -> list[list[Term]]:
    """Batched timestep replay (--update_timesteps_per_forward): each micro-batch's terms, k at a
    time, as one Term with their rows and steps concatenated ([t0's rows, t1's rows, ...]); the
    last group of a micro-batch may be shorter. k <= 1, or terms without steps: unchanged."""
    if k <= 1:
        return micro_batches
    out = []
    for terms in micro_batches:
        if any(t.steps is None for t in terms):
            out.append(terms)
            continue
        groups = [terms[i:i + k] for i in range(0, len(terms), k)]
        out.append([Term(g[0].micro_batch, torch.cat([t.rows for t in g]), torch.cat([t.steps for t in g]),
                         sum(t.timesteps for t in g)) for g in groups])
    return out


@dataclass
class ObjectiveContext:
    """What an objective may read when it is built."""

    cfg: Any  # fastvideo.config.TrainConfig (the built-in objectives read their sections from it)
    dims: Any  # fastvideo.distributed.parallel.ParallelDims
    device: torch.device
    settings: Any = None  # its own settings (the section of its ``settings`` class), or None
    update: Any = None  # component_settings.update.UpdateSettings: micro-batch size, accumulation
    # Samples per prompt: a trajectory's rows come in consecutive groups of this many (Trajectory.group_ids)
    group_size: int = 1
    reward: Any = None  # the run's reward (fastvideo.rewards.combine.MultiReward)
    randomness: Any = None  # fastvideo.sampling.randomness.RandomSource
    # () -> a shard-local float32 copy of the trainable weights (training.ema.WeightCopy: step(decay),
    # swapped_in(), the checkpointer's full_state_dict / load_full_state_dict), for an old policy
    copy_weights: Callable[[], Any] | None = None
    extras: dict = field(default_factory=dict)


class StatsAccumulator:
    """Detached statistics of an update's terms, summed; ``first_max`` keys keep the maximum over
    the first micro-batch's terms (those precede any optimizer step)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.first_max: dict[str, torch.Tensor] = {}
        self.terms = 0  # (micro-batch, timestep) terms: a stacked Term counts its timesteps
        self.forwards = 0  # loss calls: one forward + backward each

    def add(self, term: Term, sums: dict[str, torch.Tensor], first_max: dict[str, torch.Tensor] | None = None):
        """``sums``: the term's means over its rows; a stacked term's weigh its k timesteps (the
        per-timestep means of equal-sized parts average to the whole's mean)."""
        for k, v in sums.items():
            if k not in self.sums:
                self.sums[k] = torch.zeros((), device=self.device)
            self.sums[k] += v if term.timesteps == 1 else v * term.timesteps
        if term.micro_batch == 0:
            for k, v in (first_max or {}).items():
                self.first_max[k] = torch.maximum(self.first_max.get(k, torch.zeros((), device=self.device)), v)
        self.terms += term.timesteps
        self.forwards += 1

    def mean(self, key: str) -> float:
        return float(self.sums.get(key, torch.zeros(())) / max(1, self.terms))


class Objective(ABC):
    """One RL algorithm's maths. Subclasses implement advantages, plan_update and loss."""

    name = ""
    # Its settings class (fastvideo.settings.ObjectiveSettings, with a ``section``): its own flags and
    # what the run needs to know of it before it is built; None: no flags of its own.
    settings = None
    # The rollout keeps every transition's log-probability (GRPO); False: only the clean samples.
    needs_log_probs = True
    # The rollout keeps every step's latents (Trajectory.latents: GRPO's transitions); False: only
    # each sample's clean latent x0 and its conditioning (NFT's forward process re-noises x0).
    needs_trajectory = True
    # The objective keeps a float32 copy of the trainable weights (ObjectiveContext.copy_weights: an
    # old policy, as NFT's): the memory estimates count it.
    needs_old_policy = False

    @abstractmethod
    def advantages(self, rewards: RewardResult) -> torch.Tensor:
        """[B] local rewards -> [B] advantages (may gather across the data-parallel group)."""

    @abstractmethod
    def plan_update(self, traj, iteration: int) -> list[list[Term]]:
        """The update's micro-batches, each a list of Terms (one forward/backward each)."""

    @abstractmethod
    def loss(self, policy, traj, advantages: torch.Tensor, term: Term,
             stats: StatsAccumulator) -> torch.Tensor:
        """The scaled loss of one term (backward is the caller's); records detached statistics."""

    def summarize(self, stats: StatsAccumulator) -> tuple[dict[str, float], dict[str, float]]:
        """(metrics averaged across ranks, metrics maxed across ranks) from the update's statistics."""
        return {}, {}

    def keep_samples(self, rows: torch.Tensor) -> None:
        """Called between advantages and plan_update when the update trains only ``rows`` (int64 [b']
        CPU, ascending) of the iteration's samples (--bestofn): the trajectory and advantages it then
        gets are those rows, in that order, so state kept per sample must be re-indexed. Nothing by default."""

    def after_update(self, policy, iteration: int) -> None:
        """Called once per iteration after its optimizer steps (e.g. an old-policy average)."""

    def sampling_plan(self, iteration: int, sampling_steps: int, shift: float):
        """This iteration's rollout schedule (a sampling.plan.SamplingPlan). By default DanceGRPO's
        SDE on every transition with none trained (the update reads the clean samples); GRPO's is
        the SDE / MixGRPO plan of the sampling flags, NFT's a deterministic solver."""
        from fastvideo.sampling.plan import full_sde_plan

        return full_sde_plan(sampling_steps, shift, 0, 0)

    def sampling_policy(self) -> contextlib.AbstractContextManager:
        """The weights the rollout samples with: the trainer enters this around the rollout. The
        current ones by default; NFT swaps its old policy in. (Its name until 2026-12 was
        rollout_weights, now the --rollout_weights flag's alone: an objective that still defines
        that method is honoured.)"""
        old_name = getattr(self, "rollout_weights", None)
        return old_name() if callable(old_name) else contextlib.nullcontext()

    def weight_sets(self) -> dict:
        """Named copies of the trainable weights this objective keeps (e.g. NFT's old policy),
        saved by the checkpointer like the EMA (gathered, any world size): each has
        full_state_dict(model, trainable_only) and load_full_state_dict(model, state, strict=...)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ConfigError(f"objective {self.name!r} has no state, but the checkpoint holds {sorted(state)}")


ObjectiveFactory = Callable[[ObjectiveContext], Objective]
