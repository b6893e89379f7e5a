"""The trained model as an objective sees it: velocity predictions under the run's autocast, the
frozen reference policy's (for a KL term), and the log-probability of a stored rollout transition,
without knowing the model family or how the trajectory stores its states."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastvideo.index_copies import on
from fastvideo import devices
from fastvideo.sampling.rollout import fixed_tokens, sde_transition


@dataclass
class TransitionLogProb:
    """The current policy on stored transitions (rows[i]: step steps[i] -> steps[i] + 1), b of them.

    log_prob [b] (with gradients); velocity [b, L, C] float32 (with gradients); x [b, L, C] the
    state the transition leaves; sigma, sigma_next [b] its noise levels."""

    log_prob: torch.Tensor
    velocity: torch.Tensor
    x: torch.Tensor
    sigma: torch.Tensor
    sigma_next: torch.Tensor


class Policy:
    """model: the (wrapped) trainable transformer; family: its models.base.ModelFamily;
    kl_reference: training.kl_reference's reference or None; autocast_dtype: e.g. torch.bfloat16,
    or None for full precision."""

    def __init__(self, model, family, device: torch.device, autocast_dtype: torch.dtype | None,
                 kl_reference=None):
        self.model = model
        self.family = family
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.kl_reference = kl_reference

    @property
    def has_reference(self) -> bool:
        return self.kl_reference is not None

    def _velocity(self, model, traj, rows: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        cond = traj.cond.select(rows)
        with devices.autocast(self.device, self.autocast_dtype, enabled=self.autocast_dtype is not None):
            return self.family.velocity(model, x, sigma, cond, traj.layout)

    def velocity(self, traj, rows: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """v(x, sigma | the conditioning of traj's rows) [b, L, C] float32, with gradients."""
        return self._velocity(self.model, traj, rows, x, sigma)

    def transition_log_prob(self, traj, rows: torch.Tensor, steps: torch.Tensor, eta: float) -> TransitionLogProb:
        """Log-probability under the current policy of the stored transitions (rows[i], steps[i]),
        by the SDE step of the trajectory's plan with noise scale ``eta``; rows, steps [b] int64."""
        lat = traj.latents[on(rows, traj.latents.device), on(steps, traj.latents.device)]
        nxt = traj.latents[on(rows, traj.latents.device), on(steps, traj.latents.device) + 1]
        sig = traj.sigmas[on(steps, traj.sigmas.device)]
        sig_next = traj.sigmas[on(steps, traj.sigmas.device) + 1]
        v = self.velocity(traj, rows, lat, sig)
        plan = traj.plan
        _, logp = sde_transition(plan.sde_kind, lat, v, sig, sig_next, eta, plan.host_sigmas[1], prev_sample=nxt,
                                 fixed=fixed_tokens(traj.layout))
        return TransitionLogProb(logp, v, lat, sig, sig_next)

    @torch.no_grad()
    def reference_velocity(self, traj, rows: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """The reference policy's velocity (no gradient); needs a reference."""
        with self.kl_reference.policy() as ref:
            return self._velocity(ref, traj, rows, x, sigma)
