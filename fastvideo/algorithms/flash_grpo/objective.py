"""Flash-GRPO (arXiv 2605.15980), --algorithm flash_grpo, after the authors' code
(Shredded-Pork/Flash-GRPO at 4211013, scripts/train_wanx2_1_flash.py).

Rollout: the Euler ODE on every transition but one, transition k, a Flash-GRPO SDE step
(sampling.solvers.flash_sde_step) whose log-probability is kept. Iso-temporal grouping: k is drawn
once per iteration, uniformly from the first C = int(N x --flash_candidate_fraction) transitions
(RandomSource.window_start: the same on every rank), so every group (indeed the iteration's whole
batch) trains at the one timestep t = sigmas[k]; upstream draws k per prompt, which a plan shared by
the rollout's batch cannot. Advantages: GRPO's. Update: GRPO's clipped ratio of that one
transition, its advantages times the temporal gradient rectification w_k = c_k / mean_pool c
(flash_grpo.loss), plus GRPO's --kl_coef / --kl_coeff terms (not rectified, as upstream's beta).
"""

from __future__ import annotations

import torch

from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator, Term
from fastvideo.algorithms.flash_grpo.loss import rectification_weights
from fastvideo.algorithms.flash_grpo.settings import FlashGRPOSettings
from fastvideo.algorithms.grpo import GRPOObjective
from fastvideo.grpo.loss import clipped_policy_loss


def single_sde_plan(sampling_steps: int, shift: float, step: int):
    """Euler ODE everywhere but transition ``step``, a Flash SDE step and the one trained."""
    from fastvideo.sampling import sde
    from fastvideo.sampling.plan import ODE, SDE, SamplingPlan

    kinds = tuple(SDE if k == step else ODE for k in range(sampling_steps))
    return SamplingPlan(sigmas=sde.sigma_schedule(sampling_steps, shift), kinds=kinds, trainable=(step,),
                        num_trained=1, sde_kind="flash", window_start=step)


class FlashGRPOObjective(GRPOObjective):
    name = "flash_grpo"
    settings = FlashGRPOSettings

    def __init__(self, context: ObjectiveContext):
        super().__init__(context)
        self.flash = context.settings
        self.step = -1  # this iteration's SDE transition (logged)

    def sampling_plan(self, iteration: int, sampling_steps: int, shift: float):
        step = self.randomness.window_start(iteration, self.flash.candidates(sampling_steps))
        return single_sde_plan(sampling_steps, shift, step)

    def plan_update(self, traj, iteration: int) -> list[list[Term]]:
        self.step = traj.plan.trainable[0]
        return super().plan_update(traj, iteration)

    def policy_term(self, traj, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, term: Term):
        """GRPO's clipped ratio with advantages w_k A (flash_grpo.loss)."""
        plan = traj.plan
        w = rectification_weights(plan.sigmas, term.steps, self.flash.candidates(plan.num_steps), self.eta)
        loss, s = clipped_policy_loss(logp, old, adv * w.to(adv.device), self.g.clip_range)
        return loss, s, {"flash_tgr": w.mean().to(logp.device)}

    def summarize(self, stats: StatsAccumulator) -> tuple[dict[str, float], dict[str, float]]:
        means, maxes = super().summarize(stats)
        means["flash_tgr"] = stats.mean("flash_tgr")
        means["flash_step"] = float(self.step)
        return means, maxes
