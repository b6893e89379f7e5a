"""GRPO-Guard (--policy_loss grpo_guard): the loss and its gradients against the peers' own code,
re-expressed below from verl-omni (verl-project/verl-omni at a1139bafffb5b9711f0a6b6edff8ecaa60bfff30,
verl_omni/trainer/diffusion/diffusion_algos.py, GRPOGuardLoss.compute_loss, L467-549) and
Flow-Factory (X-GenGroup/Flow-Factory at a0b2bc5a2b4fbf9125429b3fb70c0c5d7631047c,
src/flow_factory/trainers/grpo.py, GRPOGuardTrainer.optimize, L500-511), in float64; the old mean
rebuilt from the rollout's step and noise; the flag's checks."""

from __future__ import annotations

import pytest
import torch

from fastvideo.algorithms.grpo_guard.loss import guard_policy_loss, old_step_mean
from fastvideo.config import build_parser, validate_args
from fastvideo.errors import ConfigError
from fastvideo.sampling.rollout import sde_transition, transition_gaussian


def verl_omni_grpo_guard(old_log_prob, log_prob, advantages, clip_ratio, adv_clip_max, old_prev_sample_mean,
                         prev_sample_mean, std_dev_t, sqrt_dt):
    """verl-omni's GRPOGuardLoss.compute_loss, line for line (rollout_is_weights None)."""
    advantages = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    sigma_t = std_dev_t.mean()
    sqrt_dt_mean = sqrt_dt.mean()
    scale = sqrt_dt_mean * sigma_t
    mean_diff_sq = (prev_sample_mean - old_prev_sample_mean).pow(2)
    if mean_diff_sq.ndim > 1:
        mean_diff_sq = mean_diff_sq.mean(dim=tuple(range(1, mean_diff_sq.ndim)))
    ratio_mean_bias = mean_diff_sq / (2 * scale ** 2)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp((log_ratio + ratio_mean_bias) * scale)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    per_elem_loss = torch.maximum(unclipped_loss, clipped_loss)
    return torch.mean(per_elem_loss) / (sqrt_dt_mean ** 2)


def flow_factory_grpo_guard(log_prob, old_log_prob, next_latents_mean, old_next_latents_mean, std_dev_t, dt, adv,
                            clip_range):
    """Flow-Factory's GRPOGuardTrainer policy loss, line for line (clip_range as (-eps, +eps))."""
    scale_factor = torch.sqrt(-dt) * std_dev_t
    mse = (next_latents_mean - old_next_latents_mean).flatten(1).pow(2).mean(dim=1)
    ratio = torch.exp((log_prob - old_log_prob) * scale_factor + mse / (2 * scale_factor))
    unclipped_loss = -adv * ratio
    clipped_loss = -adv * torch.clamp(ratio, 1.0 + clip_range[0], 1.0 + clip_range[1])
    return torch.mean(torch.maximum(unclipped_loss, clipped_loss))


def _tensors(seed=0, b=4, clip_some=True):
    """One shared step (the peers' setting), float64: ratios near 1, some outside the clip range."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.tensor(-0.2, dtype=torch.float64)
    std_dev_t = torch.tensor(0.7, dtype=torch.float64)  # Flow-GRPO's g at this step
    old_mean = torch.randn(b, 6, 3, generator=g, dtype=torch.float64)
    mean = (old_mean + 0.02 * torch.randn(b, 6, 3, generator=g, dtype=torch.float64)).requires_grad_(True)
    old_lp = torch.randn(b, generator=g, dtype=torch.float64)
    lp = (old_lp + (0.5 if clip_some else 1e-4) * torch.randn(b, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.5, -2.0, 0.7, -0.3], dtype=torch.float64)[:b]
    return lp, old_lp, mean, old_mean, std_dev_t, dt, adv


@pytest.mark.parametrize("clip_range", [1e-1, 2e-6])
def test_loss_and_gradients_equal_verl_omni_and_flow_factory(clip_range):
    lp, old_lp, mean, old_mean, g_t, dt, adv = _tensors()
    sqrt_dt = torch.sqrt(-dt)
    std = (sqrt_dt * g_t).reshape(1, 1, 1)  # the step's std, as transition_gaussian returns it
    ours, stats, bias = guard_policy_loss(lp, old_lp, mean, old_mean, std, sqrt_dt.expand(4), adv, clip_range)
    grads = torch.autograd.grad(ours, (lp, mean))
    verl = verl_omni_grpo_guard(old_lp, lp, adv, clip_range, 5.0, old_mean, mean, g_t.expand(4, 1, 1),
                                sqrt_dt.expand(4))
    torch.testing.assert_close(ours, verl, rtol=1e-12, atol=0)
    for a, b in zip(grads, torch.autograd.grad(verl, (lp, mean))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    # Flow-Factory leaves out verl-omni's 1/(sqrt(-dt))^2: the same loss times -dt
    ff = flow_factory_grpo_guard(lp, old_lp, mean, old_mean, g_t, dt, adv, (-clip_range, clip_range))
    torch.testing.assert_close(ours * -dt, ff, rtol=1e-12, atol=0)
    for a, b in zip(grads, torch.autograd.grad(ff, (lp, mean))):
        torch.testing.assert_close(a * -dt, b, rtol=1e-12, atol=1e-15)
    assert float(bias.min()) > 0 and all(float(x.abs().max()) > 1e-6 for x in grads)  # not trivially zero
    assert 0 < float(stats.clip_fraction) <= 1.0 if clip_range < 1e-3 else True


def test_per_sample_steps_are_each_samples_own_verl_omni_loss():
    """Every sample may train its own step: the loss is the mean of each sample's one-sample loss."""
    lp, old_lp, mean, old_mean, _, _, adv = _tensors(seed=1)
    sqrt_dt = torch.tensor([0.3, 0.5, 0.2, 0.6], dtype=torch.float64)
    g_t = torch.tensor([0.4, 0.9, 0.7, 1.3], dtype=torch.float64)
    ours, _, _ = guard_policy_loss(lp, old_lp, mean, old_mean, (sqrt_dt * g_t).reshape(4, 1, 1), sqrt_dt, adv, 0.05)
    each = sum(verl_omni_grpo_guard(old_lp[i:i + 1], lp[i:i + 1], adv[i:i + 1], 0.05, 5.0, old_mean[i:i + 1],
                                    mean[i:i + 1], g_t[i:i + 1], sqrt_dt[i:i + 1]) for i in range(4)) / 4
    torch.testing.assert_close(ours, each, rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.autograd.grad(ours, mean)[0], torch.autograd.grad(each, mean)[0])


@pytest.mark.parametrize("kind", ["dance", "flow"])
def test_the_old_mean_is_rebuilt_from_the_rollouts_step_and_noise(kind):
    g = torch.Generator().manual_seed(2)
    x, v, eps = (torch.randn(3, 8, 4, generator=g) for _ in range(3))
    sigma, sigma_next = torch.tensor([0.9, 0.6, 0.3]), torch.tensor([0.7, 0.4, 0.1])
    sample, _ = sde_transition(kind, x, v, sigma, sigma_next, 0.7, 0.95, noise=eps)
    mean, std = transition_gaussian(kind, x, v, sigma, sigma_next, 0.7, 0.95)
    torch.testing.assert_close(old_step_mean(sample, std, eps), mean, rtol=0, atol=2e-6)


BASE = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility",
        "--use_group", "--policy_loss", "grpo_guard"]


def test_grpo_guard_refuses_a_step_without_its_gaussian():
    with pytest.raises(ConfigError, match="grpo_guard re-centres .* --dpm_apply_strategy all"):
        validate_args(build_parser().parse_args(BASE + ["--dpm_algorithm_type", "dpmsolver++", "--dpm_apply_strategy", "all"]))


def test_policy_loss_is_recorded_and_read_back():
    cfg = validate_args(build_parser().parse_args(BASE))
    assert cfg.grpo.policy_loss == "grpo_guard"
    from fastvideo.algorithms.settings import GRPOSettings

    assert GRPOSettings.flags_from_resolved({k: v for k, v in cfg.to_json()["grpo"].items()
                                             if k != "policy_loss"})["policy_loss"] == "clip"
