"""The trained model as an objective sees it: velocity predictions under the run's autocast, and
the frozen reference policy's (for a KL term), without knowing the model family."""

from __future__ import annotations

import torch

from fastvideo import platform
from fastvideo.sampling.rollout import predict_velocity


class Policy:
    """model: the (wrapped) trainable transformer; kl_reference: training.kl_reference's
    reference or None; autocast_dtype: e.g. torch.bfloat16, or None for full precision."""

    def __init__(self, model, rollout_cfg, device: torch.device, autocast_dtype: torch.dtype | None,
                 kl_reference=None):
        self.model = model
        self.rollout_cfg = rollout_cfg
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.kl_reference = kl_reference

    @property
    def has_reference(self) -> bool:
        return self.kl_reference is not None

    def _velocity(self, model, traj, rows: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        r = rows.to(traj.prompt_embeds.device)
        with platform.autocast(self.device, self.autocast_dtype, enabled=self.autocast_dtype is not None):
            return predict_velocity(model, x, sigma, traj.prompt_embeds[r], traj.pooled[r], traj.text_ids,
                                    traj.image_ids, self.rollout_cfg.guidance_scale,
                                    self.rollout_cfg.quantize_timestep)

    def velocity(self, traj, rows: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """v(x, sigma | the conditioning of traj's rows) [b, L, C] float32, with gradients."""
        return self._velocity(self.model, traj, rows, x, sigma)

    @torch.no_grad()
    def reference_velocity(self, traj, rows: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """The reference policy's velocity (no gradient); needs a reference."""
        with self.kl_reference.policy() as ref:
            return self._velocity(ref, traj, rows, x, sigma)
