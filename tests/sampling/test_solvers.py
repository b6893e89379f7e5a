"""DPM-Solver(++) (orders 1-3, ODE and SDE) against diffusers' DPMSolverMultistepScheduler (flow sigmas); Flow-GRPO SDE maths."""

import math

import pytest
import torch
from diffusers import DPMSolverMultistepScheduler

from fastvideo.sampling import sde
from fastvideo.sampling import solvers
from fastvideo.sampling.solvers import dpm_model_output, dpm_multistep, dpm_sde_step, dpm_solver_step, flow_sde_step


def _velocity(x, sigma):
    """A smooth, non-linear toy velocity field v(x, sigma) [B, L, C]."""
    return torch.tanh(0.7 * x) * (1.0 + sigma) - 0.3 * x * sigma + 0.2


def _ours(x, sigmas, algorithm, order, solver_type):
    """The rollout's DPM loop (history of (output, sigma), solvers.dpm_multistep) on the toy field."""
    history, n = [], len(sigmas) - 1
    for k in range(n):
        v = _velocity(x, sigmas[k])
        history = (history + [(dpm_model_output(x, v, sigmas[k], algorithm), sigmas[k])])[-3:]
        x = dpm_multistep(x, history, sigmas[k + 1], order, k, n, algorithm, solver_type)
    return x


def _diffusers(algorithm, order, solver_type, steps, **extra):
    # diffusers 0.32 takes flow_prediction for the data-prediction solvers only; the noise-
    # prediction ones get eps = x + (1 - sigma) v as an "epsilon" model (alpha = 1 - sigma there).
    flow = algorithm.endswith("++")
    sched = DPMSolverMultistepScheduler(
        use_flow_sigmas=True, prediction_type="flow_prediction" if flow else "epsilon", flow_shift=3.0,
        algorithm_type=algorithm, solver_order=order, solver_type=solver_type, lower_order_final=True, **extra,
    )
    sched.set_timesteps(steps)
    return sched, flow


@pytest.mark.parametrize("algorithm,order,solver_type", [
    ("dpmsolver++", 1, "midpoint"), ("dpmsolver++", 2, "midpoint"), ("dpmsolver++", 2, "heun"),
    ("dpmsolver++", 3, "midpoint"), ("dpmsolver", 1, "midpoint"), ("dpmsolver", 2, "midpoint"),
    ("dpmsolver", 2, "heun"), ("dpmsolver", 3, "heun"),
])
# 14 / 15: the second-to-last step is lowered below 15 transitions and not at exactly 15 (diffusers'
# lower_order_final: len(timesteps) < 15); 16: not lowered
@pytest.mark.parametrize("steps", [6, 14, 15, 16])
def test_dpm_solver_matches_diffusers_flow_scheduler(algorithm, order, solver_type, steps):
    # diffusers' noise-prediction solvers cannot end at sigma 0 (final_sigmas_type sigma_min);
    # euler_at_final makes their last step first order, as ours always is (upstream's
    # lower_order_final). The schedule starts at sigma 0.94, not ~1: there alpha_s ~ 3e-4 and
    # the noise form loses ~2e-4 to float32 rounding in diffusers (ours: 3e-5 of float64).
    noise_form = not algorithm.endswith("++")
    extra = dict(final_sigmas_type="sigma_min", euler_at_final=True) if noise_form else dict(final_sigmas_type="zero")
    sched, flow = _diffusers(algorithm, order, solver_type, steps, **extra)
    t = torch.linspace(0.85, 0.01 if noise_form else 0.0, steps + 1)
    sched.sigmas = 3.0 * t / (1.0 + 2.0 * t)
    sched.timesteps = sched.sigmas[:-1] * 1000
    sched._step_index = 0
    x_ref = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(0))
    x = x_ref.clone()
    for i, t in enumerate(sched.timesteps):
        sigma = sched.sigmas[i]
        v = _velocity(x_ref, sigma)
        x_ref = sched.step(v if flow else x_ref + (1 - sigma) * v, t, x_ref, return_dict=False)[0]
    s = sched.sigmas.tolist()
    assert (s[-1] == 0) != noise_form and len(s) == steps + 1 and sched.step_index == steps
    ours = _ours(x, s, algorithm, order, solver_type)
    torch.testing.assert_close(ours, x_ref, rtol=1e-5, atol=1e-5)  # measured <= 1.7e-6
    if order > 1:  # the order is really used: one order lower is measurably different
        assert (_ours(x, s, algorithm, order - 1, solver_type) - x_ref).abs().max() > 5e-4  # measured >= 1.3e-3


def test_sde_dpm_step_matches_diffusers_and_its_gaussian():
    """First-order SDE-DPM-Solver++ against diffusers' sde-dpmsolver++ step with the same noise;
    the log-prob against torch.distributions.Normal, the mean and std read off diffusers (noise 0 / e)."""
    x = torch.randn(3, 10, 4, generator=torch.Generator().manual_seed(5))
    e = torch.randn(3, 10, 4, generator=torch.Generator().manual_seed(6))
    for k in (0, 2, 4):  # sigma ~1 (k = 0) included
        outs = []
        for noise in (torch.zeros_like(e), e):
            sched, _ = _diffusers("sde-dpmsolver++", 1, "midpoint", 6, final_sigmas_type="zero")
            sched._step_index = k
            outs.append(sched.step(_velocity(x, sched.sigmas[k]), sched.timesteps[k], x, variance_noise=noise,
                                   return_dict=False)[0])
        mean, sample_ref = outs
        s, s_next = float(sched.sigmas[k]), float(sched.sigmas[k + 1])
        sample, logp = dpm_sde_step(x, _velocity(x, s), s, s_next, noise=e)
        torch.testing.assert_close(sample, sample_ref, rtol=2e-5, atol=2e-5)
        std = ((sample_ref - mean) / e).median()
        assert 0.01 < std < s_next  # a real noise level, below sigma_t
        ref = torch.distributions.Normal(mean, std).log_prob(sample).mean(dim=(1, 2))
        torch.testing.assert_close(logp, ref, rtol=1e-4, atol=1e-4)
        # re-scoring the stored sample (the update) gives the same log-prob, with per-sample sigmas
        _, logp2 = dpm_sde_step(x, _velocity(x, s), torch.full((3,), s), torch.full((3,), s_next),
                                prev_sample=sample)
        torch.testing.assert_close(logp2, logp, rtol=1e-6, atol=1e-6)


def test_dpm_step_order_rules():
    # the step to sigma 0 is first order; short schedules lower the second-to-last step to 2
    assert solvers.dpm_step_order(3, 5, 6, 0.0, 3) == 1
    assert solvers.dpm_step_order(3, 4, 6, 0.2, 3) == 2
    assert solvers.dpm_step_order(3, 14, 16, 0.2, 3) == 3
    assert solvers.dpm_step_order(3, 3, 6, 0.3, 2) == 2  # history still short
    assert solvers.dpm_step_order(2, 3, 6, 0.3, 3) == 2
    # the step to sigma 0 lands on the data prediction x - sigma v in both forms
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(7))
    v = _velocity(x, 0.3)
    for algorithm in ("dpmsolver++", "dpmsolver"):
        out = dpm_solver_step(x, [dpm_model_output(x, v, 0.3, algorithm)], [0.3], 0.0, algorithm)
        torch.testing.assert_close(out, x - 0.3 * v, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="sigma 1"):
        dpm_solver_step(x, [x], [1.0], 0.5, "dpmsolver")


def test_dpm_solver_pp_second_order_convergence():
    """Error against a fine Euler solution falls ~4x when the step halves (uniform lambda grid)."""
    x1 = torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(1))
    lam = lambda s: math.log((1 - s) / s)
    s_hi, s_lo = 0.9, 0.05

    def grid(n):  # uniform in lambda between s_hi and s_lo
        ls = torch.linspace(lam(s_hi), lam(s_lo), n + 1, dtype=torch.float64)
        return (1.0 / (1.0 + torch.exp(ls))).tolist()

    def solve(n):
        x = x1.double()
        sig = grid(n)
        px, ps = None, None
        for k in range(n):
            v = _velocity(x, sig[k])
            x0 = x - sig[k] * v
            a_t, a_0 = 1 - sig[k + 1], 1 - sig[k]
            e = sig[k + 1] * a_0 / (a_t * sig[k])
            out = (sig[k + 1] / sig[k]) * x - a_t * (e - 1) * x0
            if px is not None:  # same formula as dpm_solver_pp_step, in float64 for the convergence study
                h = lam(sig[k + 1]) - lam(sig[k])
                out = out - 0.5 * a_t * (e - 1) * (x0 - px) * (h / (lam(sig[k]) - lam(ps)))
            outputs, sigmas = ([x0.float()], [sig[k]]) if px is None else ([px.float(), x0.float()], [ps, sig[k]])
            ours = dpm_solver_step(x.float(), outputs, sigmas, sig[k + 1]).double()
            assert (ours - out).abs().max() < 1e-4
            x, px, ps = out, x0, sig[k]
        return x

    x = x1.double()
    fine = torch.linspace(s_hi, s_lo, 40001, dtype=torch.float64).tolist()
    for k in range(len(fine) - 1):
        x = x + (fine[k + 1] - fine[k]) * _velocity(x, fine[k])
    errs = [(solve(n) - x).abs().max().item() for n in (8, 16, 32)]
    ratios = [errs[0] / errs[1], errs[1] / errs[2]]
    assert all(3.0 < r < 5.5 for r in ratios), (errs, ratios)


def test_flow_sde_step_gaussian_and_limits():
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(2))
    v = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(3))
    eps = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(4))
    s, sn, eta = 0.6, 0.5, 0.7
    sample, logp = flow_sde_step(x, v, s, sn, eta, sigma_max=0.95, noise=eps)
    g = eta * math.sqrt(s / (1 - s))
    score = -(x + (1 - s) * v) / s
    mean = x + (sn - s) * (v - 0.5 * g * g * score)
    std = g * math.sqrt(s - sn)
    torch.testing.assert_close(sample, mean + std * eps, rtol=1e-5, atol=1e-5)
    ref = torch.distributions.Normal(mean, std).log_prob(sample).mean(dim=(1, 2))
    torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-5)
    # re-evaluating the stored sample gives the same log-prob; per-sample sigmas work
    _, logp2 = flow_sde_step(x, v, torch.full((3,), s), torch.full((3,), sn), eta, 0.95, prev_sample=sample)
    torch.testing.assert_close(logp2, logp)
    # sigma = 1 uses sigma_max and stays finite
    _, logp1 = flow_sde_step(x, v, 1.0, 0.9, eta, sigma_max=0.9, noise=eps)
    assert torch.isfinite(logp1).all()
