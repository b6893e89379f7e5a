"""DPM-Solver++ against diffusers' DPMSolverMultistepScheduler (flow sigmas); Flow-GRPO SDE maths."""

import math

import pytest
import torch
from diffusers import DPMSolverMultistepScheduler

from fastvideo.sampling import sde
from fastvideo.sampling.solvers import dpm_solver_pp_step, flow_sde_step


def _velocity(x, sigma):
    """A smooth, non-linear toy velocity field v(x, sigma) [B, L, C]."""
    return torch.tanh(0.7 * x) * (1.0 + sigma) - 0.3 * x * sigma + 0.2


def _ours(x, sigmas, solver_type):
    prev_x0, prev_sigma = None, None
    for k in range(len(sigmas) - 1):
        v = _velocity(x, sigmas[k])
        x0 = sde.x0_prediction(x, v, sigmas[k])
        x = dpm_solver_pp_step(x, x0, sigmas[k], sigmas[k + 1], prev_x0, prev_sigma, solver_type)
        prev_x0, prev_sigma = x0, sigmas[k]
    return x


@pytest.mark.parametrize("solver_type", ["midpoint", "heun"])
@pytest.mark.parametrize("steps", [4, 9])
def test_dpm_solver_pp_matches_diffusers_flow_scheduler(solver_type, steps):
    sched = DPMSolverMultistepScheduler(
        use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0, algorithm_type="dpmsolver++",
        solver_order=2, solver_type=solver_type, final_sigmas_type="zero", lower_order_final=True,
    )
    sched.set_timesteps(steps)
    x_ref = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(0))
    x = x_ref.clone()
    for t in sched.timesteps:
        sigma = sched.sigmas[sched.step_index if sched.step_index is not None else 0]
        x_ref = sched.step(_velocity(x_ref, sigma), t, x_ref, return_dict=False)[0]
    ours = _ours(x, sched.sigmas.tolist(), solver_type)
    assert sched.sigmas[-1] == 0 and len(sched.sigmas) == steps + 1
    torch.testing.assert_close(ours, x_ref, rtol=2e-5, atol=2e-5)
    # not the Euler solution: the test would notice a first-order solver
    x_e = x.clone()
    s = sched.sigmas.tolist()
    for k in range(steps):
        x_e = sde.sde_step(x_e, _velocity(x_e, s[k]), s[k], s[k + 1], 0.0)[0]
    assert (x_e - x_ref).abs().max() > 1e-3


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
            ours = dpm_solver_pp_step(x.float(), x0.float(), sig[k], sig[k + 1], None if px is None else px.float(),
                                      ps).double()
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
