"""The shared update loop: micro-batches of an objective's terms, gradient accumulation, clipping,
one optimizer step per accumulation window, non-finite steps skipped on every rank alike.

It knows no algorithm: the objective plans the work (Terms) and computes each term's loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fastvideo.algorithms.base import Objective, StatsAccumulator
from fastvideo.utils import main_print


class NonFiniteError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


@dataclass
class UpdateStats:
    loss: float
    grad_norm: float  # mean over the iteration's optimizer steps (NaN if all were skipped)
    optimizer_steps: int
    skipped_steps: int
    forward_passes: int
    means: dict[str, float] = field(default_factory=dict)  # the objective's metrics, averaged across ranks
    maxes: dict[str, float] = field(default_factory=dict)  # ... maxed across ranks


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
    def __init__(self, model, optimizer, lr_scheduler, optim, accumulation: int, dims, device: torch.device,
                 state: TrainerState):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.optim = optim  # OptimSettings: max_grad_norm, max_nonfinite_steps
        self.accumulation = accumulation
        self.dims = dims
        self.device = device
        self.state = state

    def run(self, objective: Objective, policy, traj, advantages: torch.Tensor, iteration: int) -> UpdateStats:
        """Every term's loss backward, an optimizer step every ``accumulation`` micro-batches (and
        after the last, shorter window: upstream drops its gradients; docs/upstream.md)."""
        micro_batches = objective.plan_update(traj, iteration)
        adv = advantages.to(self.device)
        stats = StatsAccumulator(self.device)
        self.model.train()
        loss_sum = torch.zeros((), device=self.device)
        window_loss = torch.zeros((), device=self.device)  # this accumulation window's loss
        grad_norms, opt_steps, skipped = [], 0, 0
        for m, terms in enumerate(micro_batches):
            for term in terms:
                loss = objective.loss(policy, traj, adv, term, stats)
                loss.backward()
                loss_sum += loss.detach()
                window_loss += loss.detach()
            if (m + 1) % self.accumulation == 0 or m == len(micro_batches) - 1:
                norm, ok = self.optimizer_step(window_loss)
                window_loss = torch.zeros((), device=self.device)
                if ok:
                    grad_norms.append(norm)
                opt_steps += int(ok)
                skipped += int(not ok)
        self.model.eval()
        means, maxes = objective.summarize(stats)
        # Read back once per iteration, after the loop (the norms stay on the device until here).
        norms = torch.stack(grad_norms).tolist() if grad_norms else []
        return UpdateStats(loss=float(loss_sum),
                           grad_norm=sum(norms) / len(norms) if norms else float("nan"),
                           optimizer_steps=opt_steps, skipped_steps=skipped, forward_passes=stats.terms,
                           means=means, maxes=maxes)

    def optimizer_step(self, window_loss: torch.Tensor) -> tuple[torch.Tensor | float, bool]:
        """Clip, check finiteness (the same decision on every rank), step or skip. Returns the
        gradient norm before clipping (a 0-d tensor, not read back: NaN float when skipped)."""
        from fastvideo.distributed.fsdp import clip_grad_norm

        norm = clip_grad_norm(self.model, self.optim.max_grad_norm)
        bad = (~torch.isfinite(norm)).float() + (~torch.isfinite(window_loss)).float()
        bad = self.dims.all_reduce_max(bad.reshape(1).to(self.device))
        if bad.item() > 0:
            self.optimizer.zero_grad(set_to_none=True)
            self._count_nonfinite(norm)
            return float("nan"), False
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.consecutive_nonfinite = 0
        return norm.detach().float(), True

    def _count_nonfinite(self, norm: torch.Tensor) -> None:
        s = self.state
        s.consecutive_nonfinite += 1
        main_print(f"[warning] iteration {s.iteration + 1}: non-finite loss or gradient (grad norm {float(norm)}); "
                   f"optimizer step skipped ({s.consecutive_nonfinite} in a row)")
        if s.consecutive_nonfinite >= self.optim.max_nonfinite_steps:
            raise NonFiniteError(
                f"{s.consecutive_nonfinite} optimizer steps in a row had a non-finite loss or gradient; "
                "stopping. Lower --learning_rate or --max_grad_norm, use --mixed_precision no to rule out "
                "bf16 overflow, or resume from an earlier checkpoint."
            )
