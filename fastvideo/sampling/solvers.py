"""Steps other than DanceGRPO's SDE: Flow-GRPO's SDE and DPM-Solver(++) for flow matching. Pure.

Flow matching as a diffusion: x_sigma = alpha x0 + sigma eps with alpha = 1 - sigma, and the
velocity v = eps - x0, so the data prediction is x0_hat = x - sigma v and the half log-SNR is
lambda = log(alpha / sigma). All maths in float32.
"""

from __future__ import annotations

import torch

from fastvideo.sampling import sde
from fastvideo.sampling.sde import _per_sample

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
    mean, std = flow_step_gaussian(latents, velocity, sigma, sigma_next, eta, sigma_max)
    return sde.gaussian_transition(mean, std, noise, prev_sample, "flow_sde_step")


def flow_step_gaussian(latents, velocity, sigma, sigma_next, eta: float, sigma_max: float):
    """The Gaussian of Flow-GRPO's SDE step (flow_sde_step's formulas): (mean float32 [B, ...],
    std float32 broadcastable to it). The KL term compares two such means (grpo.kl)."""
    x, v, s, s_next = _step_inputs(latents, velocity, sigma, sigma_next)
    # A Python scalar operand: no tensor made on the host and copied per step (sigma_max is a float)
    s_safe = torch.where(s == 1.0, float(sigma_max), s)
    return _flow_form_gaussian(x, v, s, s_next - s, eta * torch.sqrt(s / (1.0 - s_safe)))


def flash_sde_step(latents, velocity, sigma, sigma_next, eta: float, sigma_max: float, noise=None, prev_sample=None):
    """Flash-GRPO's SDE step (Shredded-Pork/Flash-GRPO at 4211013,
    flow_grpo/diffusers_patch/wan2_1_pipeline_with_logprob2.py sde_step_with_logprob): Flow-GRPO's
    mean with the diffusion coefficient g = eta (sigma_min + (sigma_max - sigma_min) sigma), sigma_max
    the schedule's second sigma, sigma_min its last (0 on every schedule here); upstream's eta is 1.
    Same shapes and returns as flow_sde_step."""
    mean, std = flash_step_gaussian(latents, velocity, sigma, sigma_next, eta, sigma_max)
    return sde.gaussian_transition(mean, std, noise, prev_sample, "flash_sde_step")


def flash_step_gaussian(latents, velocity, sigma, sigma_next, eta: float, sigma_max: float):
    """The Gaussian of flash_sde_step: (mean float32 [B, ...], std broadcastable)."""
    x, v, s, s_next = _step_inputs(latents, velocity, sigma, sigma_next)
    return _flow_form_gaussian(x, v, s, s_next - s, eta * (float(sigma_max) * s))


def _step_inputs(latents, velocity, sigma, sigma_next):
    x, v = latents.float(), velocity.float()
    batch, ndim = x.shape[0], x.ndim
    return x, v, _per_sample(sigma, batch, ndim, x.device), _per_sample(sigma_next, batch, ndim, x.device)


def _flow_form_gaussian(x, v, s, delta, g):
    """Flow-GRPO's step mean for a diffusion coefficient g (score s = -(x + (1 - sigma) v) / sigma):
    mean = x + Delta (v - g^2 / 2 * score), std = g sqrt(-Delta)."""
    mean = x * (1.0 + g * g / (2.0 * s) * delta) + v * (1.0 + g * g * (1.0 - s) / (2.0 * s)) * delta
    return mean, g * torch.sqrt(-delta)


DPM_ALGORITHMS = ("dpmsolver++", "dpmsolver")  # data prediction (x0) / noise prediction (eps)
DPM_SDE_KINDS = ("sde-dpmsolver++",)  # the first-order SDE variant of DPM-Solver++ (diffusers' name)


def dpm_model_output(latents: torch.Tensor, velocity: torch.Tensor, sigma, algorithm: str) -> torch.Tensor:
    """The quantity DPM-Solver integrates, from FLUX's velocity v = eps - x0 at sigma:
    x0 = x - sigma v (dpmsolver++) or eps = x + (1 - sigma) v (dpmsolver). float32 [B, ...];
    sigma a float, a 0-d tensor or [B]."""
    if algorithm == "dpmsolver++":
        return sde.x0_prediction(latents, velocity, sigma)
    if algorithm == "dpmsolver":
        x, v = latents.float(), velocity.float()
        return x + (1.0 - _per_sample(sigma, x.shape[0], x.ndim, x.device)) * v
    raise ValueError(f"dpm algorithm {algorithm!r}; valid: {DPM_ALGORITHMS}")


def _host_float(value) -> float:
    """A Python float of a sigma given as a float (free) or a tensor (read back: a host sync)."""
    return value if isinstance(value, float) else float(value)


def _lam(sigma: torch.Tensor) -> torch.Tensor:
    """Half log-SNR of flow matching, log((1 - sigma) / sigma)."""
    return torch.log(1.0 - sigma) - torch.log(sigma)


def dpm_solver_step(
    latents: torch.Tensor,
    outputs: list[torch.Tensor],
    sigmas: list,
    sigma_next,
    algorithm: str = "dpmsolver++",
    solver_type: str = "midpoint",
) -> torch.Tensor:
    """One multistep DPM-Solver ODE step (Lu et al. 2022: DPM-Solver++ for data prediction,
    DPM-Solver for noise prediction) from sigmas[-1] to sigma_next, of order len(outputs) (1-3).

    latents [B, ...]; outputs: the model outputs (``dpm_model_output``) at sigmas, oldest first,
    newest (at the current sigma) last; sigmas: floats or 0-d tensors. Second order uses
    ``solver_type`` midpoint or heun, as diffusers' DPMSolverMultistepScheduler; third order has
    one form. sigma_next = 0 returns the data prediction exactly (first order, as diffusers'
    final step). Returns float32 [B, ...].
    """
    if solver_type not in DPM_SOLVER_TYPES:
        raise ValueError(f"dpm solver type {solver_type!r}; valid: {DPM_SOLVER_TYPES}")
    if algorithm not in DPM_ALGORITHMS:
        raise ValueError(f"dpm algorithm {algorithm!r}; valid: {DPM_ALGORITHMS}")
    if not 1 <= len(outputs) <= 3 or len(sigmas) != len(outputs):
        raise ValueError(f"dpm_solver_step needs 1-3 outputs with one sigma each, got {len(outputs)} and {len(sigmas)}")
    x = latents.float()
    f32 = dict(dtype=torch.float32, device=x.device)
    st = torch.as_tensor(sigma_next, **f32)
    s0 = torch.as_tensor(sigmas[-1], **f32)
    m0 = outputs[-1].float()
    alpha_t, alpha_0 = 1.0 - st, 1.0 - s0
    # Branch on the host values (the rollout passes floats): reading s0 / st back would sync per step
    if algorithm == "dpmsolver" and _host_float(sigmas[-1]) >= 1.0:
        raise ValueError("the noise-prediction DPM-Solver cannot step from sigma 1 (alpha = 0); use dpmsolver++")
    if _host_float(sigma_next) == 0.0:  # the step to the data: lambda_t is infinite, so take the limit exactly
        return m0 if algorithm == "dpmsolver++" else (x - s0 * m0) / alpha_0
    h = _lam(st) - _lam(s0)
    # exp(-h) = (sigma_t / alpha_t) (alpha_0 / sigma_0), formed without logs (as diffusers' exp(-h))
    exp_neg_h = st * alpha_0 / (alpha_t * s0)
    if algorithm == "dpmsolver++":
        phi1 = exp_neg_h - 1.0                       # e^{-h} - 1
        out = (st / s0) * x - alpha_t * phi1 * m0
    else:
        phi1 = 1.0 / exp_neg_h - 1.0                 # e^{h} - 1
        out = (alpha_t / alpha_0) * x - st * phi1 * m0
    order = len(outputs)
    if order == 1:
        return out
    s1 = torch.as_tensor(sigmas[-2], **f32)
    r0 = (_lam(s0) - _lam(s1)) / h
    d1_0 = (m0 - outputs[-2].float()) / r0
    if order == 2:
        if algorithm == "dpmsolver++":
            if solver_type == "midpoint":
                return out - 0.5 * alpha_t * phi1 * d1_0
            return out + alpha_t * (phi1 / h + 1.0) * d1_0
        if solver_type == "midpoint":
            return out - 0.5 * st * phi1 * d1_0
        return out - st * (phi1 / h - 1.0) * d1_0
    s2 = torch.as_tensor(sigmas[-3], **f32)
    r1 = (_lam(s1) - _lam(s2)) / h
    d1_1 = (outputs[-2].float() - outputs[-3].float()) / r1
    d1 = d1_0 + (r0 / (r0 + r1)) * (d1_0 - d1_1)
    d2 = (d1_0 - d1_1) / (r0 + r1)
    if algorithm == "dpmsolver++":
        return out + alpha_t * (phi1 / h + 1.0) * d1 - alpha_t * ((phi1 + h) / (h * h) - 0.5) * d2
    return out - st * (phi1 / h - 1.0) * d1 - st * ((phi1 - h) / (h * h) - 0.5) * d2


def dpm_step_order(order: int, k: int, num_steps: int, sigma_next: float, outputs: int) -> int:
    """Order of DPM transition k of num_steps with ``outputs`` model outputs known (the current one
    included): ``order``, lowered while the history is short, to 1 for the step to sigma 0 and to
    2 for the one before the last when there are fewer than 15 transitions (diffusers' and
    MixGRPO's lower_order_final rules for few-step sampling)."""
    if k == num_steps - 1 or sigma_next == 0.0:
        return 1
    order = min(order, outputs)
    if k == num_steps - 2 and num_steps < 15:
        return min(order, 2)
    return order


def dpm_multistep(latents: torch.Tensor, history: list, sigma_next: float, order: int, k: int, num_steps: int,
                  algorithm: str = "dpmsolver++", solver_type: str = "midpoint") -> torch.Tensor:
    """DPM transition k of num_steps: ``dpm_solver_step`` of the order ``dpm_step_order`` allows.
    history: (model output, sigma) of the transitions so far, oldest first, the current one last."""
    use = dpm_step_order(order, k, num_steps, sigma_next, len(history))
    recent = history[-use:]
    return dpm_solver_step(latents, [o for o, _ in recent], [s for _, s in recent], sigma_next, algorithm, solver_type)


def dpm_sde_step(
    latents: torch.Tensor,
    velocity: torch.Tensor,
    sigma,
    sigma_next,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """First-order SDE-DPM-Solver++ step (diffusers' sde-dpmsolver++) and its log-probability:
    MixGRPO's SDE step under --dpm_apply_strategy all. With h = lambda_t - lambda_s and x0 = x - sigma v,
        mean = (sigma_t / sigma_s) e^{-h} x + alpha_t (1 - e^{-2h}) x0,   std = sigma_t sqrt(1 - e^{-2h}).
    The noise level is fixed by the solver (no eta). sigma_next must be > 0: the step to the data
    has std 0, so plans make that transition deterministic (SamplingPlan checks it). (The noise-
    prediction sde-dpmsolver is not offered: from FLUX's first sigma, 1, its variance is infinite.)
    latents, velocity, noise, prev_sample [B, ...]; sigma, sigma_next floats or [B].
    Returns (sample float32 [B, ...], log_prob float32 [B], mean over non-batch elements).
    """
    x = latents.float()
    batch, ndim = x.shape[0], x.ndim
    s = _per_sample(sigma, batch, ndim, x.device)
    st = _per_sample(sigma_next, batch, ndim, x.device)
    alpha_s, alpha_t = 1.0 - s, 1.0 - st
    exp_neg_h = st * alpha_s / (alpha_t * s)
    x0 = sde.x0_prediction(x, velocity, sigma)
    mean = (st / s) * exp_neg_h * x + alpha_t * (1.0 - exp_neg_h * exp_neg_h) * x0
    std = st * torch.sqrt(1.0 - exp_neg_h * exp_neg_h)
    return sde.gaussian_transition(mean, std, noise, prev_sample, "dpm_sde_step")
