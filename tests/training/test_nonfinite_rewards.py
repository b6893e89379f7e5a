"""Non-finite rewards are survived: the sample is dropped from its group, counted, logged naming
the reward; the run stops only after --max_nonfinite_steps consecutive iterations with problems."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from dist_utils import run_distributed

from fastvideo.grpo.advantages import (batch_advantages, finite_batch_advantages, finite_group_advantages,
                                       group_advantages)
from fastvideo.rewards.advantages import group_normalize, mix_advantages
from fastvideo.rewards.combine import MultiReward
from fastvideo.training.update import NonFiniteError, TrainerState, Updater, UpdateStats, iteration_problems

NAN = float("nan")


def test_group_advantages_come_from_the_finite_rewards():
    r = torch.tensor([1.0, 2.0, NAN, 4.0, 0.5, 0.7, 0.1, 0.9, NAN, math.inf, NAN, 1.0])
    adv = finite_group_advantages(r, 4, clip_max=5.0)
    # group 0: the reference over its three finite rewards (torch.std, unbiased)
    kept = torch.tensor([1.0, 2.0, 4.0])
    ref = (kept - kept.mean()) / (kept.std() + 1e-8)
    torch.testing.assert_close(adv[[0, 1, 3]], ref)
    assert adv[2] == 0
    torch.testing.assert_close(adv[4:8], group_advantages(r[4:8], 4, 5.0))  # an intact group: as before
    assert torch.equal(adv[8:], torch.zeros(4))  # one finite reward left: the group is skipped
    # population std (Flow-GRPO's) over the kept ones
    pop = finite_group_advantages(r, 4, clip_max=5.0, unbiased=False)
    torch.testing.assert_close(pop[[0, 1, 3]], (kept - kept.mean()) / (kept.std(unbiased=False) + 1e-8))
    assert finite_group_advantages(r, 4, clip_max=0.5).abs().max() == 0.5  # still clipped


def test_all_finite_is_the_plain_formula_bit_for_bit():
    r = torch.randn(12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(finite_group_advantages(r, 4, 5.0), group_advantages(r, 4, 5.0))
    assert torch.equal(finite_batch_advantages(r, 5.0), batch_advantages(r, 5.0))
    assert torch.equal(group_normalize(r, 4, valid=torch.ones(12, dtype=torch.bool)), group_normalize(r, 4))


def test_batch_advantages_drop_the_nonfinite():
    r = torch.tensor([1.0, NAN, 3.0, 6.0])
    kept = torch.tensor([1.0, 3.0, 6.0])
    adv = finite_batch_advantages(r, 5.0)
    torch.testing.assert_close(adv[[0, 2, 3]], (kept - kept.mean()) / (kept.std() + 1e-8))
    assert adv[1] == 0
    assert torch.equal(finite_batch_advantages(torch.tensor([NAN, 1.0, math.inf]), 5.0), torch.zeros(3))


def test_mix_advantages_drop_a_sample_any_reward_scored_nonfinite():
    raw = {"a": torch.tensor([1.0, 2.0, 3.0, 5.0]), "b": torch.tensor([0.0, NAN, 1.0, 4.0])}
    w = {"a": 1.0, "b": 0.5}
    adv = mix_advantages(raw, w, 4, "advantage_aggr")
    keep = [0, 2, 3]
    ref = sum(w[n] * group_normalize(raw[n][keep], 3) for n in raw)
    torch.testing.assert_close(adv[keep], ref)
    assert adv[1] == 0
    merged = mix_advantages(raw, w, 4, "reward_aggr")
    torch.testing.assert_close(merged[keep], group_normalize(raw["a"][keep] + 0.5 * raw["b"][keep], 3))


class Scores:
    def __init__(self, values):
        self.values = torch.tensor(values)

    def __call__(self, images, prompts):
        return self.values


def test_multi_reward_drops_and_names_the_reward(capsys):
    good, bad = Scores([1.0, 2.0, 3.0, 4.0]), Scores([0.5, NAN, 0.1, 0.3])
    reward = MultiReward([("good", 1.0, good), ("flaky", 2.0, bad)], normalize=True, num_generations=2)
    out = reward(torch.zeros(4, 3, 2, 2), ["a"] * 4)
    assert torch.isnan(out.total[1]) and torch.isfinite(out.total[[0, 2, 3]]).all()
    assert out.total[0] == 0  # group 0 keeps one sample: skipped
    torch.testing.assert_close(out.total[2:], group_normalize(good.values[2:], 2) + 2 * group_normalize(bad.values[2:], 2))
    err = capsys.readouterr().err
    assert "reward 'flaky' returned non-finite scores [nan] for 1 of 4 samples (indices [1])" in err
    assert "'good'" not in err
    plain = MultiReward([("good", 1.0, good)])(torch.zeros(4, 3, 2, 2), ["a"] * 4)
    assert torch.equal(plain.total, good.values) and capsys.readouterr().err == ""


def _updater(limit: int) -> Updater:
    return Updater(None, None, None, SimpleNamespace(max_nonfinite_steps=limit, max_grad_norm=1.0), 1, None,
                   torch.device("cpu"), TrainerState())


def _stats(skipped=0, causes=()):
    return UpdateStats(loss=0.0, grad_norm=0.0, optimizer_steps=3 - skipped, skipped_steps=skipped,
                       forward_passes=3, nonfinite=list(causes))


def test_iterations_with_problems_are_counted_and_reset():
    up = _updater(limit=2)
    nan_reward = {"rewards/nonfinite_dropped": 1, "rewards/nonfinite/flaky": 1}
    problems = iteration_problems(nan_reward, _stats())
    assert problems == ["reward 'flaky' scored 1 sample(s) non-finite (dropped from their groups)"]
    up.end_iteration(1, problems)
    assert up.state.consecutive_nonfinite == 1
    up.end_iteration(2, iteration_problems({"rewards/nonfinite_dropped": 0}, _stats()))
    assert up.state.consecutive_nonfinite == 0  # a clean iteration resets
    up.end_iteration(3, problems)
    with pytest.raises(NonFiniteError, match=r"2 iterations in a row .*reward 'flaky'.*fix it or drop it") as e:
        up.end_iteration(4, problems)
    assert "learning_rate" not in str(e.value)
    loss = iteration_problems({}, _stats(skipped=1, causes=["loss"]))
    assert loss == ["non-finite loss in 1 of 3 optimizer step(s) (skipped)"]
    with pytest.raises(NonFiniteError, match=r"non-finite loss in 1 of 3.*Lower --learning_rate"):
        _updater(limit=1).end_iteration(1, loss)


def test_reward_metrics_count_the_dropped():
    from fastvideo.algorithms.base import RewardResult
    from fastvideo.training.metrics import reward_metrics

    dims = SimpleNamespace(gather_dp=lambda t: t)
    cfg = SimpleNamespace(rollout=SimpleNamespace(num_generations=2), grpo=SimpleNamespace(use_group=True))
    raw = torch.tensor([1.0, NAN, 3.0, 5.0])
    rec = reward_metrics(dims, "cpu", RewardResult(raw.clone(), {"flaky": raw}), torch.zeros(4), cfg)
    assert rec["rewards/nonfinite_dropped"] == 1 and rec["rewards/nonfinite/flaky"] == 1
    assert rec["reward_mean"] == pytest.approx(3.0) and rec["reward/flaky_mean"] == pytest.approx(3.0)
    clean = reward_metrics(dims, "cpu", RewardResult(raw[[0, 2]], {"r": raw[[0, 2]]}), torch.zeros(2), cfg)
    assert clean["rewards/nonfinite_dropped"] == 0 and "rewards/nonfinite/r" not in clean


class NanOnce:
    """Wraps a reward: its first call on rank 1 scores sample 1 NaN (one sample in the whole run)."""

    def __init__(self, reward, rank):
        self.reward, self.rank, self.calls = reward, rank, 0

    def __call__(self, images, prompts):
        scores = self.reward(images, prompts).clone()
        self.calls += 1
        if self.rank == 1 and self.calls == 1:
            scores[1] = NAN
        return scores


def _train_with_one_nan(info, argv):
    from fastvideo.config import parse_config
    from fastvideo.train_grpo_flux import build_trainer

    trainer = build_trainer(parse_config(argv), info)
    name, weight, reward = trainer.reward.components[0]
    trainer.reward.components[0] = (name, weight, NanOnce(reward, info.rank))
    records = trainer.train()
    keep = ("rewards/nonfinite_dropped", "optimizer_steps", "skipped_steps", "loss", "reward_mean")
    return [{k: r.get(k) for k in keep} for r in records], trainer.state.consecutive_nonfinite


@pytest.mark.slow
def test_one_nan_reward_in_a_two_rank_run_is_survived(tiny_flux_dir, tiny_embeddings, tmp_path):
    """3 optimizer steps per iteration (3 samples a rank, micro-batches of 1): the old count of
    non-finite optimizer steps reached the default --max_nonfinite_steps 3 in the NaN's own
    iteration; now the sample is dropped and the run finishes."""
    from helpers import read_metrics, train_args

    out = tmp_path / "nan"
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, num_generations=3, rollout_batch_size=3,
                      train_micro_batch_size=1, max_train_steps=2, checkpointing_steps=100, save_images_every=0,
                      fsdp_sharding_strategy="none")
    (rows, counter), _ = run_distributed(_train_with_one_nan, argv)
    assert [r["rewards/nonfinite_dropped"] for r in rows] == [1, 0]
    assert [r["optimizer_steps"] for r in rows] == [3, 3] and [r["skipped_steps"] for r in rows] == [0, 0]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["reward_mean"]) for r in rows)
    assert counter == 0  # iteration 2 was clean
    logged = read_metrics(out)
    assert [r["rewards/nonfinite_dropped"] for r in logged] == [1, 0]
    assert logged[0]["rewards/nonfinite/compressibility"] == 1
