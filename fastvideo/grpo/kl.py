"""KL penalty between the policy's SDE step and the reference (frozen base) policy's step.

Both steps are Gaussians with the same covariance std^2 I (same x_k, sigma, sigma_next and eta:
the std does not depend on the model), so the KL has the closed form

    KL(N(mu, std^2 I) || N(mu_ref, std^2 I)) = ||mu - mu_ref||^2 / (2 std^2)

summed over elements. It is averaged over the elements here, as sde_step averages the log-prob,
so that --kl_coef weighs the two terms on the same per-element scale.

Under Flow-GRPO's SDE (--flow_grpo_sampling) the term is Flow-GRPO's own (scripts/train_sd3.py at
ac4c86e: mean((mu - mu_ref)^2) / (2 std_dev_t^2)), where std_dev_t is sd3_sde_with_logprob's
diffusion coefficient g = eta sqrt(sigma / (1 - sigma)), not the step's std g sqrt(sigma - sigma_next):
the Gaussian KL above times (sigma - sigma_next), so that --kl_coef means its train.beta.
"""

from __future__ import annotations

import torch


def gaussian_step_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Per-sample KL of two equal-covariance Gaussian steps, averaged over non-batch elements.

    mean: [B, ...] the policy's step mean (carries the gradient); ref_mean: [B, ...] the
    reference's (no gradient needed); std: broadcastable to [B, ...] (0-d or [B, 1, ...]).
    Returns float32 [B], >= 0, zero where the means agree.
    """
    if mean.shape != ref_mean.shape:
        raise ValueError(f"mean {tuple(mean.shape)} and ref_mean {tuple(ref_mean.shape)} differ in shape")
    diff = mean.float() - ref_mean.float()
    per_element = diff * diff / (2.0 * std.float() ** 2)
    return per_element.mean(dim=tuple(range(1, mean.ndim)))


def flow_grpo_step_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor,
                      sigma: torch.Tensor | float, sigma_next: torch.Tensor | float) -> torch.Tensor:
    """Flow-GRPO's KL term of one step -> float32 [B]: mean((mean - ref_mean)^2) / (2 g^2) with g^2 =
    std^2 / (sigma - sigma_next). mean, ref_mean: [B, ...]; std: the step's std (solvers.flow_step_gaussian);
    sigma, sigma_next: floats, 0-d or [B] (the update trains a different step per sample)."""
    step = torch.as_tensor(sigma, dtype=torch.float32, device=mean.device) - torch.as_tensor(
        sigma_next, dtype=torch.float32, device=mean.device)
    return gaussian_step_kl(mean, ref_mean, std) * step.reshape(-1)
