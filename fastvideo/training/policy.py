"""The trained model as an objective sees it: velocity predictions under the run's autocast, and
the frozen reference policy's (for a KL term), without knowing the model family."""

from __future__ import annotations

import torch

from fastvideo import devices


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

    @torch.no_grad()
    def reference_velocity(self, traj, rows: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """The reference policy's velocity (no gradient); needs a reference."""
        with self.kl_reference.policy() as ref:
            return self._velocity(ref, traj, rows, x, sigma)
