"""DiffusionNFT: the objective against an independent reference of its loss, the decay schedule,
optimality, float32 stability, the old policy's weights, and the objective's work plan."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fastvideo.algorithms import nft_loss
from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator
from fastvideo.algorithms.nft import NFTObjective, deterministic_plan
from fastvideo.config import build_parser, validate_args
from fastvideo.distributed.parallel import ParallelDims
from fastvideo.errors import ConfigError
from fastvideo.sampling.randomness import RandomSource
from fastvideo.training.ema import WeightCopy

BASE = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility",
        "--use_group", "--algorithm", "nft"]


# ---------------------------------------------------------------- the reference, from the formulas
def reference_nft_loss(v, v_old, x0, eps, t, adv, beta, clip_max, kl_beta=0.0, v_ref=None):
    """Written from the formulas alone (per sample, with explicit loops; shares no code with
    fastvideo.algorithms.nft_loss)."""
    total = 0.0
    b = x0.shape[0]
    for i in range(b):
        a = min(max(float(adv[i]), -clip_max), clip_max)
        r = min(max(a / clip_max / 2 + 0.5, 0.0), 1.0)
        ti = float(t[i])
        xt = (1 - ti) * x0[i] + ti * eps[i]
        vp = beta * v[i] + (1 - beta) * v_old[i]
        vn = (1 + beta) * v_old[i] - beta * v[i]
        terms = []
        for vv in (vp, vn):
            x0_hat = xt - ti * vv
            w = max(float((x0_hat - x0[i]).detach().abs().mean()), 1e-5)  # a Python float: no gradient
            terms.append(((x0_hat - x0[i]) ** 2).mean() / w)
        total = total + (r * terms[0] / beta + (1 - r) * terms[1] / beta)
    loss = clip_max * total / b
    if v_ref is not None:
        loss = loss + kl_beta * sum(((v[i] - v_ref[i]) ** 2).mean() for i in range(b)) / b
    return loss


def _inputs(seed=0, b=3, shape=(5, 4)):
    g = torch.Generator().manual_seed(seed)
    x0, eps = torch.randn(b, *shape, generator=g), torch.randn(b, *shape, generator=g)
    v_old = torch.randn(b, *shape, generator=g)
    v = (v_old + 0.3 * torch.randn(b, *shape, generator=g)).requires_grad_(True)
    t = torch.rand(b, generator=g) * 0.9 + 0.05
    adv = torch.tensor([2.5, -7.0, 0.4])[:b]
    return v, v_old, x0, eps, t, adv


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_loss_and_gradient_equal_the_independent_reference(beta):
    v, v_old, x0, eps, t, adv = _inputs()
    tb = t.view(-1, 1, 1)
    x_t = (1 - tb) * x0 + tb * eps
    r = nft_loss.optimality(adv, 5.0)
    ours, _ = nft_loss.nft_policy_loss(v, v_old, x_t, x0, t, r, beta, 5.0)
    (g_ours,) = torch.autograd.grad(ours, v)
    v2 = v.detach().clone().requires_grad_(True)
    ref = reference_nft_loss(v2, v_old, x0, eps, t, adv, beta, 5.0)
    (g_ref,) = torch.autograd.grad(ref, v2)
    assert abs(float(ours.detach()) - float(ref.detach())) <= 1e-6 * max(1.0, abs(float(ref.detach())))
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-6, atol=1e-6)
    assert float(g_ours.abs().max()) > 1e-3  # a gradient that is not trivially zero


def test_decay_schedule_is_the_references():
    d = nft_loss.decay_schedule
    assert [d(s, 0) for s in (0, 10, 10_000)] == [0.0, 0.0, 0.0]
    assert [d(s, 1) for s in (0, 100, 499, 500, 5000)] == pytest.approx([0.0, 0.1, 0.499, 0.5, 0.5])
    assert [d(s, 2) for s in (0, 74, 75, 76, 100, 208, 10_000)] == pytest.approx(
        [0.0, 0.0, 0.0, 0.0075, 0.1875, 0.9975, 0.999])


def test_optimality_and_advantage_modes():
    adv = torch.tensor([-10.0, -2.5, 0.0, 2.5, 10.0])
    assert nft_loss.optimality(adv, 5.0).tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert nft_loss.optimality(adv, 5.0, "positive_only").tolist() == pytest.approx([0.5, 0.5, 0.5, 0.75, 1.0])
    assert nft_loss.optimality(adv, 5.0, "negative_only").tolist() == pytest.approx([0.0, 0.25, 0.5, 0.5, 0.5])
    assert nft_loss.optimality(adv, 5.0, "one_only").tolist() == pytest.approx([0.5, 0.5, 0.5, 0.6, 0.6])
    assert nft_loss.optimality(adv, 5.0, "binary").tolist() == pytest.approx([0.4, 0.4, 0.5, 0.6, 0.6])


def test_exact_predictions_give_a_finite_zero_loss_and_gradient(monkeypatch):
    """x0-predictions equal to x0 exactly (values exact in float32): the adaptive weight is 0 before
    its clip, the 0 / 0 the reference guards with 1e-5; loss and gradient are finite zeros."""
    g = torch.Generator().manual_seed(1)
    x0 = torch.randint(-4, 5, (3, 5, 4), generator=g).float()
    eps = torch.randint(-4, 5, (3, 5, 4), generator=g).float()
    t = torch.tensor([0.5, 0.25, 1.0])
    exact = eps - x0  # x_t - t (eps - x0) = x0 for every t, exactly
    tb = t.view(-1, 1, 1)
    x_t = (1 - tb) * x0 + tb * eps
    r = nft_loss.optimality(torch.tensor([1.0, -1.0, 0.0]), 5.0)

    def run():
        v = exact.clone().requires_grad_(True)
        loss, _ = nft_loss.nft_policy_loss(v, exact, x_t, x0, t, r, 1.0, 5.0)
        return loss, torch.autograd.grad(loss, v)[0]

    loss, grad = run()
    assert float(loss.detach()) == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    monkeypatch.setattr(nft_loss, "WEIGHT_FLOOR", 0.0)  # without the clip: 0 / 0
    loss, grad = run()
    assert torch.isnan(loss)


def test_bf16_predictions_are_computed_in_float32():
    """bf16 model outputs: the loss is the float32 loss of the upcast values (no bf16 arithmetic,
    no float64: the NPU path), and finite."""
    v, v_old, x0, eps, t, adv = _inputs(2)
    vb, vob = v.detach().bfloat16().requires_grad_(True), v_old.bfloat16()
    tb = t.view(-1, 1, 1)
    x_t = (1 - tb) * x0 + tb * eps
    r = nft_loss.optimality(adv, 5.0)
    low, _ = nft_loss.nft_policy_loss(vb, vob, x_t, x0, t, r, 0.1, 5.0)
    up, _ = nft_loss.nft_policy_loss(vb.detach().float(), vob.float(), x_t, x0, t, r, 0.1, 5.0)
    assert low.dtype == torch.float32 and float(low) == float(up)
    (g,) = torch.autograd.grad(low, vb)
    assert torch.isfinite(g.float()).all()


def test_old_policy_step_and_swap():
    model = nn.Linear(3, 2)
    old = WeightCopy(model)
    start = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    old.step(0.25)
    for s, a, p in zip(old.shadow, start, model.parameters()):
        torch.testing.assert_close(s, 0.25 * a + 0.75 * p.detach(), rtol=0, atol=1e-6)
    current = [p.detach().clone() for p in model.parameters()]
    with old.swapped_in(model):
        assert all(torch.equal(p, s) for p, s in zip(model.parameters(), old.shadow))
    assert all(torch.equal(p, c) for p, c in zip(model.parameters(), current))  # restored bit for bit
    old.step(0.0)
    assert all(torch.equal(s, p.detach()) for s, p in zip(old.shadow, model.parameters()))
    with pytest.raises(ValueError, match="must be in"):
        old.step(1.0)


# ---------------------------------------------------------------- the objective itself
class _Policy:
    """A policy over a linear velocity model: v(x) = model(x) (no family, no conditioning)."""

    def __init__(self, model, ref=None):
        self.model, self.ref = model, ref

    @property
    def has_reference(self):
        return self.ref is not None

    def velocity(self, traj, rows, x, sigma):
        return self.model(x)

    @torch.no_grad()
    def reference_velocity(self, traj, rows, x, sigma):
        return self.ref(x)


def _objective(model, *flags):
    cfg = validate_args(build_parser().parse_args(BASE + list(flags)))
    rand = RandomSource(11)
    ctx = ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0, "full"), device=torch.device("cpu"),
                           randomness=rand, copy_weights=lambda: WeightCopy(model))
    return NFTObjective(ctx), rand


def _traj(b=4, n=6):
    g = torch.Generator().manual_seed(3)
    return SimpleNamespace(x0=torch.randn(b, 5, 4, generator=g), sigmas=deterministic_plan("dpm", n, 3.0).sigmas,
                           sample_ids=torch.arange(100, 100 + b), plan=deterministic_plan("dpm", n, 3.0),
                           num_samples=b)


@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_objective_loss_equals_the_reference_loss_and_gradient(kl):
    torch.manual_seed(0)
    model, ref = nn.Linear(4, 4), nn.Linear(4, 4)
    obj, rand = _objective(model, "--nft_beta", "0.3", "--train_micro_batch_size", "2", "--timestep_fraction",
                           "0.5", "--gradient_accumulation_steps", "2", "--kl_coef", str(kl))
    with torch.no_grad():  # an old policy that differs from the current one
        for s in obj.old.shadow:
            s.add_(0.1 * torch.randn_like(s))
    old_model = nn.Linear(4, 4)
    old_model.load_state_dict({"weight": obj.old.shadow[0], "bias": obj.old.shadow[1]})
    traj, adv = _traj(), torch.tensor([1.5, -0.5, 9.0, -3.0])
    micro = obj.plan_update(traj, iteration=5)
    term = micro[1][2]
    loss = obj.loss(_Policy(model, ref if kl else None), traj, adv, term, StatsAccumulator(torch.device("cpu")))
    grads = torch.autograd.grad(loss, list(model.parameters()))

    rows, steps = term.rows, term.steps
    x0, t = traj.x0[rows], traj.sigmas[steps]
    eps = rand.train_noise(5, traj.sample_ids[rows], steps, (5, 4))  # the draw the objective is bound to use
    tb = t.view(-1, 1, 1)
    x_t = (1 - tb) * x0 + tb * eps
    twin = nn.Linear(4, 4)
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():
        v_old, v_ref = old_model(x_t), ref(x_t)
    expected = reference_nft_loss(twin(x_t), v_old, x0, eps, t, adv[rows], 0.3, 5.0, kl, v_ref if kl else None)
    expected = expected / (2 * 3)  # GA 2 x T 3 (int(6 * 0.5)) terms per optimizer step, full micro-batch
    ref_grads = torch.autograd.grad(expected, list(twin.parameters()))
    assert abs(float(loss.detach()) - float(expected.detach())) <= 1e-6 * max(1.0, abs(float(expected.detach())))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    # the swap for v_old left the current weights in place
    assert torch.equal(model.weight, twin.weight)


def test_plan_update_draws_a_permutation_prefix_per_sample():
    obj, _ = _objective(nn.Linear(4, 4), "--train_micro_batch_size", "3", "--timestep_fraction", "0.99")
    traj = _traj(b=4, n=10)
    micro = obj.plan_update(traj, iteration=2)
    assert [len(m) for m in micro] == [9, 9] and [m[0].rows.tolist() for m in micro] == [[0, 1, 2], [3]]
    for i in range(4):
        m, j = divmod(i, 3)
        steps = [int(term.steps[j]) for term in micro[m]]
        assert len(set(steps)) == 9 and all(0 <= s < 10 for s in steps)  # never sigma 0 (index 10)
    again = obj.plan_update(traj, iteration=2)
    assert all(torch.equal(a.steps, b.steps) for ma, mb in zip(micro, again) for a, b in zip(ma, mb))


def test_rollout_plans_and_config_rules():
    plan = deterministic_plan("dpm", 8, 3.0)
    assert plan.describe() == "D" * 8 and plan.trainable == () and plan.dpm_order == 2
    assert deterministic_plan("ode", 8, 3.0).describe() == "O" * 8
    obj, _ = _objective(nn.Linear(4, 4), "--nft_solver", "sde")
    sde = obj.sampling_plan(1, 8, 3.0)  # the SDE plan of the sampling flags (GRPO's): 7 candidates, T = int(7 x 0.6)
    assert sde.describe() == "S" * 8 and sde.trainable == tuple(range(7)) and sde.num_trained == 4
    with pytest.raises(ConfigError, match="init_same_noise"):
        validate_args(build_parser().parse_args(BASE + ["--init_same_noise"]))
    with pytest.raises(ConfigError, match="nft_solver sde"):
        validate_args(build_parser().parse_args(BASE + ["--sde_steps", "2"]))
    with pytest.raises(ConfigError, match="must be > 0"):
        validate_args(build_parser().parse_args(BASE + ["--nft_beta", "0"]))
    grpo = validate_args(build_parser().parse_args(BASE[:-2] + ["--nft_beta", "0.1"]))
    assert any("--nft_beta: no effect without --algorithm nft" in n for n in grpo.compat_notes)
    nft = validate_args(build_parser().parse_args(BASE + ["--clip_range", "0.2"]))
    assert any("--clip_range" in n and "no effect with --algorithm nft" in n for n in nft.compat_notes)
    assert nft.derived(1)["trained_steps_per_sample"] == int(16 * 0.6)


def test_an_optimizer_step_over_part_of_a_group_is_noted():
    """8 samples per prompt, micro-batches of 4: one optimizer step per micro-batch covers half a
    group (noted, with the accumulation that makes it one step); 2 of them per step, or one
    micro-batch of 8, cover the group."""
    def notes(*flags):
        cfg = validate_args(build_parser().parse_args(BASE + ["--num_generations", "8", *flags]))
        return [n for n in cfg.compat_notes if "not whole groups" in n]

    split = notes("--train_micro_batch_size", "4")
    assert len(split) == 1 and "covers 4 samples" in split[0] and "--gradient_accumulation_steps 2" in split[0]
    assert notes("--train_micro_batch_size", "4", "--gradient_accumulation_steps", "2") == []
    assert notes("--train_micro_batch_size", "8") == []
    assert notes("--train_micro_batch_size", "4", "--gradient_accumulation_steps", "3") == []  # one step of 8
    assert len(notes("--train_micro_batch_size", "4", "--train_batch_size", "2", "--gradient_accumulation_steps",
                     "3")) == 1  # steps of 12 of 16 samples: the second group is split


def test_objective_state_round_trip_and_refuses_grpo_state():
    obj, _ = _objective(nn.Linear(4, 4))
    assert obj.steps_per_iteration == 12  # 12 samples per rank, micro-batches of 1
    obj.after_update(None, 25)  # decay type 1 after 25 x 12 optimizer steps: 0.3
    state = obj.state_dict()
    assert state == {"old_updates": 1, "last_decay": pytest.approx(0.3)}
    other, _ = _objective(nn.Linear(4, 4))
    other.load_state_dict(state)
    assert other.state_dict() == state
    with pytest.raises(ConfigError, match="not NFT's"):
        other.load_state_dict({})
    assert set(obj.weight_sets()) == {"old_policy"}


@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_a_sample_dropped_for_a_nonfinite_reward_does_not_train(kl):
    """Its advantage is 0, which NFT would read as r = 0.5 and train on: the objective masks its
    policy and KL terms instead. The loss is the reference loss of the kept rows, scaled to the
    micro-batch (mean over all rows, the dropped one counting 0), and the dropped row's data has
    no effect on the loss or its gradient."""
    from fastvideo.algorithms.base import RewardResult

    torch.manual_seed(0)
    model, ref = nn.Linear(4, 4), nn.Linear(4, 4)
    obj, rand = _objective(model, "--nft_beta", "0.3", "--train_micro_batch_size", "2", "--timestep_fraction",
                           "0.5", "--num_generations", "2", "--kl_coef", str(kl))
    adv = obj.advantages(RewardResult(torch.tensor([1.0, float("nan"), 2.0, 0.5]), {}))
    traj = _traj()
    term = obj.plan_update(traj, iteration=5)[0][1]  # rows 0 and 1: row 1 was dropped
    assert term.rows.tolist() == [0, 1]
    policy = _Policy(model, ref if kl else None)
    loss = obj.loss(policy, traj, adv, term, StatsAccumulator(torch.device("cpu")))

    steps = term.steps[:1]
    x0, t = traj.x0[:1], traj.sigmas[steps]
    eps = rand.train_noise(5, traj.sample_ids[:1], steps, (5, 4))
    x_t = (1 - t.view(-1, 1, 1)) * x0 + t.view(-1, 1, 1) * eps
    with torch.no_grad():
        v_old, v_ref = model(x_t), ref(x_t)  # the old policy equals the model here
    expected = reference_nft_loss(model(x_t), v_old, x0, eps, t, adv[:1], 0.3, 5.0, kl, v_ref if kl else None)
    expected = expected / 2 / 3  # one kept row of 2; T = 3 terms per optimizer step
    loss, expected = loss.detach(), expected.detach()
    assert torch.isfinite(loss) and abs(float(loss) - float(expected)) <= 1e-6 * max(1.0, abs(float(expected)))

    moved = SimpleNamespace(**{**vars(traj), "x0": traj.x0.clone()})
    moved.x0[1] += 100.0  # the dropped row's data
    again = obj.loss(policy, moved, adv, term, StatsAccumulator(torch.device("cpu"))).detach()
    assert float(again) == float(loss)
    moved.x0[0] += 1.0  # a kept row's data does count
    assert float(obj.loss(policy, moved, adv, term, StatsAccumulator(torch.device("cpu"))).detach()) != float(loss)


# ---------------------------------------------------------------- #39 test 21
def reference_dpm2(velocity, z, sigmas):
    """DiffusionNFT's deterministic ``dpm2`` rollout (flow_grpo/diffusers_patch/solver.py at 24af555:
    run_sampling -> dpm_step, order 2), written from its formulas: x0 = z - sigma v; the first and the
    last step first order, the others multistep second order with D1 = (m0 - m1) / r0 and the
    midpoint update x_t = (s_t / s_0) z - a_t (e^-h - 1) D0 - 0.5 a_t (e^-h - 1) D1 (a = 1 - sigma,
    lambda = log(a / sigma))."""
    s = sigmas.double()
    lam = lambda k: torch.log(1 - s[k]) - torch.log(s[k])  # noqa: E731
    outputs, n = [], len(s) - 1
    for i in range(n):
        m0 = (z.double() - s[i] * velocity(z, s[i]).double())
        outputs.append(m0)
        t = s[i + 1]
        if i == n - 1:
            z = m0  # first order to sigma 0: the x0 prediction
        elif i == 0:
            h = lam(i + 1) - lam(i)
            z = (t / s[i]) * z.double() - (1 - t) * (torch.exp(-h) - 1.0) * m0
        else:
            h, h0 = lam(i + 1) - lam(i), lam(i) - lam(i - 1)
            d1 = (m0 - outputs[-2]) / (h0 / h)
            z = (t / s[i]) * z.double() - (1 - t) * (torch.exp(-h) - 1.0) * m0 \
                - 0.5 * (1 - t) * (torch.exp(-h) - 1.0) * d1
        z = z.float()
    return z


class _CurvedFamily:
    """A nonlinear velocity, so that the second-order term matters."""

    def velocity(self, transformer, x, sigma, cond, layout):
        return torch.tanh(1.5 * x) * (1.0 + sigma) - 0.3 * x


@pytest.mark.parametrize("n", [6, 10])
def test_the_dpm_rollout_is_the_references_dpm2(n):
    """--nft_solver dpm samples as DiffusionNFT's dpm2 (DPM-Solver++ 2M, midpoint); heun would differ."""
    from dataclasses import replace

    from fastvideo.sampling.rollout import sample_transitions

    plan = deterministic_plan("dpm", n, 3.0)
    noise = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))
    family = _CurvedFamily()
    _, _, ours = sample_transitions(family, None, noise, {}, plan, plan.sigmas, None, None, 0.0)
    expected = reference_dpm2(lambda x, s: family.velocity(None, x, s, None, None), noise, plan.sigmas)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    heun = replace(plan, dpm_solver_type="heun")
    _, _, other = sample_transitions(family, None, noise, {}, heun, heun.sigmas, None, None, 0.0)
    assert (other - expected).abs().max() > 1e-3  # the variant is pinned, not incidental


@pytest.mark.parametrize("solver, eta_noted", [("dpm", True), ("ode", True), ("sde", False)])
def test_the_start_up_notes_under_each_solver(solver, eta_noted):
    """--eta drives only the SDE rollout: noted as without effect under dpm / ode, not under sde; the
    importance-ratio flags are without effect under every solver; nothing is noted at the defaults."""
    def nft_notes(*flags):
        cfg = validate_args(build_parser().parse_args(BASE + ["--nft_solver", solver, *flags]))
        return [n for n in cfg.compat_notes if "no effect with --algorithm nft" in n]

    assert nft_notes() == []
    eta = nft_notes("--eta", "0.7")
    assert (len(eta) == 1 and eta[0].startswith("--eta:")) == eta_noted, eta
    assert eta_noted or eta == []
    [line] = nft_notes("--clip_range", "0.2", "--kl_coeff", "0.1", "--train_last_step")
    assert line.startswith("--clip_range, --kl_coeff, --train_last_step: no effect") and f"--nft_solver {solver}" in line
    grpo = validate_args(build_parser().parse_args(BASE[:-2] + ["--nft_solver", solver]))
    noted = [n for n in grpo.compat_notes if "no effect without --algorithm nft" in n]
    assert noted == ([] if solver == "dpm" else ["--nft_solver: no effect without --algorithm nft"])


@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_each_logged_nft_term_has_its_value(kl):
    """summarize's nft_positive, nft_negative, old_deviate, kl (the means over every term of the iteration
    of the per-sample L+, L-, mean (v - v_old)^2, mean (v - v_ref)^2) and old_decay (decay type 1 after
    the iteration's optimizer steps), recomputed from the objective's own draws."""
    torch.manual_seed(0)
    model, ref = nn.Linear(4, 4), nn.Linear(4, 4)
    obj, rand = _objective(model, "--nft_beta", "0.5", "--train_micro_batch_size", "2", "--timestep_fraction",
                           "0.5", "--kl_coef", str(kl))
    with torch.no_grad():
        for s in obj.old.shadow:
            s.add_(0.1 * torch.randn_like(s))
    old_model = nn.Linear(4, 4)
    old_model.load_state_dict({"weight": obj.old.shadow[0], "bias": obj.old.shadow[1]})
    traj, adv = _traj(), torch.tensor([1.5, -0.5, 9.0, -3.0])
    stats = StatsAccumulator(torch.device("cpu"))
    terms = [term for micro in obj.plan_update(traj, iteration=7) for term in micro]
    expected = {"nft_positive": [], "nft_negative": [], "old_deviate": [], "kl": []}
    for term in terms:
        obj.loss(_Policy(model, ref if kl else None), traj, adv, term, stats)
        x0, t = traj.x0[term.rows], traj.sigmas[term.steps].view(-1, 1, 1)
        eps = rand.train_noise(7, traj.sample_ids[term.rows], term.steps, (5, 4))
        x_t = (1 - t) * x0 + t * eps
        with torch.no_grad():
            v, v_old, v_ref = model(x_t), old_model(x_t), ref(x_t)
        for name, vv in (("nft_positive", 0.5 * v + 0.5 * v_old), ("nft_negative", 1.5 * v_old - 0.5 * v)):
            err = x_t - t * vv - x0
            w = err.abs().mean(dim=(1, 2)).clamp(min=1e-5)
            expected[name].append((err.square().mean(dim=(1, 2)) / w).mean())
        expected["old_deviate"].append((v - v_old).square().mean(dim=(1, 2)).mean())
        expected["kl"].append((v - v_ref).square().mean(dim=(1, 2)).mean())
    means, _ = obj.summarize(stats)
    assert set(means) == {"nft_positive", "nft_negative", "old_deviate", "old_decay"} | ({"kl"} if kl else set())
    for name in means.keys() - {"old_decay"}:
        assert means[name] == pytest.approx(float(torch.stack(expected[name]).mean()), rel=1e-5), name
    steps = 7 * obj.steps_per_iteration  # 12 samples per rank in micro-batches of 2: 6 optimizer steps each
    assert obj.steps_per_iteration == 6 and means["old_decay"] == pytest.approx(min(0.001 * steps, 0.5))
