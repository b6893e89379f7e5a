"""Steps other than DanceGRPO's SDE: Flow-GRPO's SDE and DPM-Solver++ for flow matching. Pure.

Flow matching as a diffusion: x_sigma = alpha x0 + sigma eps with alpha = 1 - sigma, and the
velocity v = eps - x0, so the data prediction is x0_hat = x - sigma v and the half log-SNR is
lambda = log(alpha / sigma). All maths in float32.
"""

from __future__ import annotations

import math

import torch

from fastvideo.sampling.sde import _per_sample

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
DPM_SOLVER_TYPES = ("midpoint", "heun")


def flow_sde_step(
    latents: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    eta: float,
    sigma_max: float,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flow-GRPO's SDE step (MixGRPO's --flow_grpo_sampling) and its log-probability.

    The diffusion coefficient is g = eta sqrt(sigma / (1 - sigma)) (sigma = 1 uses sigma_max,
    the schedule's second sigma, to stay finite); with Delta = sigma_next - sigma < 0 and the
    score s = -(x + (1 - sigma) v) / sigma,
        mean = x + Delta (v - g^2 / 2 * s),   std = g sqrt(-Delta).
    latents, velocity, noise, prev_sample: [B, ...]; sigma, sigma_next floats or [B].
    Returns (sample float32 [B, ...], log_prob float32 [B], mean over non-batch elements).
    """
    x, v = latents.float(), velocity.float()
    batch, ndim = x.shape[0], x.ndim
    s = _per_sample(sigma, batch, ndim, x.device)
    s_next = _per_sample(sigma_next, batch, ndim, x.device)
    delta = s_next - s
    s_safe = torch.where(s == 1.0, torch.as_tensor(float(sigma_max), device=x.device), s)
    g = eta * torch.sqrt(s / (1.0 - s_safe))
    mean = x * (1.0 + g * g / (2.0 * s) * delta) + v * (1.0 + g * g * (1.0 - s) / (2.0 * s)) * delta
    std = g * torch.sqrt(-delta)
    if prev_sample is None:
        if noise is None:
            raise ValueError("flow_sde_step needs `noise` or `prev_sample`")
        sample = mean + std * noise.float()
    else:
        sample = prev_sample.float()
    log_prob = -((sample.detach() - mean) ** 2) / (2.0 * std * std) - torch.log(std) - _LOG_SQRT_2PI
    return sample, log_prob.mean(dim=tuple(range(1, ndim)))


def _alpha_lambda(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    alpha = 1.0 - sigma
    return alpha, torch.log(alpha) - torch.log(sigma)


def dpm_solver_pp_step(
    latents: torch.Tensor,
    x0: torch.Tensor,
    sigma: float | torch.Tensor,
    sigma_next: float | torch.Tensor,
    x0_prev: torch.Tensor | None = None,
    sigma_prev: float | torch.Tensor | None = None,
    solver_type: str = "midpoint",
) -> torch.Tensor:
    """One multistep DPM-Solver++ ODE step (Lu et al. 2022, data prediction) sigma -> sigma_next.

    latents, x0 (= x - sigma v at sigma): [B, ...]. With x0_prev, the data prediction of the
    previous step at sigma_prev, the step is second order (``solver_type`` midpoint or heun, as
    in diffusers); without it, first order (DDIM). sigma_next = 0 returns x0 exactly.
    Returns float32 [B, ...].
    """
    if solver_type not in DPM_SOLVER_TYPES:
        raise ValueError(f"dpm solver type {solver_type!r}; valid: {DPM_SOLVER_TYPES}")
    x, d0 = latents.float(), x0.float()
    s0 = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
    st = torch.as_tensor(sigma_next, dtype=torch.float32, device=x.device)
    alpha_t, alpha_0 = 1.0 - st, 1.0 - s0
    # exp(-h) = (sigma_t / alpha_t) (alpha_0 / sigma_0), written without logs so sigma_t = 0 is exact.
    exp_neg_h = st * alpha_0 / (alpha_t * s0)
    out = (st / s0) * x - (alpha_t * (exp_neg_h - 1.0)) * d0
    if x0_prev is None or float(st) == 0.0:
        return out
    sp = torch.as_tensor(sigma_prev, dtype=torch.float32, device=x.device)
    _, lam_t = _alpha_lambda(st)
    _, lam_0 = _alpha_lambda(s0)
    _, lam_p = _alpha_lambda(sp)
    h = lam_t - lam_0
    d1 = (d0 - x0_prev.float()) * (h / (lam_0 - lam_p))
    if solver_type == "midpoint":
        return out - 0.5 * (alpha_t * (exp_neg_h - 1.0)) * d1
    return out + (alpha_t * ((exp_neg_h - 1.0) / h + 1.0)) * d1
