"""GRPO-Guard inside GRPO's update (``--policy_loss grpo_guard``, fastvideo.algorithms.grpo's
POLICY_LOSSES): the current and the rollout policy's step means of a term's stored transitions,
then grpo_guard.loss.guard_policy_loss.

The rollout stores every step's latents and log-probabilities but not its means: the old mean is
x_{k+1} - s eps with eps the step noise the rollout drew, which the run's randomness source gives
again by (iteration, sample, step), so nothing more is stored (verl-omni and Flow-Factory keep
the means, a latent per trained step)."""

from __future__ import annotations

import torch

from fastvideo.algorithms.grpo_guard.loss import guard_policy_loss, old_step_mean
from fastvideo.index_copies import on
from fastvideo.sampling.rollout import transition_gaussian

GUARD_TERMS = ("guard_bias",)  # mean over the update's terms of the ratio's mean bias b


def rollout_step_noise(randomness, iteration: int, traj, rows: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """float32 [b, L, C]: the noise the rollout drew for transition steps[i] of sample rows[i]."""
    ids = traj.sample_ids[rows.cpu()]
    return torch.cat([randomness.step_noise(iteration, ids[i:i + 1], int(k), traj.layout.tokens)
                      for i, k in enumerate(steps.cpu().tolist())])


def guard_term(objective, traj, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, term):
    """(loss, LossStats, {"guard_bias": mean b}) of a GRPO term: logp, old, adv [b] (the current
    policy's, the rollout's log-probs, the advantages of term.rows at term.steps); the step's state
    and velocity are objective.last_transition (training.policy.TransitionLogProb)."""
    plan, rows, steps, t = traj.plan, term.rows, term.steps, objective.last_transition
    mean, std = transition_gaussian(plan.sde_kind, t.x, t.velocity, t.sigma, t.sigma_next, objective.eta,
                                    plan.host_sigmas[1])
    nxt = traj.latents[on(rows, traj.latents.device), on(steps, traj.latents.device) + 1]
    eps = rollout_step_noise(objective.randomness, objective.iteration, traj, rows, steps).to(mean.device)
    with torch.no_grad():
        old_mean = old_step_mean(nxt, std, eps)
    sqrt_dt = torch.sqrt(t.sigma.float() - t.sigma_next.float())
    loss, s, bias = guard_policy_loss(logp, old, mean, old_mean, std, sqrt_dt, adv, objective.g.clip_range)
    return loss, s, {"guard_bias": bias.mean()}
