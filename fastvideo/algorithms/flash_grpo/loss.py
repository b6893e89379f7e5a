"""Flash-GRPO's temporal gradient rectification as pure functions (arXiv 2605.15980; the authors'
code, Shredded-Pork/Flash-GRPO at 4211013, scripts/train_wanx2_1_flash.py L983-996 and
flow_grpo/diffusers_patch/wan2_1_pipeline_with_logprob2.py sde_step_with_logprob's ``coe``).

Flash-GRPO trains one SDE transition k per sample, from sigma = sigmas[k] to sigmas[k + 1] (dt =
sigmas[k + 1] - sigma < 0), with the diffusion coefficient g = eta (sigma_min + (sigma_max -
sigma_min) sigma) (sampling.solvers.flash_sde_step). The gradient of the step's log-probability
with respect to the velocity scales with sqrt(-dt) / g + g sqrt(-dt) (1 - sigma) / (2 sigma); its
reciprocal c_k rectifies it:

    c_k = 1 / (sqrt(-dt) / g + g sqrt(-dt) (1 - sigma) / (2 sigma))
    L   = mean_i( max(-w_i A_i r_i, -w_i A_i clip(r_i, 1 - eps, 1 + eps)) ),   w_i = c_{k_i} / mean_pool c

(upstream: ``value_dict`` holds c on Wan2.1's 20-step grid, w = 1 / (mean of c over the ranks'
micro-batches); here the normaliser is the mean of c over the candidate pool the step is drawn
from, what upstream's cross-rank mean estimates, as UniRL's FlashGRPO ``rectification_indices``).
Since w > 0 the loss is GRPO's clipped loss with advantages w A (grpo.loss.clipped_policy_loss).
"""

from __future__ import annotations

import torch


def rectification_coefficients(sigmas: torch.Tensor, steps: torch.Tensor, eta: float) -> torch.Tensor:
    """c_k of transitions ``steps`` (int64 [b], each in 0 .. len(sigmas) - 2) of a schedule
    ``sigmas`` (float [n + 1], 1 .. 0); sigma_max = sigmas[1], sigma_min = sigmas[-1] as upstream.
    float32 [b]."""
    sig = sigmas.float()
    idx = torch.as_tensor(steps, dtype=torch.long, device=sig.device)
    s, s_next = sig[idx], sig[idx + 1]
    sigma_max, sigma_min = sig[1], sig[-1]
    g = eta * (sigma_min + (sigma_max - sigma_min) * s)
    sqrt_dt = torch.sqrt(s - s_next)
    return 1.0 / (sqrt_dt / g + g * sqrt_dt * (1.0 - s) / (2.0 * s))


def rectification_weights(sigmas: torch.Tensor, steps: torch.Tensor, pool: int, eta: float) -> torch.Tensor:
    """w = c(steps) / mean(c(0 .. pool - 1)): float32 [b], the pool's mean weight 1."""
    c = rectification_coefficients(sigmas, steps, eta)
    return c / rectification_coefficients(sigmas, torch.arange(pool), eta).mean()
