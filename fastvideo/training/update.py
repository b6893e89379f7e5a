"""The shared update loop: micro-batches of an objective's terms, gradient accumulation, clipping,
one optimizer step per accumulation window, non-finite steps skipped on every rank alike.

Non-finite values are survived, then stopped: a step with a non-finite loss or gradient is
skipped, a sample with a non-finite reward is dropped (rewards/combine.py), and the run stops
only after ``--max_nonfinite_steps`` consecutive *iterations* had such a problem, naming the
cause (:meth:`Updater.end_iteration`). Counting iterations, not optimizer steps, keeps one bad
iteration from being fatal where an iteration takes several steps.

It knows no algorithm: the objective plans the work (Terms) and computes each term's loss.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from fastvideo.algorithms.base import Objective, StatsAccumulator, stack_timesteps
from fastvideo.distributed.fsdp import grad_sync_paused
from fastvideo.errors import UserError
from fastvideo.index_copies import index_copies
from fastvideo.utils import main_print


class NonFiniteError(UserError, RuntimeError):
    """Too many iterations in a row had a non-finite reward, loss or gradient. A user error: its
    message names the setting to change (one line, exit 2; every rank meets it alike)."""


@dataclass
class UpdateStats:
    loss: float
    grad_norm: float  # mean over the iteration's optimizer steps (NaN if all were skipped)
    optimizer_steps: int
    skipped_steps: int
    forward_passes: int
    means: dict[str, float] = field(default_factory=dict)  # the objective's metrics, averaged across ranks
    maxes: dict[str, float] = field(default_factory=dict)  # ... maxed across ranks
    nonfinite: list[str] = field(default_factory=list)  # why steps were skipped ("loss", "gradient"), as on every rank


@dataclass
class TrainerState:
    """The loop's own counters (a stateful part of every checkpoint)."""

    iteration: int = 0
    consecutive_nonfinite: int = 0

    def state_dict(self) -> dict:
        return {"iteration": self.iteration, "consecutive_nonfinite": self.consecutive_nonfinite}

    def load_state_dict(self, state: dict) -> None:
        self.iteration = int(state["iteration"])
        self.consecutive_nonfinite = int(state.get("consecutive_nonfinite", 0))


class Updater:
    """timesteps_per_forward: the objective's terms of a micro-batch stacked k at a time into one
    forward + backward (--update_timesteps_per_forward, resolved: training/lean.py)."""

    def __init__(self, model, optimizer, lr_scheduler, optim, accumulation: int, dims, device: torch.device,
                 state: TrainerState, timesteps_per_forward: int = 1, grad_sync: str = "per_microbatch"):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.optim = optim  # OptimSettings: max_grad_norm, max_nonfinite_steps
        self.accumulation = accumulation
        self.dims = dims
        self.device = device
        self.state = state
        self.timesteps_per_forward = timesteps_per_forward
        self.grad_sync = grad_sync  # per_step: no_sync over the accumulation window (reduce once per step)

    def run(self, objective: Objective, policy, traj, advantages: torch.Tensor, iteration: int) -> UpdateStats:
        """Every term's loss backward, an optimizer step every ``accumulation`` micro-batches (and
        after the last, shorter window: upstream drops its gradients; docs/upstream.md)."""
        micro_batches = stack_timesteps(objective.plan_update(traj, iteration), self.timesteps_per_forward)
        adv = advantages.to(self.device)
        stats = StatsAccumulator(self.device)
        self.model.train()
        loss_sum = torch.zeros((), device=self.device)
        window_loss = torch.zeros((), device=self.device)  # this accumulation window's loss
        grad_norms, opt_steps, skipped, causes = [], 0, 0, []
        # every term's rows and steps on the device in one copy (index_copies.on reads them there)
        indices = [x for terms in micro_batches for t in terms for x in (t.rows, t.steps)]
        with index_copies(indices, self.device):
            for m, terms in enumerate(micro_batches):
                window_end = (m + 1) % self.accumulation == 0 or m == len(micro_batches) - 1
                for i, term in enumerate(terms):
                    with self._gradient_sync(window_end and i == len(terms) - 1):
                        loss = objective.loss(policy, traj, adv, term, stats)
                        loss.backward()
                    loss_sum += loss.detach()
                    window_loss += loss.detach()
                if window_end:
                    norm, bad = self.optimizer_step(window_loss)
                    window_loss = torch.zeros((), device=self.device)
                    if not bad:
                        grad_norms.append(norm)
                    causes += [c for c in bad if c not in causes]
                    opt_steps += int(not bad)
                    skipped += int(bool(bad))
        self.model.eval()
        means, maxes = objective.summarize(stats)
        # Read back once per iteration, after the loop (the norms stay on the device until here).
        norms = torch.stack(grad_norms).tolist() if grad_norms else []
        return UpdateStats(loss=float(loss_sum),
                           grad_norm=sum(norms) / len(norms) if norms else float("nan"),
                           optimizer_steps=opt_steps, skipped_steps=skipped, forward_passes=stats.forwards,
                           means=means, maxes=maxes, nonfinite=causes)

    def _gradient_sync(self, last_of_window: bool):
        """--grad_sync per_step: every backward of an accumulation window but its last under the
        model's gradient sync paused (FSDP1 / DDP no_sync, FSDP2 set_requires_gradient_sync: the
        gradients accumulate unsharded, reduced once, by the last)."""
        if self.grad_sync != "per_step" or last_of_window:
            return contextlib.nullcontext()
        return grad_sync_paused(self.model)

    def optimizer_step(self, window_loss: torch.Tensor) -> tuple[torch.Tensor | float, list[str]]:
        """Clip, check finiteness (the same decision on every rank), step or skip. Returns the
        gradient norm before clipping (a 0-d tensor, not read back; NaN float when skipped) and
        what was non-finite ([] when the step was taken)."""
        from fastvideo.distributed.fsdp import clip_grad_norm

        norm = clip_grad_norm(self.model, self.optim.max_grad_norm)
        bad = torch.stack([(~torch.isfinite(window_loss)).float(), (~torch.isfinite(norm)).float()])
        bad = self.dims.all_reduce_max(bad.to(self.device)).tolist()
        causes = [name for name, flag in zip(("loss", "gradient"), bad) if flag > 0]
        if causes:
            self.optimizer.zero_grad(set_to_none=True)
            main_print(f"[warning] iteration {self.state.iteration + 1}: non-finite {' and '.join(causes)} "
                       f"(grad norm {float(norm)}); optimizer step skipped")
            return float("nan"), causes
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach().float(), []

    def end_iteration(self, iteration: int, problems: list[str]) -> None:
        """Count an iteration with problems (non-finite rewards, loss or gradient; the same list on
        every rank) and stop after --max_nonfinite_steps of them in a row; a clean one resets."""
        s = self.state
        if not problems:
            s.consecutive_nonfinite = 0
            return
        s.consecutive_nonfinite += 1
        limit = self.optim.max_nonfinite_steps
        main_print(f"[warning] iteration {iteration}: {'; '.join(problems)} "
                   f"({s.consecutive_nonfinite} iteration(s) in a row; the run stops at {limit})")
        if s.consecutive_nonfinite >= limit:
            raise NonFiniteError(f"{s.consecutive_nonfinite} iterations in a row had non-finite values "
                                 f"(iteration {iteration}: {'; '.join(problems)}); stopping. {_advice(problems)}")


def iteration_problems(record: dict, stats: UpdateStats) -> list[str]:
    """What was non-finite in an iteration, from its (rank-reduced) metrics and update stats."""
    problems = []
    dropped = record.get("rewards/nonfinite_dropped", 0)
    if dropped:
        names = sorted(k.split("/", 2)[2] for k in record if k.startswith("rewards/nonfinite/"))
        problems.append(f"reward {', '.join(map(repr, names))} scored {dropped} sample(s) non-finite "
                        "(dropped from their groups)")
    if stats.skipped_steps:
        problems.append(f"non-finite {' and '.join(stats.nonfinite)} in {stats.skipped_steps} of "
                        f"{stats.skipped_steps + stats.optimizer_steps} optimizer step(s) (skipped)")
    return problems


def _advice(problems: list[str]) -> str:
    """The fix for the causes named (a reward's own scores, or the optimisation)."""
    tips = []
    if any(p.startswith("reward") for p in problems):
        tips.append("The reward returns NaN or inf for these images: fix it or drop it from --rewards "
                    "(its warnings above name the samples).")
    if any(p.startswith("non-finite") for p in problems):
        tips.append("Lower --learning_rate or --max_grad_norm, use --mixed_precision no to rule out bf16 "
                    "overflow, or resume from an earlier checkpoint.")
    return " ".join(tips)
