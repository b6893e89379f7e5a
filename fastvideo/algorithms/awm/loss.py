"""AWM's maths as pure functions (arXiv 2509.25050; Flow-Factory's AWMTrainer,
src/flow_factory/trainers/awm.py at a0b2bc5, compute_weighted_log_prob and optimize).

The forward process x_t = (1 - t) x0 + t eps of a rollout's clean sample; the flow-matching error
of the policy's velocity l = mean((v - (eps - x0))^2) per sample is a log-probability log p = -w(l, t):

    uniform  l            t      t l            t2  t^2 l
    huber    (sqrt(l + 1e-10) - 1e-5) t
    ghuber   ((l + 1e-10)^p - (1e-10)^p) t / p

and the loss is GRPO's clipped ratio exp(log p - log p_old) against the advantages (grpo.loss).
Flow-Factory computes log p in float64; here in float32 (NPUs lack float64), the difference is
float32 rounding.
"""

from __future__ import annotations

import torch

WEIGHTINGS = ("uniform", "t", "t2", "huber", "ghuber")
_EPS = 1e-10  # Flow-Factory's


def weighted_log_prob(v: torch.Tensor, target: torch.Tensor, t: torch.Tensor, weighting: str = "uniform",
                      power: float = 0.25) -> torch.Tensor:
    """-w(mean((v - target)^2), t) per sample: [b]. v (with gradient), target [b, ...]; t [b] (sigma
    in [0, 1]); weighting one of WEIGHTINGS, power the ghuber exponent. Same dtype as v."""
    err = (v - target).square()
    lp = -err.mean(dim=tuple(range(1, err.ndim)))
    if weighting == "uniform":
        return lp
    if weighting == "t":
        return lp * t
    if weighting == "t2":
        return lp * t * t
    if weighting == "huber":
        return -(torch.sqrt(-lp + _EPS) - 1e-5) * t
    if weighting == "ghuber":
        eps = torch.tensor(_EPS, dtype=lp.dtype, device=lp.device)
        return -(torch.pow(-lp + eps, power) - torch.pow(eps, power)) * t / power
    raise ValueError(f"AWM weighting {weighting!r}; valid: {WEIGHTINGS}")
