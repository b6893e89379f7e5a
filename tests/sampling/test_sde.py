"""SDE step and sigma schedule against independent references (torch.distributions, diffusers)."""

import math

import numpy as np
import pytest
import torch

from fastvideo.sampling.sde import sde_step, sigma_schedule, x0_prediction


def _reference_mean_std(x, v, sigma, sigma_next, eta):
    """ALGORITHM.md written out in float64, per sample ([B] sigmas)."""
    x, v = x.double(), v.double()
    s = torch.as_tensor(sigma, dtype=torch.float64).view(-1, *([1] * (x.ndim - 1)))
    sn = torch.as_tensor(sigma_next, dtype=torch.float64).view(-1, *([1] * (x.ndim - 1)))
    x0 = x - s * v
    score = -(x - (1 - s) * x0) / s**2
    mean = x + (sn - s) * (v - 0.5 * eta**2 * score)
    std = eta * torch.sqrt(s - sn)
    return mean, std


def _random_case(seed, shape=(3, 16, 8)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    v = torch.randn(shape, generator=g)
    sigma = torch.rand(shape[0], generator=g) * 0.8 + 0.15
    sigma_next = sigma - torch.rand(shape[0], generator=g) * 0.1 - 0.01
    prev = torch.randn(shape, generator=g)
    return x, v, sigma, sigma_next, prev


@pytest.mark.parametrize("eta", [0.3, 1.0])
def test_log_prob_matches_torch_normal_with_per_sample_sigmas(eta):
    x, v, sigma, sigma_next, prev = _random_case(0)
    # prev near the mean too, where the quadratic term does not dominate
    mean64, std64 = _reference_mean_std(x, v, sigma, sigma_next, eta)
    near = (mean64 + 0.7 * std64 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))).float()
    for target in (prev, near):
        sample, log_prob = sde_step(x, v, sigma, sigma_next, eta, prev_sample=target)
        ref = torch.distributions.Normal(mean64, std64.expand_as(mean64)).log_prob(target.double()).mean(dim=(1, 2))
        assert sample is not None and torch.equal(sample, target)
        assert log_prob.shape == (3,) and log_prob.dtype == torch.float32
        torch.testing.assert_close(log_prob.double(), ref, rtol=1e-5, atol=1e-5)


def test_per_sample_sigmas_equal_row_by_row_scalar_calls():
    x, v, sigma, sigma_next, prev = _random_case(2)
    _, lp = sde_step(x, v, sigma, sigma_next, 0.5, prev_sample=prev)
    for i in range(3):
        _, lp_i = sde_step(x[i : i + 1], v[i : i + 1], float(sigma[i]), float(sigma_next[i]), 0.5, prev_sample=prev[i : i + 1])
        assert torch.equal(lp_i, lp[i : i + 1])


def test_sampling_draws_mean_plus_std_noise_and_scores_it():
    x, v, sigma, sigma_next, _ = _random_case(3)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    sample, lp = sde_step(x, v, sigma, sigma_next, 0.3, noise=noise)
    mean64, std64 = _reference_mean_std(x, v, sigma, sigma_next, 0.3)
    torch.testing.assert_close(sample.double(), mean64 + std64 * noise.double(), rtol=1e-5, atol=1e-5)
    # Scoring the drawn sample again (the update phase) gives the same log-prob: ratio 1.
    _, lp_again = sde_step(x, v, sigma, sigma_next, 0.3, prev_sample=sample)
    assert torch.equal(lp, lp_again)
    # log N(mean + std eps) = -eps^2/2 - log std - log sqrt(2 pi), averaged.
    expected = (-0.5 * noise.double() ** 2).mean(dim=(1, 2)) - torch.log(std64.view(-1)) - 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(lp.double(), expected, rtol=1e-5, atol=1e-5)


def test_eta_zero_is_euler_and_matches_diffusers_scheduler_step():
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / 6, 6))
    x, v, *_ = _random_case(5)
    for k in range(6):
        ours, lp = sde_step(x, v, sched.sigmas[k], sched.sigmas[k + 1], 0.0)
        theirs = sched.step(v, sched.timesteps[k], x, return_dict=False)[0]
        assert torch.equal(ours, theirs)
        assert torch.equal(lp, torch.zeros(3))
        x = ours


def test_float32_whatever_the_input_dtype_and_gradient_reaches_velocity():
    x, v, sigma, sigma_next, prev = _random_case(6)
    v = v.bfloat16().requires_grad_(True)
    sample, lp = sde_step(x.bfloat16(), v, sigma, sigma_next, 0.3, prev_sample=prev)
    assert sample.dtype == torch.float32 and lp.dtype == torch.float32
    lp.sum().backward()
    assert v.grad is not None and v.grad.abs().sum() > 0


def test_x0_prediction_and_last_step_mean():
    """At sigma_next = 0 the SDE mean is x0_hat - eta^2/2 (x + (1 - sigma) v), not x0_hat."""
    x, v, *_ = _random_case(7)
    sigma, eta = 0.25, 0.3
    x0 = x0_prediction(x, v, sigma)
    torch.testing.assert_close(x0, x - sigma * v)
    euler, _ = sde_step(x, v, sigma, 0.0, 0.0)
    assert torch.equal(euler, x0)
    mean64, _ = _reference_mean_std(x, v, torch.full((3,), sigma), torch.zeros(3), eta)
    torch.testing.assert_close(mean64.float(), x0 - 0.5 * eta**2 * (x + (1 - sigma) * v), rtol=1e-5, atol=1e-5)


def test_bad_inputs_fail_early():
    x, v, sigma, sigma_next, _ = _random_case(8)
    with pytest.raises(ValueError, match="noise"):
        sde_step(x, v, sigma, sigma_next, 0.3)
    with pytest.raises(ValueError, match=r"\[B=3\]"):
        sde_step(x, v, torch.ones(2), sigma_next, 0.3, noise=x)
    with pytest.raises(ValueError, match="eta"):
        sde_step(x, v, sigma, sigma_next, -1.0, noise=x)


@pytest.mark.parametrize("shift", [1.0, 3.0, 5.0])
@pytest.mark.parametrize("steps", [4, 16])
def test_sigma_schedule_formula_and_diffusers(shift, steps):
    sig = sigma_schedule(steps, shift)
    assert sig.shape == (steps + 1,) and sig.dtype == torch.float32
    assert sig[0] == 1.0 and sig[-1] == 0.0 and bool((sig[1:] < sig[:-1]).all())
    t = np.linspace(1.0, 0.0, steps + 1)
    np.testing.assert_allclose(sig.numpy(), shift * t / (1 + (shift - 1) * t), rtol=1e-6, atol=1e-7)

    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=shift, use_dynamic_shifting=False)
    sched.set_timesteps(sigmas=np.linspace(1.0, 1.0 / steps, steps))
    torch.testing.assert_close(sig, sched.sigmas.float(), rtol=1e-6, atol=1e-7)


def test_sigma_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="sampling_steps"):
        sigma_schedule(0, 3.0)
    with pytest.raises(ValueError, match="shift"):
        sigma_schedule(4, 0.0)
