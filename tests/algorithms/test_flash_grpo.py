"""Flash-GRPO (--algorithm flash_grpo): the SDE step's log-probability, the temporal gradient
rectification and the rectified clipped loss, with their gradients, against the authors' code
re-expressed below from Shredded-Pork/Flash-GRPO at 421101378e8811aa7460ada34a3b76ac7b53c9f7
(flow_grpo/diffusers_patch/wan2_1_pipeline_with_logprob2.py: sde_step_with_logprob L10-82;
scripts/train_wanx2_1_flash.py: the policy loss L977-996 with its hard-coded coefficient table
``value_dict``), in float64; the plan and the flags."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastvideo.algorithms.flash_grpo.loss import rectification_coefficients, rectification_weights
from fastvideo.config import build_parser, validate_args
from fastvideo.errors import ConfigError
from fastvideo.grpo.loss import clipped_policy_loss
from fastvideo.sampling import sde
from fastvideo.sampling.solvers import flash_step_gaussian

# scripts/train_wanx2_1_flash.py L984: c at Wan2.1's 20 UniPC flow steps (timestep -> c), the first 10
UPSTREAM_VALUES = {999: 7.4770, 982: 7.0414, 963: 6.6112, 944: 6.1867, 922: 5.7682, 899: 5.3559, 874: 4.9502,
                   847: 4.5513, 817: 4.1596, 785: 3.7754}


def wan_unipc_sigmas(n=20, shift=3.0, train_timesteps=1000):
    """diffusers' UniPCMultistepScheduler.set_timesteps with use_flow_sigmas (Wan2.1-T2V's
    scheduler, flow_shift 3) and final_sigmas_type "zero": sigmas [n + 1], timesteps [n]."""
    alphas = np.linspace(1, 1 / train_timesteps, n + 1)
    s = 1.0 - alphas
    s = np.flip(shift * s / (1 + (shift - 1) * s))[:-1].copy()
    return torch.tensor(np.append(s, 0.0), dtype=torch.float64), (s * train_timesteps).astype(np.int64)


def up_sde_step_with_logprob(model_output, sigma, sigma_prev, sigma_max, sigma_min, sample, prev_sample):
    """sde_step_with_logprob(prev_sample=..., return_dt_and_std_dev_t=True), line for line, with the
    scheduler's sigmas passed in (sigma = sigmas[i], sigma_prev = sigmas[i + 1], [b, 1, 1])."""
    dt = sigma_prev - sigma
    std_dev_t = sigma_min + (sigma_max - sigma_min) * sigma
    prev_sample_mean = sample * (1 + std_dev_t**2 / (2 * sigma) * dt) + model_output * (
        1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    log_prob = (
        -((prev_sample.detach() - prev_sample_mean) ** 2) / (2 * ((std_dev_t * torch.sqrt(-1 * dt))**2))
        - torch.log(std_dev_t * torch.sqrt(-1 * dt))
        - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))
    )
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    coe = 1 / (torch.sqrt(-1 * dt) / std_dev_t + (std_dev_t * torch.sqrt(-1 * dt) * (1 - sigma)) / (2 * sigma))
    return log_prob, coe.reshape(-1)


def up_policy_loss(log_prob, old_log_prob, advantages, value_tensor, rank_means, clip_range, adv_clip_max=5.0):
    """train_wanx2_1_flash.py L977-996; accelerator.reduce(value_tensor.mean(), "mean") is the mean of
    the ranks' micro-batch means ``rank_means``."""
    advantages = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    ratio = torch.exp(log_prob - old_log_prob)
    w = (1 / rank_means.mean()).item()
    unclipped_loss = -w * value_tensor.squeeze() * advantages * ratio
    clipped_loss = -w * value_tensor.squeeze() * advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.mean(torch.maximum(unclipped_loss, clipped_loss))


def test_coefficients_equal_the_authors_table():
    """rectification_coefficients (eta 1) on Wan2.1's UniPC grid: the authors' value_dict to its 4 decimals."""
    sigmas, timesteps = wan_unipc_sigmas()
    c = rectification_coefficients(sigmas, torch.arange(10), 1.0)
    assert [int(t) for t in timesteps[:10]] == list(UPSTREAM_VALUES)
    torch.testing.assert_close(c.double(), torch.tensor(list(UPSTREAM_VALUES.values()), dtype=torch.float64),
                               rtol=0, atol=5e-5)
    assert float(rectification_weights(sigmas, torch.arange(10), 10, 1.0).mean()) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("old_shift, clip", [(0.0, 1e-3), (0.05, 0.02)])
def test_loss_and_gradient_equal_the_authors(old_shift, clip):
    """Per-sample steps in the pool (upstream's per-prompt draw; the objective's batch shares one):
    the log-probability of the stored next latent, then the rectified loss normalised by the pool's
    mean c (upstream: the ranks' mean, here one rank per pool step), loss and gradient w.r.t. v."""
    sigmas, _ = wan_unipc_sigmas()
    steps = torch.tensor([0, 3, 3, 9])
    g = torch.Generator().manual_seed(0)
    x, eps = (torch.randn(4, 6, 3, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(4, 6, 3, generator=g, dtype=torch.float64).requires_grad_(True)
    adv = torch.tensor([1.5, -2.0, 0.7, -6.0], dtype=torch.float64)
    s, s_next = sigmas[steps], sigmas[steps + 1]
    mean, std = flash_step_gaussian(x, v, s, s_next, 1.0, float(sigmas[1]))
    nxt = (mean + std * eps).detach().double()  # the rollout's draw (under other weights: v moved by 0.1)
    nxt = nxt + 0.1 * (s - s_next).view(-1, 1, 1) * torch.randn(4, 6, 3, generator=g, dtype=torch.float64)
    _, logp = sde.gaussian_transition(mean, std, None, nxt, "test")
    old = logp.detach() + old_shift * torch.tensor([1.0, -1.0, 0.5, 2.0])
    w = rectification_weights(sigmas, steps, 10, 1.0)
    ours, stats = clipped_policy_loss(logp, old, adv.clamp(-5, 5).float() * w, clip)
    (g_ours,) = torch.autograd.grad(ours, v)

    v2 = v.detach().clone().requires_grad_(True)
    col = lambda t: t.view(-1, 1, 1)  # noqa: E731
    lp_up, coe = up_sde_step_with_logprob(v2, col(s), col(s_next), sigmas[1], sigmas[-1], x, nxt)
    _, pool = up_sde_step_with_logprob(torch.zeros(10, 1, 1, dtype=torch.float64), col(sigmas[:10]),
                                       col(sigmas[1:11]), sigmas[1], sigmas[-1], torch.zeros(10, 1, 1), torch.zeros(10, 1, 1))
    up = up_policy_loss(lp_up, old.double(), adv, coe, pool, clip)
    (g_up,) = torch.autograd.grad(up, v2)
    torch.testing.assert_close(logp.double(), lp_up.detach(), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ours.double(), up.detach(), rtol=2e-5, atol=1e-7)
    torch.testing.assert_close(g_ours.double(), g_up, rtol=2e-4, atol=1e-7)
    assert float(g_ours.abs().max()) > 1e-4
    if old_shift:
        assert float(stats.clip_fraction) > 0  # the clipping is exercised


BASE = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility",
        "--use_group", "--algorithm", "flash_grpo", "--eta", "1"]


def _cfg(extra):
    argv = BASE + extra
    return validate_args(build_parser(argv).parse_args(argv))


def test_flags_plan_and_needs():
    from fastvideo.algorithms.flash_grpo.objective import single_sde_plan
    from fastvideo.sampling.randomness import RandomSource

    cfg = _cfg(["--flash_candidate_fraction", "0.25", "--sampling_steps", "16"])
    flash = cfg.plugins["flash_grpo"]
    assert flash.candidates(16) == 4 and flash.candidates(20) == 5 and type(flash)().candidates(20) == 10
    needs = cfg.objective_needs()
    assert needs.log_probs and needs.replay and not needs.old_policy and not needs.reference
    plan = single_sde_plan(6, 3.0, 2)
    assert plan.describe() == "OOSOOO" and plan.trainable == (2,) and plan.num_trained == 1
    assert plan.sde_kind == "flash"
    draws = {RandomSource(7).window_start(i, 3) for i in range(40)}
    assert draws == {0, 1, 2}  # the iteration's step: uniform over the pool, the same on every rank
    for bad, match in ((["--eta", "0"], "eta > 0"), (["--policy_loss", "grpo_guard"], "drop --policy_loss"),
                       (["--flow_grpo_sampling"], "Euler ODE elsewhere"),
                       (["--flash_candidate_fraction", "0"], "flash_candidate_fraction")):
        with pytest.raises(ConfigError, match=match):
            _cfg(bad)


def test_the_rollout_and_the_objective_use_the_flash_step_and_its_rectification():
    """sampling.rollout's "flash" SDE kind is the authors' step (log-probability of a stored sample,
    the step Gaussian); FlashGRPOObjective.policy_term on its plan is their rectified loss with the
    pool of --flash_candidate_fraction 0.5 (the first 10 of 20 transitions)."""
    from types import SimpleNamespace

    from fastvideo.algorithms.base import ObjectiveContext, Term
    from fastvideo.algorithms.flash_grpo.objective import FlashGRPOObjective, single_sde_plan
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import sde_transition, transition_gaussian

    plan = single_sde_plan(20, 3.0, 3)
    sig = plan.sigmas.double()
    s, s_next = sig[3], sig[4]
    g = torch.Generator().manual_seed(1)
    x, v, nxt = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    _, logp = sde_transition("flash", x, v, s, s_next, 1.0, plan.host_sigmas[1], prev_sample=x + 0.05 * nxt)
    col = torch.ones(2, 1, 1, dtype=torch.float64)
    lp_up, _ = up_sde_step_with_logprob(v, s * col, s_next * col, sig[1], sig[-1], x, x + 0.05 * nxt)
    torch.testing.assert_close(logp.double(), lp_up, rtol=2e-6, atol=2e-6)
    mean, std = transition_gaussian("flash", x, v, s, s_next, 1.0, plan.host_sigmas[1])
    torch.testing.assert_close(std.double().expand(2, 1, 1), (sig[1] * s * torch.sqrt(s - s_next)) * col)

    cfg = _cfg(["--sampling_steps", "20", "--clip_range", "0.02"])
    obj = FlashGRPOObjective(ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0, "full"),
                                              device=torch.device("cpu"), settings=cfg.plugins["flash_grpo"],
                                              randomness=RandomSource(11)))
    new = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    old, adv = torch.tensor([-1.01, -1.95, -0.5]), torch.tensor([1.5, -2.0, 0.7])
    term = Term(0, torch.arange(3), torch.full((3,), 3))
    loss, _, extra = obj.policy_term(SimpleNamespace(plan=plan), new, old, adv, term)
    _, coe = up_sde_step_with_logprob(torch.zeros(1, 1, 1, dtype=torch.float64), s.view(1, 1, 1),
                                      s_next.view(1, 1, 1), sig[1], sig[-1], torch.zeros(1, 1, 1), torch.zeros(1, 1, 1))
    _, pool = up_sde_step_with_logprob(torch.zeros(10, 1, 1, dtype=torch.float64), sig[:10].view(-1, 1, 1),
                                       sig[1:11].view(-1, 1, 1), sig[1], sig[-1], torch.zeros(10, 1, 1),
                                       torch.zeros(10, 1, 1))
    new64 = new.detach().double().requires_grad_(True)
    up = up_policy_loss(new64, old.double(), adv.double(), coe.expand(3), pool, 0.02)
    torch.testing.assert_close(loss.double(), up, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(torch.autograd.grad(loss, new)[0].double(), torch.autograd.grad(up, new64)[0],
                               rtol=1e-5, atol=1e-7)
    assert float(extra["flash_tgr"]) == pytest.approx(float(coe[0] / pool.mean()), rel=1e-6) != 1.0


def test_the_kl_branch_equals_the_authors_beta_term():
    """--kl_coef under flash_grpo (GRPOObjective.loss's KL branch on the Flash SDE step): the term's loss is
    the authors' policy_loss + beta * kl_loss (train_wanx2_1_flash.py L966-1003: the step means of the
    policy and of the adapters-off reference, mean((mu - mu_ref)^2) / (2 (std_dev_t sqrt(-dt))^2)),
    loss and gradient w.r.t. the velocity; the logged kl is their kl_loss."""
    from types import SimpleNamespace

    from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator, Term
    from fastvideo.algorithms.flash_grpo.objective import FlashGRPOObjective, single_sde_plan
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import sde_transition
    from fastvideo.training.policy import TransitionLogProb

    plan = single_sde_plan(20, 3.0, 4)
    sig = plan.sigmas.double()
    s, s_next = sig[4], sig[5]
    g = torch.Generator().manual_seed(2)
    x, v0, v_ref, eps = (torch.randn(3, 5, 4, generator=g, dtype=torch.float64) for _ in range(4))
    nxt = x + 0.05 * eps
    old = torch.tensor([-1.01, -1.95, -0.5], dtype=torch.float64)
    adv = torch.tensor([1.5, -2.0, 0.7])
    beta = 1.0  # the KL gradient well above the comparison tolerance

    class Policy:
        has_reference = True

        def __init__(self, v):
            self.v = v

        def transition_log_prob(self, traj, rows, steps, eta):
            _, logp = sde_transition("flash", x, self.v, s, s_next, eta, plan.host_sigmas[1], prev_sample=nxt)
            b = torch.ones(3, dtype=torch.float64)
            return TransitionLogProb(logp, self.v, x, s * b, s_next * b)

        def reference_velocity(self, traj, rows, x_, sigma):
            return v_ref

    cfg = _cfg(["--sampling_steps", "20", "--clip_range", "0.02", "--kl_coef", str(beta),
                "--train_micro_batch_size", "3"])
    obj = FlashGRPOObjective(ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0, "full"),
                                              device=torch.device("cpu"), settings=cfg.plugins["flash_grpo"],
                                              randomness=RandomSource(11)))
    v = v0.clone().requires_grad_(True)
    traj = SimpleNamespace(plan=plan, rollout_log_prob=lambda rows, steps: old)
    stats = StatsAccumulator(torch.device("cpu"))
    loss = obj.loss(Policy(v), traj, adv, Term(0, torch.arange(3), torch.full((3,), 4)), stats)
    (g_ours,) = torch.autograd.grad(loss, v)

    v2 = v0.clone().requires_grad_(True)
    col = torch.ones(3, 1, 1, dtype=torch.float64)
    lp, coe, mean, std_dev_t, sqrt_dt = _up_step(v2, s * col, s_next * col, sig, x, nxt)
    _, _, mean_ref, _, sqrt_dt_ref = _up_step(v_ref, s * col, s_next * col, sig, x, nxt)
    _, pool = up_sde_step_with_logprob(torch.zeros(10, 1, 1, dtype=torch.float64), sig[:10].view(-1, 1, 1),
                                       sig[1:11].view(-1, 1, 1), sig[1], sig[-1], torch.zeros(10, 1, 1),
                                       torch.zeros(10, 1, 1))
    policy_loss = up_policy_loss(lp, old, adv.double(), coe, pool, 0.02)
    kl_loss = torch.mean(((mean - mean_ref.detach()) ** 2).mean(dim=(1, 2), keepdim=True) / (2 * (std_dev_t * sqrt_dt_ref) ** 2))
    up = policy_loss + beta * kl_loss
    (g_up,) = torch.autograd.grad(up, v2, retain_graph=True)
    torch.testing.assert_close(loss.double(), up.detach(), rtol=2e-5, atol=1e-7)
    torch.testing.assert_close(g_ours.double(), g_up, rtol=2e-4, atol=1e-7)
    assert stats.mean("kl") == pytest.approx(float(kl_loss.detach()), rel=1e-5) and float(kl_loss.detach()) > 0
    # the KL's share of the gradient is not negligible: without it the gradients differ
    (g_policy,) = torch.autograd.grad(policy_loss, v2)
    assert float((g_up - g_policy).abs().max()) > 1e-2 * float(g_up.abs().max())


def _up_step(v, sigma, sigma_prev, sig, x, nxt):
    """sde_step_with_logprob(..., return_dt_and_std_dev_t=True)'s (log_prob, coe, prev_sample_mean,
    std_dev_t, sqrt(-dt)) as the authors' L38-82 compute them (sigma_max = sigmas[1], sigma_min = sigmas[-1])."""
    dt = sigma_prev - sigma
    std_dev_t = sig[-1] + (sig[1] - sig[-1]) * sigma
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    lp, coe = up_sde_step_with_logprob(v, sigma, sigma_prev, sig[1], sig[-1], x, nxt)
    return lp, coe, mean, std_dev_t, torch.sqrt(-1 * dt)
