"""DiffusionNFT's maths as pure functions (NVlabs/DiffusionNFT scripts/train_nft_sd3.py).

Forward process x_t = (1 - t) x0 + t eps; a velocity v predicts x0 as x_t - t v. With the current
policy's v and the old policy's v_old (no gradient), beta mixes an implicit positive and negative
policy, v+ = beta v + (1 - beta) v_old and v- = (1 + beta) v_old - beta v, and the loss pulls v+'s
x0-prediction to the clean sample where its optimality r is high and v-'s where it is low:

    L = adv_clip_max * mean_b( r L+ / beta + (1 - r) L- / beta ),
    L+- = mean((x0+- - x0)^2 / w+-),  w+- = max(mean|x0+- - x0|, 1e-5)   (per sample, no gradient)

Precision (the grad_norm=NaN FLUX users report): the reference computes the adaptive weight in
float64, which HCCL and many NPU kernels lack; here every quantity is float32, whatever the
model's output dtype (bf16 predictions are upcast before any arithmetic), and the weight's clip
keeps the division finite when a prediction equals its target exactly.
"""

from __future__ import annotations

import torch

WEIGHT_FLOOR = 1e-5  # the reference's clip of the adaptive weight


def decay_schedule(step: int, decay_type: int) -> float:
    """The old policy's decay after ``step`` optimizer steps (the reference's return_decay):
    type 0 flat 0 (the old policy follows the current one), 1 min(0.001 step, 0.5),
    2 0 for the first 75 steps, then min(0.0075 (step - 75), 0.999)."""
    flat, rate, hold = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}[int(decay_type)]
    if step < flat:
        return 0.0
    return min((step - flat) * rate, hold)


def shaped_advantages(adv: torch.Tensor, clip_max: float, mode: str = "all") -> torch.Tensor:
    """[b] advantages clipped to +-clip_max, then shaped by --adv_mode (float32)."""
    a = adv.float().clamp(-clip_max, clip_max)
    if mode == "positive_only":
        return a.clamp(0.0, clip_max)
    if mode == "negative_only":
        return a.clamp(-clip_max, 0.0)
    if mode == "one_only":
        return (a > 0).float()
    if mode == "binary":
        return torch.sign(a)
    return a


def optimality(adv: torch.Tensor, clip_max: float, mode: str = "all") -> torch.Tensor:
    """r = clip(adv / clip_max / 2 + 0.5, 0, 1) [b] of the shaped advantages."""
    return (shaped_advantages(adv, clip_max, mode) / clip_max / 2.0 + 0.5).clamp(0.0, 1.0)


def _per_sample_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=tuple(range(1, x.ndim)))


def _weighted_error(x0_pred: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """mean((x0_pred - x0)^2 / w) per sample [b], w = the no-grad clipped mean |x0_pred - x0|."""
    err = x0_pred - x0
    with torch.no_grad():
        w = _per_sample_mean(err.abs()).clamp(min=WEIGHT_FLOOR)
    return _per_sample_mean(err.square()) / w


def nft_policy_loss(v: torch.Tensor, v_old: torch.Tensor, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor,
                    r: torch.Tensor, beta: float, clip_max: float,
                    keep: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The NFT loss of b samples at one timestep each, averaged over them (a 0-d float32 tensor),
    and detached statistics. v (with gradient), v_old, x_t, x0 [b, ...]; t, r [b]; keep [b] bool or
    None: a False row (a sample dropped for a non-finite reward) contributes 0 to the mean."""
    v, v_old, x_t, x0 = v.float(), v_old.detach().float(), x_t.float(), x0.float()
    t = t.float().reshape(-1, *([1] * (x0.ndim - 1)))
    v_pos = beta * v + (1.0 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v
    pos = _weighted_error(x_t - t * v_pos, x0)
    neg = _weighted_error(x_t - t * v_neg, x0)
    per_sample = r.float() * pos / beta + (1.0 - r.float()) * neg / beta
    loss = clip_max * _kept(per_sample, keep).mean()
    stats = {"nft_positive": pos.detach().mean(), "nft_negative": neg.detach().mean(),
             "old_deviate": _per_sample_mean((v.detach() - v_old).square()).mean()}
    return loss, stats


def velocity_kl(v: torch.Tensor, v_ref: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """mean over samples of mean((v - v_ref)^2): the reference's KL term (float32, 0-d); rows where
    ``keep`` [b] is False contribute 0."""
    return _kept(_per_sample_mean((v.float() - v_ref.detach().float()).square()), keep).mean()


def _kept(per_sample: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """[b] per-sample terms with the dropped rows set to 0 (torch.where: a NaN there stays out)."""
    return per_sample if keep is None else torch.where(keep.to(per_sample.device), per_sample,
                                                       torch.zeros_like(per_sample))
