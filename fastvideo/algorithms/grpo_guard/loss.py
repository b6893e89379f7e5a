"""GRPO-Guard's policy loss as pure functions (arXiv 2510.22319; verl-omni's GRPOGuardLoss in
verl_omni/trainer/diffusion/diffusion_algos.py at a1139ba, Flow-Factory's GRPOGuardTrainer in
src/flow_factory/trainers/grpo.py at a0b2bc5).

With s the trained SDE step's std (sqrt(-dt) * sigma_t: Flow-GRPO's g sqrt(sigma - sigma_next),
DanceGRPO's eta sqrt(sigma - sigma_next)), mu / mu_old the step's mean under the current / the
rollout policy and log p / log p_old the step's mean-over-elements log-probabilities:

    b     = mean((mu - mu_old)^2) / (2 s^2)                      the ratio's mean bias
    rho   = exp((log p - log p_old + b) * s)
    L     = mean_b( max(-A rho, -A clip(rho, 1 - eps, 1 + eps)) / (sqrt(-dt))^2 )

verl-omni trains one step per batch and uses that step's s and dt for the whole batch; here every
sample may train its own step, so s and dt are per sample (the same numbers on a shared step).
"""

from __future__ import annotations

import torch

from fastvideo.grpo.loss import LossStats


def old_step_mean(next_latents: torch.Tensor, std: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """The rollout policy's step mean, mu_old = x_{k+1} - s eps (the rollout drew x_{k+1} = mu_old
    + s eps, and s does not depend on the weights): float32 [b, ...]. next_latents, eps [b, ...];
    std broadcastable ([b, 1, ...] or 0-d)."""
    return next_latents.float() - std.float() * eps.float()


def per_sample(x: torch.Tensor, b: int) -> torch.Tensor:
    """A 0-d or [b, 1, ...] tensor as [b] (its dtype)."""
    return x.reshape(-1).expand(b) if x.numel() == 1 else x.reshape(b)


def guard_policy_loss(log_prob_new: torch.Tensor, log_prob_old: torch.Tensor, mean: torch.Tensor,
                      old_mean: torch.Tensor, std: torch.Tensor, sqrt_dt: torch.Tensor, advantages: torch.Tensor,
                      clip_range: float) -> tuple[torch.Tensor, LossStats, torch.Tensor]:
    """(loss scalar, stats, mean bias b [b] detached). log_prob_new (with gradient), log_prob_old,
    advantages, sqrt_dt: [b]; mean (with gradient), old_mean: [b, ...]; std: [b, 1, ...] or 0-d
    (the step's std, s); float32 (float64 in the tests). The loss is the mean over the b samples (the caller scales it as GRPO's)."""
    b = log_prob_new.shape[0]
    scale = per_sample(std, b)
    diff = mean - old_mean
    bias = diff.square().mean(dim=tuple(range(1, diff.ndim))) / (2.0 * scale * scale)
    ratio = torch.exp((log_prob_new - log_prob_old + bias) * scale)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = (torch.maximum(unclipped, clipped) / per_sample(sqrt_dt, b).square()).mean()
    with torch.no_grad():
        stats = LossStats(ratio_mean=ratio.mean(), ratio_abs_dev_max=(ratio - 1).abs().max(),
                          clip_fraction=((ratio - 1).abs() > clip_range).float().mean())
    return loss, stats, bias.detach()
