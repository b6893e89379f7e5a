"""AWM (--algorithm awm): the weighted matching log-probability, the clipped loss and their
gradients against Flow-Factory's own code, re-expressed below from X-GenGroup/Flow-Factory at
a0b2bc5a2b4fbf9125429b3fb70c0c5d7631047c (src/flow_factory/trainers/awm.py:
AWMTrainer.compute_weighted_log_prob L283-330, the policy loss of optimize L498-505), in float64;
the objective's plan and flags."""

from __future__ import annotations

import pytest
import torch

from fastvideo.algorithms.awm.loss import WEIGHTINGS, weighted_log_prob
from fastvideo.algorithms.awm.settings import WEIGHTINGS as FLAG_WEIGHTINGS
from fastvideo.config import build_parser, validate_args
from fastvideo.errors import ConfigError
from fastvideo.grpo.loss import clipped_policy_loss

FF_NAMES = {"uniform": "Uniform", "t": "t", "t2": "t**2", "huber": "huber", "ghuber": "ghuber"}


def ff_compute_weighted_log_prob(model_output, target, timestep, weighting="Uniform", ghuber_power=0.25):
    """Flow-Factory's compute_weighted_log_prob, line for line (flow_match_sigma(t) = t / 1000)."""
    model_output = model_output.double()
    target = target.double()
    log_prob = -(model_output - target) ** 2
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    t = timestep.view(-1) / 1000.0
    if weighting == 'Uniform':
        pass
    elif weighting == 't':
        log_prob = log_prob * t
    elif weighting == 't**2':
        log_prob = log_prob * t ** 2
    elif weighting == 'huber':
        log_prob = -(torch.sqrt(-log_prob + 1e-10) - 1e-5) * t
    elif weighting == 'ghuber':
        eps = torch.tensor(1e-10, device=log_prob.device, dtype=log_prob.dtype)
        log_prob = -(torch.pow(-log_prob + eps, ghuber_power) - torch.pow(eps, ghuber_power)) * t / ghuber_power
    return log_prob  # (Flow-Factory returns .float(); compared in float64 here)


def ff_policy_loss(log_prob, old_log_prob, adv, adv_clip_range, ratio_clip_range):
    """Flow-Factory's AWM policy loss (optimize, steps 3)."""
    adv = torch.clamp(adv, adv_clip_range[0], adv_clip_range[1])
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped_loss = -adv * ratio
    clipped_loss = -adv * torch.clamp(ratio, 1.0 + ratio_clip_range[0], 1.0 + ratio_clip_range[1])
    return torch.mean(torch.maximum(unclipped_loss, clipped_loss))


def _tensors(seed=0, b=4):
    g = torch.Generator().manual_seed(seed)
    x0, eps = (torch.randn(b, 5, 3, generator=g, dtype=torch.float64) for _ in range(2))
    v = (eps - x0 + 0.4 * torch.randn(b, 5, 3, generator=g, dtype=torch.float64)).requires_grad_(True)
    t = torch.tensor([0.9, 0.55, 0.3, 0.12], dtype=torch.float64)[:b]
    adv = torch.tensor([1.5, -2.0, 0.7, -0.3], dtype=torch.float64)[:b]
    return v, eps - x0, t, adv


@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("old_shift, clip", [(0.0, 1e-4), (0.05, 0.02)])
def test_loss_and_gradient_equal_flow_factorys(weighting, old_shift, clip):
    """old_shift 0: the on-policy update (old = current, detached; the objective's); 0.05: an old
    log-probability elsewhere, so the ratio leaves the clip range."""
    assert FLAG_WEIGHTINGS == WEIGHTINGS
    v, target, t, adv = _tensors()
    lp = weighted_log_prob(v, target, t, weighting, 0.25)
    old = lp.detach() + old_shift * torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    ours, stats = clipped_policy_loss(lp, old, adv, clip)
    (g_ours,) = torch.autograd.grad(ours, v)
    v2 = v.detach().clone().requires_grad_(True)
    lp_ff = ff_compute_weighted_log_prob(v2, target, t * 1000.0, FF_NAMES[weighting], 0.25)
    torch.testing.assert_close(lp.detach(), lp_ff.detach(), rtol=1e-12, atol=1e-15)
    ff = ff_policy_loss(lp_ff, old, adv, (-5.0, 5.0), (-clip, clip))
    (g_ff,) = torch.autograd.grad(ff, v2)
    torch.testing.assert_close(ours, ff, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(g_ours, g_ff, rtol=1e-10, atol=1e-15)
    assert float(g_ours.abs().max()) > 1e-4
    if old_shift:
        assert float(stats.clip_fraction) > 0  # the clipping is exercised


BASE = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility",
        "--use_group", "--algorithm", "awm"]


def _cfg(extra):
    argv = BASE + extra
    return validate_args(build_parser(argv).parse_args(argv))


def test_awm_flags_and_needs():
    cfg = _cfg(["--awm_weighting", "t2"])
    assert cfg.plugins["awm"].weighting == "t2" and cfg.plugins["awm"].ghuber_power == 0.25
    needs = cfg.objective_needs()
    assert not needs.log_probs and not needs.replay and not needs.old_policy and not needs.reference
    with pytest.raises(ConfigError, match="samples every step with the Euler ODE"):
        _cfg(["--sde_steps", "1"])
    with pytest.raises(ConfigError, match="awm_ghuber_power"):
        _cfg(["--awm_ghuber_power", "0"])


# ---------------------------------------------------------------- the objective itself
@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_objective_loss_equals_flow_factorys_on_the_forward_process(kl):
    """AWMObjective.loss of one term on a linear model: Flow-Factory's loss of the same x_t, eps and t
    (old log-prob: its own detached value, the on-policy update), KL included, scaled by GA x T."""
    from types import SimpleNamespace

    from torch import nn

    from fastvideo.algorithms.awm.objective import AWMObjective
    from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator
    from fastvideo.algorithms.nft import deterministic_plan
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.sampling.randomness import RandomSource
    from test_nft import _Policy  # a policy over a linear velocity model

    torch.manual_seed(0)
    model, ref = nn.Linear(4, 4), nn.Linear(4, 4)
    cfg = _cfg(["--awm_weighting", "t", "--train_micro_batch_size", "2", "--timestep_fraction", "0.5",
                "--gradient_accumulation_steps", "2", "--kl_coef", str(kl)])
    rand = RandomSource(11)
    obj = AWMObjective(ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0, "full"), device=torch.device("cpu"),
                                        settings=cfg.plugins["awm"], randomness=rand))
    plan = deterministic_plan("ode", 6, 3.0)
    g = torch.Generator().manual_seed(3)
    traj = SimpleNamespace(x0=torch.randn(4, 5, 4, generator=g), sigmas=plan.sigmas, plan=plan,
                           sample_ids=torch.arange(100, 104), num_samples=4)
    adv = torch.tensor([1.5, -0.5, 4.0, -3.0])
    term = obj.plan_update(traj, iteration=5)[1][2]
    stats = StatsAccumulator(torch.device("cpu"))
    loss = obj.loss(_Policy(model, ref if kl else None), traj, adv, term, stats)
    grads = torch.autograd.grad(loss, list(model.parameters()))

    rows, steps = term.rows, term.steps
    x0, t = traj.x0[rows], traj.sigmas[steps]
    eps = rand.train_noise(5, traj.sample_ids[rows], steps, (5, 4))  # the draw the objective is bound to use
    x_t = (1 - t.view(-1, 1, 1)) * x0 + t.view(-1, 1, 1) * eps
    twin = nn.Linear(4, 4)
    twin.load_state_dict(model.state_dict())
    v = twin(x_t)
    lp = ff_compute_weighted_log_prob(v, eps - x0, t * 1000.0, "t")
    expected = ff_policy_loss(lp, lp.detach(), adv[rows].double(), (-5.0, 5.0), (-1e-4, 1e-4))
    if kl:
        with torch.no_grad():
            v_ref = ref(x_t)
        expected = expected + kl * ((v - v_ref) ** 2).mean(dim=(1, 2)).mean()
    expected = expected / (2 * 3)  # GA 2 x T 3 (int(6 * 0.5)) terms per optimizer step, full micro-batch
    ref_grads = torch.autograd.grad(expected, list(twin.parameters()))
    assert abs(float(loss.detach()) - float(expected.detach())) <= 1e-6 * max(1.0, abs(float(expected.detach())))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-7)
    assert float(grads[0].abs().max()) > 1e-4
    means, _ = obj.summarize(stats)
    assert means["ratio_mean"] == 1.0 and means["awm_log_prob"] == pytest.approx(float(lp.detach().mean()), rel=1e-6)
    assert ("kl" in means) == bool(kl)


# ---------------------------------------------------------------- the EMA-KL (--awm_ema_kl_beta)
def ff_linear_warmup_decay(decay=0.999, initial_decay=0.0, warmup_steps=100):
    """Flow-Factory's ema/ema_utils.py linear_warmup_decay (a0b2bc5), line for line."""
    delta = decay - initial_decay

    def _decay(step):
        if step >= warmup_steps:
            return decay
        return initial_decay + delta * (step / warmup_steps)
    return _decay


def ff_ema_step(ema_parameters, parameters, optimization_step, update_step_interval, decay_fn):
    """Flow-Factory's ema/ema.py EMAModuleWrapper.step (a0b2bc5), line for line (one device)."""
    if update_step_interval <= 0:
        return
    if (optimization_step + 1) % update_step_interval != 0:
        return
    current_decay = decay_fn(optimization_step)
    one_minus_decay = 1 - current_decay
    for ema_param, param in zip(ema_parameters, parameters, strict=True):
        if not param.requires_grad:
            continue
        ema_param.mul_(current_decay).add_(param, alpha=one_minus_decay)


def test_ema_kl_equals_flow_factorys_ema_and_loss():
    """--awm_ema_kl_beta: the EMA after 5 iterations (interval 2, a linear warm-up of 3 to decay 0.3)
    equals Flow-Factory's EMAModuleWrapper stepped by its trainer (adapter.ema_step(step=epoch) after
    each epoch); the term's loss adds its ema_kl_beta * mean((v - v_ema)^2) (trainers/awm.py L524-537)
    beside kl_beta's, loss and gradients; the training weights are left as they were."""
    from types import SimpleNamespace

    from torch import nn

    from fastvideo.algorithms.awm.objective import EMA_WEIGHTS, AWMObjective
    from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator
    from fastvideo.algorithms.nft import deterministic_plan
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.training.ema import WeightCopy
    from test_nft import _Policy

    torch.manual_seed(0)
    model, ref = nn.Linear(4, 4), nn.Linear(4, 4)
    cfg = _cfg(["--awm_weighting", "t", "--train_micro_batch_size", "2", "--timestep_fraction", "0.5",
                "--gradient_accumulation_steps", "2", "--kl_coef", "0.05", "--awm_ema_kl_beta", "0.1",
                "--awm_ema_decay", "0.3", "--awm_ema_warmup", "3", "--awm_ema_interval", "2"])
    rand = RandomSource(11)
    obj = AWMObjective(ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0, "full"), device=torch.device("cpu"),
                                        settings=cfg.plugins["awm"], randomness=rand,
                                        copy_weights=lambda: WeightCopy(model)))
    assert set(obj.weight_sets()) == {EMA_WEIGHTS}
    ff_ema = [p.detach().clone() for p in model.parameters()]  # EMAModuleWrapper copies them at start
    g = torch.Generator().manual_seed(5)
    for iteration in range(1, 6):
        with torch.no_grad():  # an optimizer step
            for p in model.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        obj.after_update(None, iteration)
        ff_ema_step(ff_ema, list(model.parameters()), iteration - 1, 2, ff_linear_warmup_decay(0.3, 0.0, 3))
    for ours, theirs in zip(obj.ema.shadow, ff_ema):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert obj.ema.num_updates == 2 and not torch.equal(ff_ema[0], model.weight.detach())

    plan = deterministic_plan("ode", 6, 3.0)
    traj = SimpleNamespace(x0=torch.randn(4, 5, 4, generator=g), sigmas=plan.sigmas, plan=plan,
                           sample_ids=torch.arange(100, 104), num_samples=4)
    adv = torch.tensor([1.5, -0.5, 4.0, -3.0])
    term = obj.plan_update(traj, iteration=5)[0][1]
    weights = [p.detach().clone() for p in model.parameters()]
    stats = StatsAccumulator(torch.device("cpu"))
    loss = obj.loss(_Policy(model, ref), traj, adv, term, stats)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert all(torch.equal(a, b.detach()) for a, b in zip(weights, model.parameters()))

    rows, steps = term.rows, term.steps
    x0, t = traj.x0[rows], traj.sigmas[steps]
    eps = rand.train_noise(5, traj.sample_ids[rows], steps, (5, 4))
    x_t = (1 - t.view(-1, 1, 1)) * x0 + t.view(-1, 1, 1) * eps
    twin, ema_model = nn.Linear(4, 4), nn.Linear(4, 4)
    twin.load_state_dict(model.state_dict())
    ema_model.load_state_dict({"weight": ff_ema[0], "bias": ff_ema[1]})
    v = twin(x_t)
    lp = ff_compute_weighted_log_prob(v, eps - x0, t * 1000.0, "t")
    expected = ff_policy_loss(lp, lp.detach(), adv[rows].double(), (-5.0, 5.0), (-1e-4, 1e-4))
    with torch.no_grad():
        v_ref, v_ema = ref(x_t), ema_model(x_t)
    expected = expected + 0.05 * ((v - v_ref) ** 2).mean(dim=(1, 2)).mean()
    ema_kl = ((v - v_ema) ** 2).mean(dim=(1, 2))
    expected = (expected + 0.1 * ema_kl.mean()) / (2 * 3)  # GA 2 x T 3 terms per optimizer step
    ref_grads = torch.autograd.grad(expected, list(twin.parameters()))
    assert abs(float(loss.detach()) - float(expected.detach())) <= 1e-6 * max(1.0, abs(float(expected.detach())))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-7)
    means, _ = obj.summarize(stats)
    assert means["ema_kl"] == pytest.approx(float(ema_kl.detach().mean()), rel=1e-5) and means["ema_kl"] > 0


def test_ema_kl_flags_and_notes():
    cfg = _cfg(["--awm_ema_kl_beta", "0.1"])
    awm = cfg.plugins["awm"]
    assert (awm.ema_decay, awm.ema_warmup, awm.ema_interval) == (0.3, 300, 1)
    assert [awm.ema_decay_at(i) for i in (1, 151, 301, 900)] == [0.0, 0.15, 0.3, 0.3]
    for bad in (["--awm_ema_decay", "1"], ["--awm_ema_interval", "0"], ["--awm_ema_kl_beta", "-1"]):
        with pytest.raises(ConfigError, match="awm_ema"):
            _cfg(bad)
    assert any("EMA-KL" in n for n in cfg.compat_notes)
    assert any("--awm_ema_decay: no effect" in n for n in _cfg(["--awm_ema_decay", "0.5"]).compat_notes)
    assert not any("awm_ema" in n or "EMA-KL" in n for n in _cfg([]).compat_notes)
