"""--drop_zero_advantage: Flow-GRPO's train_sd3.py (yifan123/flow_grpo ac4c86e, L796-816) keeps only
the samples with `samples["advantages"].abs().sum(dim=1) != 0` before training, so a sample of a
group whose rewards tie (a binary reward: GenEval, OCR) trains neither its policy term nor its KL
term. Here the samples are masked (every rank keeps its number of optimizer steps), which for the
gradient is the same as leaving them out."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fastvideo.algorithms.base import ObjectiveContext, RewardResult, StatsAccumulator, Term
from fastvideo.component_settings.update import UpdateSettings
from fastvideo.config import GRPOSettings, build_parser, validate_args
from fastvideo.distributed.parallel import ParallelDims
from fastvideo.sampling.mix import MixSettings
from fastvideo.sampling.randomness import RandomSource

BASE = ["--data_json_path", "x", "--pretrained_model_name_or_path", "x", "--rewards", "compressibility:1"]
BETA = 0.04


def _objective(drop: bool):
    from fastvideo.algorithms.grpo import GRPOObjective

    settings = GRPOSettings(use_group=True, adv_std="population", train_last_step=False, timestep_fraction=0.5,
                            clip_range=0.2, adv_clip_max=5.0, loss_coef=1.0, kl_coef=BETA, drop_zero_advantage=drop)
    cfg = SimpleNamespace(grpo=settings, mix=MixSettings(),
                          update=UpdateSettings(train_micro_batch_size=8, gradient_accumulation_steps=1),
                          rollout=SimpleNamespace(num_generations=4, eta=0.5, shift=3.0))
    return GRPOObjective(ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0), device=torch.device("cpu"),
                                          randomness=RandomSource(3), reward=None))


def _upstream_mask(advantages: torch.Tensor, num_steps: int) -> torch.Tensor:
    """train_sd3.py L797 on advantages repeated over the timesteps (L739-741)."""
    per_step = advantages[:, None].repeat(1, num_steps)
    return per_step.abs().sum(dim=1) != 0


def _loss_and_grads(drop: bool, rewards: torch.Tensor):
    obj = _objective(drop)
    adv = obj.advantages(RewardResult(rewards, {}))
    rows = torch.arange(8)
    old = torch.linspace(-1.0, -0.5, 8)
    logp = (old + torch.linspace(-0.1, 0.1, 8)).requires_grad_()
    kl = torch.linspace(0.5, 1.2, 8).requires_grad_()
    obj.log_prob = lambda policy, traj, r, s: (logp[r], kl[r])  # the policy's numbers, fixed
    traj = SimpleNamespace(plan=SimpleNamespace(num_trained=1), rollout_log_prob=lambda r, s: old[r])
    loss = obj.loss(None, traj, adv, Term(0, rows, torch.zeros(8, dtype=torch.long)), StatsAccumulator(torch.device("cpu")))
    loss.backward()
    return adv, loss.detach(), logp.grad, kl.grad


def test_a_tied_group_trains_nothing_not_even_its_kl_term():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])  # group 0 ties (binary reward)
    adv, loss, g_logp, g_kl = _loss_and_grads(True, rewards)
    keep = _upstream_mask(adv, 10)
    assert keep.tolist() == [False] * 4 + [True] * 4
    assert torch.all(g_kl[~keep] == 0) and torch.all(g_logp[~keep] == 0)
    torch.testing.assert_close(g_kl[keep], torch.full((4,), BETA / 8))  # beta * mean over the micro-batch of 8
    # without the flag the tied group's KL term still trains (the item 4), its policy term not
    _, loss_kept, g_logp_kept, g_kl_kept = _loss_and_grads(False, rewards)
    torch.testing.assert_close(g_kl_kept, torch.full((8,), BETA / 8))
    assert torch.all(g_logp_kept[~keep] == 0)
    kl = torch.linspace(0.5, 1.2, 8)
    torch.testing.assert_close(loss_kept - loss, BETA * kl[~keep].sum() / 8)


def test_the_flag_reaches_the_settings_and_old_configs_read_without_it():
    cfg = validate_args(build_parser().parse_args(BASE + ["--use_group", "--drop_zero_advantage"]))
    assert cfg.grpo.drop_zero_advantage is True
    section = cfg.to_dict()["grpo"]
    assert GRPOSettings.flags_from_resolved(section)["drop_zero_advantage"] is True
    old = {k: v for k, v in section.items() if k != "drop_zero_advantage"}
    assert GRPOSettings.flags_from_resolved(old)["drop_zero_advantage"] is False
