"""Window placement (MixGRPO's progressive / decay / random strategies), plans, and the flags."""

from __future__ import annotations


import pytest
import torch

from fastvideo.config import ConfigError, build_parser, validate_args
from fastvideo.sampling import mix, sde
from fastvideo.sampling.plan import ODE, SDE, compressed_tail_sigmas, window_plan
from fastvideo.sampling.randomness import RandomSource
from upstream_facts import MIX_ITERS, MIX_STRATEGIES, load_facts


def _settings(*flags, steps=25):
    args = build_parser().parse_args(["--data_json_path", "x", "--pretrained_model_name_or_path", "x",
                                      "--rewards", "compressibility:1", "--sampling_steps", str(steps), *flags])
    return validate_args(args)


MIXGRPO = ("--training_strategy", "part", "--group_size", "4", "--iters_per_group", "25", "--sample_strategy",
           "progressive", "--prog_overlap", "--prog_overlap_step", "1", "--roll_back")


def test_progressive_window_of_mixgrpo_script():
    """25 steps, W=4, move by 1 every 25 iterations (MixGRPO's launch script): iteration i starts at
    (i - 1) // 25; candidates 0..23, so the last start is 23 and start 24 rolls back to 0."""
    s = _settings(*MIXGRPO).mix
    assert s.mode == "window" and s.window_size == 4 and s.move_step == 1
    starts = [mix.scheduled_start(s, i, 23) for i in (1, 25, 26, 50, 51, 300, 576, 600, 601)]
    assert starts == [0, 0, 1, 1, 2, 11, 23, 23, 0]
    # without --prog_overlap the window moves by its size; without --roll_back it stays at the end
    s2 = _settings("--training_strategy", "part", "--group_size", "4", "--iters_per_group", "2").mix
    assert [mix.scheduled_start(s2, i, 23) for i in (1, 2, 3, 5, 13, 100)] == [0, 0, 4, 8, 23, 23]


@pytest.mark.parametrize("strategy", MIX_STRATEGIES)
def test_window_start_matches_upstream_state_machine(strategy):
    """Upstream's GRPOTrainingStates (MixGRPO e5cdd6a fastvideo/utils/grpo_states.py) stepped iteration by
    iteration; its cur_timestep sequence is kept in tests/fixtures/upstream_facts.json."""
    steps = 16
    theirs = load_facts()["mixgrpo_window_starts"][strategy]
    s = _settings("--training_strategy", "part", "--group_size", "4", "--iters_per_group", "3", "--sample_strategy",
                  strategy, "--prog_overlap", "--prog_overlap_step", "2", "--max_iters_per_group", "5",
                  "--min_iters_per_group", "1", "--roll_back", steps=steps).mix
    assert len(theirs) == MIX_ITERS - 1 and len(set(theirs)) > 3  # the window moves
    assert [mix.scheduled_start(s, it, steps - 2) for it in range(1, MIX_ITERS)] == theirs


def test_random_start_is_seeded_per_iteration_and_in_range():
    """Flow-GRPO-Fast: the start is uniform in LO .. HI-k of --sde_window_range (default Flow-GRPO's (0, 5))."""
    s = _settings("--sde_steps", "2", "--sde_start", "random", steps=10).mix
    assert s.window_range == (0, 5)
    a = [mix.window_start(s, i, 9, RandomSource(3)) for i in range(1, 80)]
    assert a == [mix.window_start(s, i, 9, RandomSource(3)) for i in range(1, 80)]
    assert a != [mix.window_start(s, i, 9, RandomSource(4)) for i in range(1, 80)]
    assert set(a) == {0, 1, 2, 3}  # the window [start, start + 2) stays inside transitions 0..4
    plan = mix.plan_for_iteration(s, 10, 3.0, 9, 5, 7, RandomSource(3))
    assert plan.kinds.count(SDE) == 2 and plan.trainable == (a[6], a[6] + 1) and plan.num_trained == 2
    wide = _settings("--sde_steps", "2", "--sde_window_range", "0,9", steps=10).mix
    assert {mix.window_start(wide, i, 9, RandomSource(3)) for i in range(1, 120)} == set(range(0, 8))
    inner = _settings("--sde_steps", "2", "--sde_window_range", "2,6", steps=10).mix
    assert {mix.window_start(inner, i, 9, RandomSource(3)) for i in range(1, 80)} == {2, 3, 4}
    # HI past the trainable transitions is clipped to them (8 steps: candidates 0..6)
    assert _settings("--sde_steps", "2", "--sde_window_range", "1,30", steps=8).mix.window_range == (1, 7)


def test_a_mixgrpo_window_ending_exactly_at_the_last_trainable_step():
    """Issue #39 test 23: 25 steps (trainable transitions 0..23), W=4 moving by 4 every iteration: the
    sixth window, 20..23, ends exactly at the last trainable transition and is whole (SDE and trained,
    the last transition 24 an Euler step); the next start, 24, is past it: rolled back to 0, or held at
    23 (a one-step window, never empty)."""
    flags = ("--training_strategy", "part", "--group_size", "4", "--iters_per_group", "1")
    rolled, held = _settings(*flags, "--roll_back").mix, _settings(*flags).mix
    assert [mix.scheduled_start(rolled, i, 23) for i in range(1, 9)] == [0, 4, 8, 12, 16, 20, 0, 4]
    assert [mix.scheduled_start(held, i, 23) for i in range(5, 9)] == [16, 20, 23, 23]
    # a start landing exactly on the last trainable transition is used before the roll-back
    jump = _settings(*flags, "--prog_overlap", "--prog_overlap_step", "23", "--roll_back").mix
    assert [mix.scheduled_start(jump, i, 23) for i in range(1, 6)] == [0, 23, 0, 23, 0]
    plan = mix.plan_for_iteration(rolled, 25, 3.0, 24, 4, 6)
    assert plan.trainable == (20, 21, 22, 23) and plan.num_trained == 4
    assert plan.kinds == (ODE,) * 20 + (SDE,) * 4 + (ODE,)
    last = mix.plan_for_iteration(held, 25, 3.0, 24, 4, 7)
    assert last.trainable == (23,) and last.kinds == (ODE,) * 23 + (SDE, ODE)


@pytest.mark.parametrize("text, steps, start", [("0,2", 10, 0), ("3,5", 10, 3), ("5,30", 8, 5)])
def test_an_sde_window_range_exactly_as_wide_as_the_window(text, steps, start):
    """Issue #39 test 23: --sde_window_range exactly --sde_steps wide (HI clipped to the trainable
    transitions in the last case: 8 steps, 0..6) is accepted and leaves one start, drawn every time;
    one narrower is refused."""
    s = _settings("--sde_steps", "2", "--sde_window_range", text, steps=steps).mix
    lo, hi = s.window_range
    assert hi - lo == 2 and lo == start
    assert {mix.window_start(s, i, steps - 1, RandomSource(3)) for i in range(1, 40)} == {start}
    plan = mix.plan_for_iteration(s, steps, 3.0, steps - 1, 2, 5, RandomSource(3))
    assert plan.trainable == (start, start + 1) and plan.kinds[start:start + 2] == (SDE, SDE)
    with pytest.raises(ConfigError, match="LO \\+ --sde_steps"):
        _settings("--sde_steps", "2", "--sde_window_range", f"{lo},{hi - 1}", steps=steps)


@pytest.mark.parametrize("value, match", [("0,1", "LO \\+ --sde_steps"), ("3", "two integers"), ("--sde_window_range=-1,4", "0 <= LO")])
def test_bad_sde_window_range_fails_clearly(value, match):
    flag = [value] if value.startswith("--") else ["--sde_window_range", value]
    with pytest.raises(ConfigError, match=match):
        _settings("--sde_steps", "2", *flag, steps=10)


def test_mixgrpo_random_strategy_starts_at_zero_then_draws_up_to_n_minus_2_minus_w():
    """MixGRPO's GRPOTrainingStates: cur_timestep 0 for the first iteration, then
    rng.integers(0, max_timesteps - group_size + 1) with max_timesteps = N - 2: 0 .. N-2-W."""
    steps, w = 16, 4
    s = _settings("--training_strategy", "part", "--group_size", str(w), "--sample_strategy", "random",
                  steps=steps).mix
    starts = [mix.window_start(s, i, steps - 1, RandomSource(5)) for i in range(1, 400)]
    assert starts[0] == 0
    assert set(starts[1:]) == set(range(0, steps - 2 - w + 1))


def test_mixgrpo_random_range_is_upstreams():
    """The starts upstream's random strategy reaches over 400 seeds (tests/fixtures/upstream_facts.json)."""
    theirs = set(load_facts()["mixgrpo_window_starts"]["random_reached"])
    s = _settings("--training_strategy", "part", "--group_size", "4", "--sample_strategy", "random", steps=16).mix
    assert {mix.window_start(s, i, 15, RandomSource(5)) for i in range(1, 400)} == theirs


def test_full_plan_is_dancegrpo():
    cfg = _settings(steps=16)
    plan = mix.plan_for_iteration(cfg.mix, 16, 3.0, 15, 9, 1)
    assert plan.kinds == (SDE,) * 16 and plan.trainable == tuple(range(15)) and plan.num_trained == 9
    assert torch.equal(plan.sigmas, sde.sigma_schedule(16, 3.0))
    perms = torch.stack([torch.randperm(15) for _ in range(3)])
    assert torch.equal(plan.select_steps(perms), perms[:, :9])
    frozen = _settings("--frozen_init_timesteps", "3", steps=16)
    assert mix.plan_for_iteration(frozen.mix, 16, 3.0, 15, 9, 1).num_trained == 3


def test_window_plan_euler_and_flash_tail():
    plan = window_plan(25, 3.0, 2, 4, candidates=24)
    assert plan.describe() == "OO" + "SSSS" + "O" * 19 and plan.trainable == (2, 3, 4, 5) and plan.num_trained == 4
    flash = window_plan(25, 3.0, 0, 4, candidates=24, dpm_post_ratio=0.4)
    # MixGRPO: last SDE index 3, int((25 - 3) * 0.4) = 8 points -> 7 DPM transitions
    assert flash.describe() == "SSSS" + "D" * 7
    full = sde.sigma_schedule(25, 3.0)
    assert torch.equal(flash.sigmas[:5], full[:5]) and flash.sigmas[-1] == 0
    t = torch.linspace(1, 0, 26)[4].item()
    ref = torch.linspace(t, 0, 8)
    torch.testing.assert_close(flash.sigmas[4:], 3 * ref / (1 + 2 * ref), rtol=0, atol=1e-7)
    assert compressed_tail_sigmas(25, 3.0, 25, 0.4).tolist() == [0.0]  # window at the very end: no tail
    # the window is clipped to the candidates and never empty
    end = window_plan(16, 3.0, 14, 4, candidates=15)
    assert end.trainable == (14,) and end.kinds[15] == ODE
    with pytest.raises(ValueError, match="window start"):
        window_plan(16, 3.0, 15, 4, candidates=15)


@pytest.mark.parametrize("flags, match", [
    (("--dpm_algorithm_type", "dpmsolver++"), "needs\n?.*--training_strategy part"),
    (("--dpm_algorithm_type", "dpmsolver"), "needs\n?.*--training_strategy part"),
    (("--dpm_algorithm_type", "dpmsolver++", "--dpm_apply_strategy", "all", "--flow_grpo_sampling"), "give one"),
    (("--dpm_algorithm_type", "dpmsolver++", "--dpm_apply_strategy", "all", "--train_last_step"), "sigma 0"),
    (("--dpm_algorithm_type", "dpmsolver", "--dpm_apply_strategy", "all"), "singular"),
    (("--dpm_algorithm_type", "dpmsolver++", "--dpm_apply_strategy", "all", "--kl_coef", "0.1"), "SDE-DPM"),
    (("--sde_steps", "2", "--training_strategy", "part"), "give one"),
    (("--training_strategy", "part", "--prog_overlap", "--prog_overlap_step", "-1"), ">= 0"),
    (("--sde_steps", "30",), "exceeds"),
    (("--sde_steps", "2", "--sde_start", "23"), "runs past"),
    (("--sde_steps", "2", "--sde_start", "soon"), "random"),
    (("--advantage_rerange_strategy", "balance"), "training_strategy part"),
    (("--reward_model", "multi_reward", "--rewards", None), "needs --use_group"),
    (("--reward_model", "hpsv2"), "not both"),
])
def test_bad_mix_flags_fail_clearly(flags, match):
    flags = list(flags)
    base = ["--data_json_path", "x", "--pretrained_model_name_or_path", "x"]
    if None in flags:
        flags.remove(None)
        flags.remove("--rewards")
    else:
        base += ["--rewards", "compressibility:1"]
    with pytest.raises(ConfigError, match=match):
        validate_args(build_parser().parse_args(base + flags))


def test_dpm_apply_all_plans():
    """--dpm_apply_strategy all: multistep DPM on every deterministic transition of the full
    schedule, SDE-DPM-Solver on the SDE ones; with every step SDE the last one (to sigma 0) is DPM."""
    cfg = _settings(*MIXGRPO, "--dpm_algorithm_type", "dpmsolver++", "--dpm_apply_strategy", "all",
                    "--dpm_solver_order", "3", "--eta", "0.7", steps=10)
    assert "--eta 0.7 has no effect" in " | ".join(cfg.compat_notes)
    plan = mix.plan_for_iteration(cfg.mix, 10, 3.0, 9, 9, 26)  # window moved once: start 1
    assert plan.describe() == "DSSSSDDDDD" and plan.sde_kind == "sde-dpmsolver++" and plan.dpm_order == 3
    assert plan.trainable == (1, 2, 3, 4)
    torch.testing.assert_close(plan.sigmas, sde.sigma_schedule(10, 3.0))  # no compression
    full = mix.plan_for_iteration(_settings("--dpm_algorithm_type", "dpmsolver++", "--dpm_apply_strategy", "all",
                                            steps=6).mix, 6, 3.0, 5, 3, 1)
    assert full.describe() == "SSSSSD" and full.sde_kind == "sde-dpmsolver++" and full.num_trained == 3
    # post with the noise-prediction solver: a compressed tail like Flash's
    post = _settings(*MIXGRPO, "--dpm_algorithm_type", "dpmsolver", "--dpm_solver_order", "3")
    plan = mix.plan_for_iteration(post.mix, 25, 3.0, 24, 14, 1)
    assert plan.describe() == "SSSS" + "D" * 7 and plan.dpm_algorithm == "dpmsolver" and plan.sde_kind == "dance"


def test_reward_model_maps_onto_rewards():
    args = build_parser().parse_args(["--data_json_path", "x", "--pretrained_model_name_or_path", "x",
                                      "--reward_model", "hpsv2_clip_score", "--hps_weight", "2",
                                      "--hps_path", "ck/HPS_v2.1_compressed.pt", "--hps_clip_path",
                                      "ck/open_clip_pytorch_model.bin", "--clip_score_path", "clipdir",
                                      "--multi_reward_mix", "advantage_aggr", "--use_group"])
    cfg = validate_args(args)
    # MixGRPO divides its weights by their sum (fastvideo.rewards.mix); advantage_aggr is applied by
    # the trainer's mixed advantages, not by --reward_group_norm.
    assert [(s.name, s.weight) for s in cfg.reward.spec] == [("hpsv2", 2.0 / 3.0), ("clip", 1.0 / 3.0)]
    assert cfg.reward.hps_ckpt_dir == "ck" and cfg.reward.clip_dir == "clipdir"


def test_unused_window_flags_are_noted():
    cfg = _settings("--group_size", "6", "--dpm_solver_order", "1", "--sde_start", "3")
    notes = " | ".join(cfg.compat_notes)
    assert "--group_size have no effect without --training_strategy part" in notes
    assert "--dpm_solver_order have no effect with --dpm_algorithm_type null" in notes
    assert "--sde_start has no effect without --sde_steps" in notes
    assert "--no_share_ode_prefix has no effect without --init_same_noise" in " | ".join(
        _settings("--no_share_ode_prefix").compat_notes)
    assert _settings("--init_same_noise").rollout.share_ode_prefix
    shared = _settings("--init_same_noise", "--no_share_ode_prefix")
    assert not shared.rollout.share_ode_prefix and not [n for n in shared.compat_notes if "share_ode" in n]
    assert not [n for n in _settings().compat_notes if "no effect" in n and "num_generations" not in n]
