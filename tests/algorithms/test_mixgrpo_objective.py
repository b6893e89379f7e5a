"""MixGRPO's objective flags with upstream's meaning (Tencent-Hunyuan/MixGRPO train_grpo_flux.py
train_one_step and fastvideo/models/reward_model/utils.py balance_pos_neg): --kl_coeff,
--trimmed_ratio, --advantage_rerange_strategy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastvideo.algorithms.base import ObjectiveContext, RewardResult, StatsAccumulator, Term
from fastvideo.component_settings.update import UpdateSettings
from fastvideo.config import ConfigError, GRPOSettings, build_parser, validate_args
from fastvideo.distributed.parallel import ParallelDims
from fastvideo.sampling.mix import MixSettings
from fastvideo.sampling.randomness import RandomSource

BASE = ["--data_json_path", "x", "--pretrained_model_name_or_path", "x", "--rewards", "compressibility:1"]


def _objective(G=4, reward=None, **grpo):
    from fastvideo.algorithms.grpo import GRPOObjective

    fields = dict(use_group=True, adv_std="sample", train_last_step=False, timestep_fraction=0.5, clip_range=0.2,
                  adv_clip_max=5.0, loss_coef=1.0)
    cfg = SimpleNamespace(grpo=GRPOSettings(**{**fields, **grpo}), mix=MixSettings(),
                          update=UpdateSettings(train_micro_batch_size=1, gradient_accumulation_steps=2),
                          rollout=SimpleNamespace(num_generations=G, eta=0.5, shift=3.0))
    return GRPOObjective(ObjectiveContext(cfg=cfg, dims=ParallelDims.build(1, 0), device=torch.device("cpu"),
                                          randomness=RandomSource(3), reward=reward))


def _upstream_trimmed(rewards, G, ratio):
    """MixGRPO's loop, written out: sort, drop the lowest int(G * ratio) (at most G - 1), mean / std."""
    out = torch.zeros_like(rewards)
    for i in range(len(rewards) // G):
        group = rewards[i * G:(i + 1) * G]
        kept = torch.sort(group)[0][min(int(G * ratio), G - 1):]
        out[i * G:(i + 1) * G] = (group - kept.mean()) / (kept.std() + 1e-8)
    return out


def test_trimmed_ratio_is_mixgrpos_trimming():
    rewards = torch.tensor([0.1, 0.9, 0.4, -2.0, 0.3, 0.31, 0.2, 0.5])
    obj = _objective(trimmed_ratio=0.3)
    adv = obj.advantages(RewardResult(rewards, {}))
    torch.testing.assert_close(adv, _upstream_trimmed(rewards, 4, 0.3).clamp(-5, 5))
    plain = _objective().advantages(RewardResult(rewards, {}))
    assert (adv - plain).abs().max() > 0.1  # the outlier -2.0 no longer sets the scale


def test_trimmed_ratio_applies_to_each_reward_of_a_mix():
    from fastvideo.rewards.advantages import mix_advantages

    raw = {"a": torch.tensor([0.1, 0.9, 0.4, -2.0]), "b": torch.tensor([3.0, 1.0, 2.0, 2.5])}
    w = {"a": 0.5, "b": 0.5}
    ours = mix_advantages(raw, w, 4, "advantage_aggr", trim_ratio=0.25)
    theirs = 0.5 * _upstream_trimmed(raw["a"], 4, 0.25) + 0.5 * _upstream_trimmed(raw["b"], 4, 0.25)
    torch.testing.assert_close(ours, theirs)
    merged = 0.5 * raw["a"] + 0.5 * raw["b"]
    torch.testing.assert_close(mix_advantages(raw, w, 4, "reward_aggr", 0.25), _upstream_trimmed(merged, 4, 0.25))


def test_kl_coeff_adds_mixgrpos_kl_term_with_the_policy_terms_scale():
    obj = _objective(rollout_kl_coef=0.01)
    off = _objective()
    logp, old = torch.tensor([1.0, -0.5]), torch.tensor([0.8, -0.1])
    stored = old[:, None].repeat(1, 4)  # the rollout's log-probabilities [B, steps]
    traj = SimpleNamespace(plan=SimpleNamespace(num_trained=3),
                           rollout_log_prob=lambda rows, steps: stored[rows, steps])
    for o in (obj, off):
        o.log_prob = lambda policy, traj, rows, steps: (logp, None)
    term = Term(0, torch.tensor([0, 1]), torch.tensor([0, 0]))
    adv = torch.tensor([0.3, -0.7])
    stats = StatsAccumulator(torch.device("cpu"))
    extra = obj.loss(None, traj, adv, term, stats) - off.loss(None, traj, adv, term, StatsAccumulator(torch.device("cpu")))
    kl = 0.5 * ((logp - old) ** 2).mean()
    # upstream: kl_coeff * kl_loss / (GA * T), here also x rows / micro-batch size (2 / 1)
    torch.testing.assert_close(extra, 0.01 * kl / (2 * 3) * 2)
    assert obj.summarize(stats)[0]["rollout_kl"] == pytest.approx(float(kl))


def _traj(n):
    from fastvideo.sampling.plan import full_sde_plan

    return SimpleNamespace(plan=full_sde_plan(6, 3.0, 5, 2), num_samples=n, sample_ids=torch.arange(10, 10 + n),
                           num_steps=6)


def test_rerange_random_shuffles_the_samples_seeded():
    obj = _objective(advantage_rerange="random")
    rows = [m[0].rows.item() for m in obj.plan_update(_traj(8), iteration=2)]
    assert sorted(rows) == list(range(8)) and rows != list(range(8))
    assert rows == [m[0].rows.item() for m in obj.plan_update(_traj(8), iteration=2)]
    assert rows != [m[0].rows.item() for m in obj.plan_update(_traj(8), iteration=3)]


def test_rerange_balance_alternates_signs_and_drops_zero_advantages():
    obj = _objective(advantage_rerange="balance")
    rewards = torch.tensor([1.0, 2.0, 3.0, 10.0, 5.0, 5.0, 5.0, 5.0])  # one group of 4 with one high outlier
    adv = obj.advantages(RewardResult(rewards, {}))  # group 2: all zero
    rows = [m[0].rows.item() for m in obj.plan_update(_traj(8), iteration=1)]
    signs = [int(torch.sign(adv[r])) for r in rows]
    assert sorted(rows) == [0, 1, 2, 3]  # the zero advantages are left out
    # 1 positive, 3 negatives: the smaller set leads, pairs alternate, the larger's rest follows
    assert signs == [1, -1, -1, -1] and rows[0] == 3
    # equal counts: the negatives lead (MixGRPO's `num_positive < num_negative` is false)
    obj.advantages(RewardResult(torch.tensor([1.0, 2.0, 3.0, 4.0, 4.0, 3.0, 2.0, 1.0]), {}))
    rows = [m[0].rows.item() for m in obj.plan_update(_traj(8), iteration=1)]
    adv = obj._last_advantages
    assert [int(torch.sign(adv[r])) for r in rows] == [-1, 1] * 4 and sorted(rows) == list(range(8))


@pytest.mark.parametrize("flags, match", [
    (["--advantage_rerange_strategy", "random"], "--training_strategy part"),
    (["--trimmed_ratio", "0.2"], "needs --use_group"),
    (["--trimmed_ratio", "1.0", "--use_group"], r"\[0, 1\)"),
    (["--kl_coeff", "-1"], "must be >= 0"),
])
def test_mixgrpo_objective_flag_errors(flags, match):
    with pytest.raises(ConfigError, match=match):
        validate_args(build_parser().parse_args(BASE + flags))


def test_flags_reach_the_settings():
    cfg = validate_args(build_parser().parse_args(BASE + [
        "--use_group", "--training_strategy", "part", "--advantage_rerange_strategy", "balance",
        "--kl_coeff", "0.01", "--trimmed_ratio", "0.25"]))
    g = cfg.grpo
    assert (g.advantage_rerange, g.rollout_kl_coef, g.trimmed_ratio) == ("balance", 0.01, 0.25)
    with pytest.raises(ConfigError, match="leaves 1 of the 2"):
        _objective(G=2, trimmed_ratio=0.5)


def test_a_sample_dropped_for_a_nonfinite_reward_has_no_kl_terms():
    """A sample any reward scored non-finite gets advantage 0 (no policy term) and no KL term
    either: neither --kl_coef's (to the reference) nor MixGRPO's --kl_coeff (to the rollout)."""
    logp, old, kl = torch.tensor([1.0, -0.5]), torch.tensor([0.8, -0.1]), torch.tensor([0.2, 0.7])
    stored = old[:, None].repeat(1, 4)  # the rollout's log-probabilities [B, steps]
    traj = SimpleNamespace(plan=SimpleNamespace(num_trained=3),
                           rollout_log_prob=lambda rows, steps: stored[rows, steps])
    term = Term(0, torch.tensor([0, 1]), torch.tensor([0, 0]))

    def kl_part(rewards):
        """loss with both KL coefficients minus the loss without; and the logged KL means."""
        out = []
        for coefs in ({"kl_coef": 0.1, "rollout_kl_coef": 0.01}, {}):
            obj = _objective(**coefs)
            obj.log_prob = lambda policy, traj, rows, steps, o=obj: (logp, kl if o.g.kl_coef > 0 else None)
            stats = StatsAccumulator(torch.device("cpu"))
            out.append((obj.loss(None, traj, obj.advantages(RewardResult(rewards, {})), term, stats),
                        obj.summarize(stats)[0]))
        return out[0][0] - out[1][0], out[0][1]

    scale = 1 / (2 * 3) * 2  # 1 / (GA * T) x rows / micro-batch size
    extra, logged = kl_part(torch.tensor([1.0, float("nan"), 2.0, 3.0]))
    kept_kl, kept_rollout = kl[0] / 2, 0.5 * (logp[0] - old[0]) ** 2 / 2  # row 1's terms are 0
    torch.testing.assert_close(extra, (0.1 * kept_kl + 0.01 * kept_rollout) * scale)
    assert logged["kl"] == pytest.approx(float(kept_kl)) and logged["rollout_kl"] == pytest.approx(float(kept_rollout))
    extra, _ = kl_part(torch.tensor([1.0, 5.0, 2.0, 3.0]))  # all finite: every row's terms
    torch.testing.assert_close(extra, (0.1 * kl.mean() + 0.01 * 0.5 * ((logp - old) ** 2).mean()) * scale)
