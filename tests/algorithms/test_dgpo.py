"""DGPO (--algorithm dgpo): the group-preference loss and its gradients against Flow-Factory's own
code, re-expressed below from X-GenGroup/Flow-Factory at a0b2bc5a2b4fbf9125429b3fb70c0c5d7631047c
(src/flow_factory/trainers/dgpo.py: DGPOTrainer._compute_per_sample_preference L448-468,
_compute_group_dgpo_loss L490-529 on one process, _compute_dsm_loss L633-640, _maybe_clip_dsm
L642-671), in float64; the objective's loss of a term; its plan and flags."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fastvideo.algorithms.dgpo.loss import dgpo_loss
from fastvideo.config import build_parser, validate_args
from fastvideo.errors import ConfigError


def ff_dsm(target_v, pred_v):
    batch_size = target_v.shape[0]
    return (target_v - pred_v).square().reshape(batch_size, -1).mean(dim=1)


def ff_group_dgpo_loss(ref_v, target_v, advantages, local_group_indices, num_groups, dsm_loss, dpo_beta, group_size):
    """_compute_per_sample_preference + _compute_group_dgpo_loss (one process: the reduce is a detach)."""
    batch_size = ref_v.shape[0]
    with torch.no_grad():
        ref_dsm = (target_v - ref_v).square().reshape(batch_size, -1).mean(dim=1)
    delta = dsm_loss.detach() - ref_dsm
    per_sample = advantages * dpo_beta * delta / group_size
    local_sums = torch.zeros(num_groups, dtype=per_sample.dtype)
    local_sums.scatter_add_(0, local_group_indices, per_sample)
    global_sums = local_sums.detach()
    group_weights = torch.sigmoid(global_sums)[local_group_indices].detach()
    return (group_weights * advantages * dsm_loss).mean()


def ff_maybe_clip_dsm(dsm_loss, old_v, target_v, adv, clip_range):
    batch_size = old_v.shape[0]
    old_dsm = (target_v - old_v).square().reshape(batch_size, -1).mean(dim=1)
    ratio = torch.exp(-dsm_loss.detach() + old_dsm)
    should_clip = torch.where(adv > 0, ratio > 1.0 + clip_range[1], ratio < 1.0 + clip_range[0])
    return should_clip, torch.where(should_clip, dsm_loss.detach(), dsm_loss)


def ff_dgpo(v, v_ref, v_old, target, adv, group, num_groups, beta, group_size, clip):
    dsm = ff_dsm(target, v)
    if v_old is not None:
        _, dsm = ff_maybe_clip_dsm(dsm, v_old, target, adv, (-clip, clip))
    return ff_group_dgpo_loss(v_ref, target, adv, group, num_groups, dsm, beta, group_size)


def _tensors(seed=0):
    """Two groups of 3, float64; the old policy near the current one, so some ratios leave the range."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(6, 5, 3, generator=g, dtype=torch.float64)
    v_ref = target + 0.5 * torch.randn(6, 5, 3, generator=g, dtype=torch.float64)
    v_old = target + 0.5 * torch.randn(6, 5, 3, generator=g, dtype=torch.float64)
    v = (v_old + 0.05 * torch.randn(6, 5, 3, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.2, -0.4, -0.8, 0.9, 0.3, -1.2], dtype=torch.float64)
    return v, v_ref, v_old, target, adv, torch.tensor([0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize("beta", [0.5, 10.0])
@pytest.mark.parametrize("clip", [None, 1e-3])
def test_loss_and_gradient_equal_flow_factorys(beta, clip):
    v, v_ref, v_old, target, adv, group = _tensors()
    old = None if clip is None else v_old
    ours, stats = dgpo_loss(v, v_ref, old, target, adv, group, 2, beta, 3, clip or 0.0)
    (g_ours,) = torch.autograd.grad(ours, v)
    v2 = v.detach().clone().requires_grad_(True)
    ff = ff_dgpo(v2, v_ref, old, target, adv, group, 2, beta, 3, clip)
    (g_ff,) = torch.autograd.grad(ff, v2)
    torch.testing.assert_close(ours, ff, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(g_ours, g_ff, rtol=1e-12, atol=1e-15)
    assert float(g_ours.abs().max()) > 1e-4
    # the weights are not one constant (s_G differs by group) and the clip is exercised
    assert 0 < float(stats["dgpo_weight"]) < 1
    if clip:
        assert 0 < float(stats["clip_fraction"]) < 1


BASE = ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility",
        "--use_group", "--algorithm", "dgpo", "--num_generations", "2", "--train_micro_batch_size", "4"]


def _cfg(extra=()):
    argv = BASE + list(extra)
    return validate_args(build_parser(argv).parse_args(argv))


def test_dgpo_flags_and_needs():
    cfg = _cfg(["--dgpo_beta", "10"])
    assert cfg.plugins["dgpo"].beta == 10 and cfg.plugins["dgpo"].clip_dsm
    needs = cfg.objective_needs()
    assert not needs.log_probs and not needs.replay and needs.old_policy and needs.reference
    with pytest.raises(ConfigError, match="multiple of --num_generations 2"):
        _cfg(["--train_micro_batch_size", "3"])
    with pytest.raises(ConfigError, match="samples every step with the Euler ODE"):
        _cfg(["--flow_grpo_sampling"])


def test_objective_loss_equals_flow_factorys_on_shared_noise_and_timesteps():
    """DGPOObjective.loss of one term on a linear model: every row at the iteration's one timestep,
    each group's rows on one noise, and Flow-Factory's loss of those tensors (old policy: the
    objective's weight copy, moved off the current weights), scaled by GA x T."""
    from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator
    from fastvideo.algorithms.dgpo.objective import DGPOObjective
    from fastvideo.algorithms.nft import deterministic_plan
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.training.ema import WeightCopy
    from test_nft import _Policy  # a policy over a linear velocity model

    torch.manual_seed(0)
    model, ref = nn.Linear(4, 4), nn.Linear(4, 4)
    cfg = _cfg(["--timestep_fraction", "0.5", "--gradient_accumulation_steps", "2", "--dgpo_beta", "3",
                "--clip_range", "0.01"])
    rand = RandomSource(11)
    obj = DGPOObjective(ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0, "full"), device=torch.device("cpu"),
                                         settings=cfg.plugins["dgpo"], randomness=rand,
                                         copy_weights=lambda: WeightCopy(model)))
    with torch.no_grad():
        for s in obj.old.shadow:
            s.add_(0.05 * torch.randn_like(s))
    old_model = nn.Linear(4, 4)
    old_model.load_state_dict({"weight": obj.old.shadow[0], "bias": obj.old.shadow[1]})
    plan = deterministic_plan("ode", 6, 3.0)
    g = torch.Generator().manual_seed(3)
    traj = SimpleNamespace(x0=torch.randn(4, 5, 4, generator=g), sigmas=plan.sigmas, plan=plan, num_samples=4,
                           sample_ids=torch.arange(100, 104), group_ids=torch.tensor([7, 7, 9, 9]))
    adv = torch.tensor([1.0, -1.0, -0.7, 0.7])
    micro = obj.plan_update(traj, iteration=5)
    assert len(micro) == 1 and len(micro[0]) == 3 and all(len(set(t.steps.tolist())) == 1 for t in micro[0])
    term = micro[0][1]
    loss = obj.loss(_Policy(model, ref), traj, adv, term, StatsAccumulator(torch.device("cpu")))
    grads = torch.autograd.grad(loss, list(model.parameters()))

    t = traj.sigmas[term.steps].view(-1, 1, 1)
    eps = rand.train_noise(5, traj.group_ids, [0] * 4, (5, 4))
    assert torch.equal(eps[0], eps[1]) and not torch.equal(eps[1], eps[2])  # shared within a group
    x_t = (1 - t) * traj.x0 + t * eps
    twin = nn.Linear(4, 4)
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():
        v_ref, v_old = ref(x_t), old_model(x_t)
    expected = ff_dgpo(twin(x_t), v_ref, v_old, eps - traj.x0, adv, torch.tensor([0, 0, 1, 1]), 2, 3.0, 2, 0.01)
    expected = expected / (2 * 3)  # GA 2 x T 3 (int(6 * 0.5))
    ref_grads = torch.autograd.grad(expected, list(twin.parameters()))
    assert abs(float(loss.detach()) - float(expected.detach())) <= 1e-6 * max(1.0, abs(float(expected.detach())))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert float(grads[0].abs().max()) > 1e-5
    assert torch.equal(model.weight, twin.weight)  # the old policy's swap left the current weights


def test_the_sampling_ema_updates_every_interval_as_flow_factorys():
    """--use_ema --ema_decay 0.9 --ema_update_interval 8 (Flow-Factory's DGPO recipe, examples/dgpo/lora/sd3_5:
    ema_decay 0.9, ema_decay_schedule constant, ema_update_interval 8): Trainer._update_ema after each of 20
    iterations leaves the EMA equal to EMAModuleWrapper.step(step=epoch) after each epoch (test_awm's
    re-expression of ema/ema.py at a0b2bc5), updated after iterations 8 and 16 only."""
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.training.ema import EMA
    from fastvideo.training.trainer import Trainer
    from test_awm import ff_ema_step

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    cfg = _cfg(["--use_ema", "--ema_decay", "0.9", "--ema_update_interval", "8"])
    host = SimpleNamespace(ema=EMA(model, decay=cfg.optim.ema_decay, warmup=cfg.optim.ema_warmup), cfg=cfg,
                           dims=ParallelDims.build(1, 0, "full"), model=model)
    theirs = [p.detach().clone() for p in model.parameters()]
    g = torch.Generator().manual_seed(1)
    for iteration in range(1, 21):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        Trainer._update_ema(host, iteration)
        ff_ema_step(theirs, list(model.parameters()), iteration - 1, 8, lambda step: 0.9)
    for ours, ff in zip(host.ema.shadow, theirs):
        torch.testing.assert_close(ours, ff, rtol=1e-6, atol=1e-7)
    assert host.ema.num_updates == 2
    with pytest.raises(ConfigError, match="ema_update_interval"):
        _cfg(["--use_ema", "--ema_update_interval", "0"])
    assert any("--ema_update_interval: no effect without --use_ema" in n
               for n in _cfg(["--ema_update_interval", "8"]).compat_notes)
