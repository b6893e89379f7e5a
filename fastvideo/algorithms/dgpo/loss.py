"""DGPO's maths as pure functions (arXiv 2510.08425; Flow-Factory's DGPOTrainer,
X-GenGroup/Flow-Factory at a0b2bc5, src/flow_factory/trainers/dgpo.py).

On ODE samples x0_i of a group G sharing one noise eps and one timestep t, x_t_i = (1 - t) x0_i + t eps:

    d_i     = mean((eps - x0_i) - v_theta(x_t_i))^2        (with gradient)
    d_ref_i = the same with the reference's velocity       (no gradient)
    s_G     = beta / |G| * sum_{i in G} A_i (d_i - d_ref_i)  (held constant: no gradient)
    L       = mean_i( sigmoid(s_G(i)) A_i d_i' )

with d_i' = d_i, or with the DSM clip (clip_dsm) d_i detached where the old policy's ratio
exp(d_old_i - d_i) left the clip range on the side A_i pushes it (A_i > 0: above 1 + eps; else
below 1 - eps).
"""

from __future__ import annotations

import torch


def dsm_error(v: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """mean((target - v)^2) per sample: [b]. v, target [b, ...]."""
    b = v.shape[0]
    return (target - v).square().reshape(b, -1).mean(dim=1)


def group_weights(adv: torch.Tensor, d: torch.Tensor, d_ref: torch.Tensor, group: torch.Tensor, num_groups: int,
                  beta: float, group_size: int) -> torch.Tensor:
    """sigmoid(s_G) of each sample's group, detached: [b]. adv, d, d_ref [b]; group [b] int64 in
    0..num_groups-1 (every member of a group among the b rows); group_size |G|."""
    per_sample = adv * beta * (d.detach() - d_ref.detach()) / group_size
    sums = torch.zeros(num_groups, dtype=per_sample.dtype, device=per_sample.device).scatter_add_(0, group, per_sample)
    return torch.sigmoid(sums)[group].detach()


def dsm_clip_mask(d: torch.Tensor, d_old: torch.Tensor, adv: torch.Tensor, clip_range: float) -> torch.Tensor:
    """[b] bool: exp(d_old - d) > 1 + eps where adv > 0, < 1 - eps elsewhere (no gradient)."""
    ratio = torch.exp(-d.detach() + d_old.detach())
    return torch.where(adv > 0, ratio > 1.0 + clip_range, ratio < 1.0 - clip_range)


def dgpo_loss(v: torch.Tensor, v_ref: torch.Tensor, v_old: torch.Tensor | None, target: torch.Tensor,
              adv: torch.Tensor, group: torch.Tensor, num_groups: int, beta: float, group_size: int,
              clip_range: float) -> tuple[torch.Tensor, dict]:
    """(the DGPO loss of b samples at their shared timestep, a 0-d tensor; detached statistics).
    v (with gradient), v_ref, target = eps - x0: [b, ...]; v_old [b, ...] or None (no DSM clip);
    adv, group [b]."""
    d = dsm_error(v, target)
    with torch.no_grad():
        d_ref = dsm_error(v_ref, target)
    w = group_weights(adv, d, d_ref, group, num_groups, beta, group_size)
    stats = {"dgpo_dsm": d.detach().mean(), "dgpo_ref_gap": (d.detach() - d_ref).mean(), "dgpo_weight": w.mean()}
    if v_old is not None:
        with torch.no_grad():
            clip = dsm_clip_mask(d, dsm_error(v_old, target), adv, clip_range)
        d = torch.where(clip, d.detach(), d)
        stats["clip_fraction"] = clip.float().mean()
    return (w * adv * d).mean(), stats
