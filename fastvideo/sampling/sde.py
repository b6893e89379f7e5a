"""Flow-matching sigma schedule and the SDE step with its Gaussian log-probability.

Pure functions, no I/O, no host synchronisation. Everything is computed in float32 whatever the
input dtype: the log-probability ratio exp(logp_new - logp_old) is the quantity GRPO clips at
1 +- 1e-4, and bf16 round-off alone would exceed that.

Notation (see ALGORITHM.md): x is the latent at sigma_k, v the predicted velocity, sigma_next is
sigma_{k+1} < sigma_k, Delta = sigma_next - sigma_k.
"""

from __future__ import annotations

import math

import torch

# log(sqrt(2 pi)), the Gaussian normalising constant per element.
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def sigma_schedule(num_steps: int, shift: float) -> torch.Tensor:
    """Shifted flow-matching noise levels, float32 [num_steps + 1], from 1 down to exactly 0.

    t_k = linspace(1, 0, N + 1); sigma_k = s t_k / (1 + (s - 1) t_k). A shift s > 1 spends more
    steps at high noise, which is where FLUX's composition is decided.
    """
    if num_steps < 1:
        raise ValueError(f"sampling_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    t = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32)
    return shift * t / (1.0 + (shift - 1.0) * t)


SIGMA_GRIDS = ("shifted_linspace", "diffusers")


def diffusers_sigma_schedule(num_steps: int, shift: float, train_timesteps: int = 1000) -> torch.Tensor:
    """The grid of diffusers' FlowMatchEulerDiscreteScheduler(shift=shift), static shift, after
    set_timesteps(num_steps) with no sigmas given: float32 [num_steps + 1], 1 down to
    sigma_min then exactly 0. What Flow-GRPO's and DiffusionNFT's SD3 pipelines sample on.

    The scheduler's training grid ends at sigma_min = shift(1 / train_timesteps); set_timesteps
    spaces the UNshifted values evenly from 1 to that already-shifted sigma_min and shifts again,
    so the last non-zero sigma is shift(shift(1/1000)) (0.0089 at shift 3), not 1/N shifted. The
    arithmetic follows the scheduler's dtypes (sigma_min in float32, the grid in float64, the result
    rounded to float32) so that the two agree bit for bit.
    """
    import numpy as np

    if num_steps < 1:
        raise ValueError(f"sampling_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    ends = torch.tensor([train_timesteps, 1.0], dtype=torch.float32) / train_timesteps  # [1, 1/T] float32
    ends = shift * ends / (1 + (shift - 1) * ends)
    sigma_max, sigma_min = (float(v) for v in ends)
    t = np.linspace(sigma_max * train_timesteps, sigma_min * train_timesteps, num_steps) / train_timesteps
    sigmas = torch.from_numpy(shift * t / (1 + (shift - 1) * t)).to(torch.float32)
    return torch.cat([sigmas, torch.zeros(1, dtype=torch.float32)])


def stretch_to_terminal(sigmas: torch.Tensor, terminal: float, last: float | torch.Tensor | None = None) -> torch.Tensor:
    """diffusers' FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal (a scheduler config with
    ``shift_terminal``, e.g. Qwen-Image's 0.02) on a grid's non-zero sigmas: 1 - (1 - s) / k with
    k = (1 - last) / (1 - terminal), so that 1 stays 1 and ``last`` (default: the grid's last non-zero
    sigma) becomes ``terminal``; a final 0 stays 0. float32, the scheduler's order of operations."""
    if not 0.0 < terminal < 1.0:
        raise ValueError(f"shift_terminal must lie in (0, 1); got {terminal}")
    sigmas = sigmas.to(torch.float32)
    nonzero = sigmas != 0
    one_minus = 1.0 - sigmas
    end = one_minus[nonzero][-1] if last is None else 1.0 - torch.as_tensor(last, dtype=torch.float32)
    scale = end / (1.0 - torch.tensor(terminal, dtype=torch.float32))
    return torch.where(nonzero, 1.0 - one_minus / scale, sigmas)


def grid_sigmas(grid: str, num_steps: int, shift: float, terminal: float | None = None) -> torch.Tensor:
    """--sigma_grid: "shifted_linspace" (sigma_schedule, this trainer's default and DanceGRPO's) or
    "diffusers" (diffusers_sigma_schedule, Flow-GRPO's and DiffusionNFT's). float32 [num_steps + 1].
    ``terminal``: the model family's scheduler's shift_terminal (ModelFamily.schedule_terminal), the
    grid then stretched to it (stretch_to_terminal) as that scheduler does; None: not stretched."""
    if grid == "shifted_linspace":
        sigmas = sigma_schedule(num_steps, shift)
    elif grid == "diffusers":
        sigmas = diffusers_sigma_schedule(num_steps, shift)
    else:
        raise ValueError(f"sigma grid {grid!r}; valid: {SIGMA_GRIDS}")
    return sigmas if terminal is None else stretch_to_terminal(sigmas, terminal)


def _per_sample(value: torch.Tensor | float, batch: int, ndim: int, device) -> torch.Tensor:
    """A python float, a 0-d tensor or a [B] tensor -> float32 tensor broadcastable to [B, ...].

    Python floats become float32 tensors too, so a float and the equal float32 tensor give
    bit-identical steps.
    """
    t = torch.as_tensor(value, dtype=torch.float32, device=device)
    if t.ndim == 0:
        return t
    if t.ndim != 1 or t.shape[0] != batch:
        raise ValueError(f"sigma must be a float, a 0-d tensor or a [B={batch}] tensor; got shape {tuple(t.shape)}")
    return t.view(batch, *([1] * (ndim - 1)))


def sde_step(
    latents: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    eta: float,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step x_k -> x_{k+1} of the flow-matching SDE and log p(x_{k+1} | x_k).

    latents, velocity: [B, ...] (any dtype; computed in float32).
    sigma, sigma_next: python floats, 0-d tensors or per-sample [B] tensors (the update phase
        trains a different timestep for each sample of a micro-batch).
    eta: noise scale; eta == 0 is the deterministic Euler ODE step x + Delta * v and the
        returned log_prob is zeros (there is no density).
    noise: eps ~ N(0, I) [B, ...] for the rollout draw. Required when eta > 0 and prev_sample is
        None: the caller owns every random draw (sampling.randomness), so none happens here.
    prev_sample: the stored x_{k+1} [B, ...]; when given, nothing is sampled and its
        log-probability under the step's Gaussian is evaluated (the update phase).

    Returns (prev_sample float32 [B, ...], log_prob float32 [B]); log_prob is the mean over all
    non-batch elements of log N(prev_sample; mean, std^2), as DanceGRPO averages.
    """
    if latents.shape != velocity.shape:
        raise ValueError(f"latents {tuple(latents.shape)} and velocity {tuple(velocity.shape)} differ in shape")
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    x = latents.float()
    v = velocity.float()
    batch, ndim = x.shape[0], x.ndim
    s = _per_sample(sigma, batch, ndim, x.device)
    s_next = _per_sample(sigma_next, batch, ndim, x.device)
    delta = s_next - s  # < 0: sigma decreases towards the data

    if eta == 0:
        # Same arithmetic as diffusers' FlowMatchEulerDiscreteScheduler.step, so the ODE path can be
        # checked against FluxPipeline.
        sample = x + delta * v if prev_sample is None else prev_sample.float()
        return sample, torch.zeros(batch, dtype=torch.float32, device=x.device)

    mean, std = _gaussian(x, v, s, s_next, eta)
    return gaussian_transition(mean, std, noise, prev_sample, "sde_step with eta > 0")


def gaussian_transition(
    mean: torch.Tensor, std: torch.Tensor, noise: torch.Tensor | None, prev_sample: torch.Tensor | None, name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample mean + std * noise (rollout) or take the stored prev_sample (update), and its
    log N(sample; mean, std^2) averaged over the non-batch elements, as DanceGRPO averages.
    mean [B, ...]; std broadcastable to it; noise, prev_sample [B, ...] or None (one is needed).
    Shared by every SDE step (this module's, Flow-GRPO's and SDE-DPM-Solver++'s).
    Returns (sample float32 [B, ...], log_prob float32 [B])."""
    if prev_sample is None:
        if noise is None:
            raise ValueError(f"{name} needs `noise` (from RandomSource.step_noise) or `prev_sample`")
        if noise.shape != mean.shape:
            raise ValueError(f"noise {tuple(noise.shape)} must have the latents' shape {tuple(mean.shape)}")
        sample = mean + std * noise.float()
    else:
        if prev_sample.shape != mean.shape:
            raise ValueError(f"prev_sample {tuple(prev_sample.shape)} must have the latents' shape {tuple(mean.shape)}")
        sample = prev_sample.float()
    log_prob = -((sample.detach() - mean) ** 2) / (2.0 * std * std) - torch.log(std) - _LOG_SQRT_2PI
    return sample, log_prob.mean(dim=tuple(range(1, mean.ndim)))


def _gaussian(x, v, s, s_next, eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean [B, ...] and std (broadcastable) of the step's Gaussian; float32 inputs."""
    x0_hat = x - s * v
    score = -(x - (1.0 - s) * x0_hat) / (s * s)
    mean = x + (s_next - s) * (v - 0.5 * eta * eta * score)
    std = eta * torch.sqrt(s - s_next)
    return mean, std


def step_gaussian(
    latents: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor | float, sigma_next: torch.Tensor | float,
    eta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gaussian of one SDE step x_k -> x_{k+1}: (mean float32 [B, ...], std float32,
    broadcastable to it: 0-d or [B, 1, ...]). The same numbers sde_step samples from and scores."""
    if eta <= 0:
        raise ValueError(f"step_gaussian needs eta > 0 (eta = 0 has no density), got {eta}")
    x = latents.float()
    s = _per_sample(sigma, x.shape[0], x.ndim, x.device)
    s_next = _per_sample(sigma_next, x.shape[0], x.ndim, x.device)
    return _gaussian(x, velocity.float(), s, s_next, eta)


def x0_prediction(latents: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
    """x0_hat = x - sigma * v in float32 [B, ...]: the model's clean-image estimate at sigma.

    The rollout decodes its images from this at the last step. Note that with eta > 0 the last
    SDE step's mean is NOT x0_hat: at sigma_next = 0 the mean is x0_hat - eta^2/2 * eps_hat with
    eps_hat = x + (1 - sigma) v, and the sample adds eta sqrt(sigma) noise on top.
    """
    x = latents.float()
    s = _per_sample(sigma, x.shape[0], x.ndim, x.device)
    return x - s * velocity.float()
