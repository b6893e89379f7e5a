"""Advantage Weighted Matching (arXiv 2509.25050), --algorithm awm, after Flow-Factory's AWMTrainer
(X-GenGroup/Flow-Factory at a0b2bc5, src/flow_factory/trainers/awm.py).

Rollout: the Euler ODE (no log-probabilities, no stored steps: only each sample's x0).
Advantages: GRPO's. Update: NFT's forward process (algorithms/nft.py: T = int(N x
--timestep_fraction) of the N sampling timesteps per sample, x_t = (1 - t) x0 + t eps with eps
from the run's randomness by (iteration, sample, step)); the loss of a term is GRPO's clipped
ratio of awm.loss.weighted_log_prob, plus --kl_coef * mean((v - v_ref)^2), plus with --awm_ema_kl_beta
Flow-Factory's EMA-KL, beta * mean((v - v_ema)^2) against an EMA of the trainable weights (a
training.ema.WeightCopy moved after every --awm_ema_interval iterations with Flow-Factory's linear decay
warm-up, awm.settings; trainers/awm.py L524-537, ema/ema.py EMAModuleWrapper.step).

The old log-probability: Flow-Factory computes it, without gradient, under the weights the
micro-batch then trains with (its sampling context; off_policy, sampling with the EMA, is not
built here); the update takes no optimizer step inside a micro-batch, so it is the current
log-probability's value, detached (no second forward): the ratio is 1 and the gradient -A grad log p.
"""

from __future__ import annotations

import torch

from fastvideo.algorithms.awm.loss import weighted_log_prob
from fastvideo.algorithms.awm.settings import AWMSettings
from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator, Term
from fastvideo.algorithms.grpo import GRPOObjective
from fastvideo.algorithms.nft import NFTObjective, deterministic_plan, forward_noised, scaled_forward_term
from fastvideo.algorithms.nft_loss import velocity_kl
from fastvideo.errors import ConfigError
from fastvideo.grpo.loss import clipped_policy_loss
from fastvideo.index_copies import on

EMA_WEIGHTS = "awm_ema"  # the checkpoint's awm_ema.safetensors (--awm_ema_kl_beta)


class AWMObjective(GRPOObjective):
    name = "awm"
    settings = AWMSettings
    needs_log_probs = False
    needs_trajectory = False  # the update reads Trajectory.x0 and cond only

    def __init__(self, context: ObjectiveContext):
        super().__init__(context)
        self.awm = context.settings
        self.iteration = 0
        self.ema = None  # with --awm_ema_kl_beta: the EMA of the trainable weights (training.ema.WeightCopy)
        if self.awm.ema_kl_beta > 0:
            if context.copy_weights is None:
                raise ConfigError("--awm_ema_kl_beta keeps an EMA of the trainable weights: the objective's context "
                                  "needs copy_weights")
            self.ema = context.copy_weights()

    def weight_sets(self) -> dict:
        return {} if self.ema is None else {EMA_WEIGHTS: self.ema}

    def after_update(self, policy, iteration: int) -> None:
        """Flow-Factory's adapter.ema_step(step=epoch) after each epoch's optimisation."""
        if self.ema is not None and self.awm.ema_updates_after(iteration):
            self.ema.step(self.awm.ema_decay_at(iteration))

    def sampling_plan(self, iteration: int, sampling_steps: int, shift: float):
        return deterministic_plan("ode", sampling_steps, shift)

    plan_update = NFTObjective.plan_update  # NFT's forward-process terms (sets self.iteration)

    def loss(self, policy, traj, advantages: torch.Tensor, term: Term, stats: StatsAccumulator) -> torch.Tensor:
        g, rows, steps = self.g, term.rows, term.steps
        x0, t, eps, x_t = forward_noised(self.randomness, self.iteration, traj, rows, steps)
        v_ref = policy.reference_velocity(traj, rows, x_t, t) if g.kl_coef > 0 else None
        v_ema = None
        if self.ema is not None:
            with torch.no_grad(), self.ema.swapped_in(policy.model):
                v_ema = policy.velocity(traj, rows, x_t, t)
        v = policy.velocity(traj, rows, x_t, t).float()
        logp = weighted_log_prob(v, eps - x0, t, self.awm.weighting, self.awm.ghuber_power)
        loss, s = clipped_policy_loss(logp, logp.detach(), advantages[on(rows, advantages.device)], g.clip_range)
        sums = {"awm_log_prob": logp.detach().mean(), "ratio_mean": s.ratio_mean, "clip_fraction": s.clip_fraction}
        if v_ema is not None:  # Flow-Factory's ema_kl_beta * mean((v - v_ema)^2), beside the kl_beta term
            ema_kl = velocity_kl(v, v_ema, self.kept_rows(rows))
            loss = loss + self.awm.ema_kl_beta * ema_kl
            sums["ema_kl"] = ema_kl.detach()
        # dropped samples (non-finite rewards) have advantage 0 and, masked, no KL term
        return scaled_forward_term(self, traj, term, stats, loss, sums, v, v_ref, self.kept_rows(rows))

    def summarize(self, stats: StatsAccumulator) -> tuple[dict[str, float], dict[str, float]]:
        keys = ["awm_log_prob", "ratio_mean", "clip_fraction"] + (["kl"] if self.g.kl_coef > 0 else [])
        keys += ["ema_kl"] if self.ema is not None else []
        return {k: stats.mean(k) for k in keys}, {}
