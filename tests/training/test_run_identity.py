"""The run identity a checkpoint records: every setting is named by flags that exist."""

from __future__ import annotations

import re

import pytest

from fastvideo.config import build_parser, validate_args
from fastvideo.training.run.identity import FLAGS, identity_differences, run_identity


def _cfg(*flags):
    args = build_parser().parse_args(["--data_json_path", "x", "--pretrained_model_name_or_path", "x",
                                      "--rewards", "compressibility:1", *flags])
    return validate_args(args)


def test_every_identity_setting_names_real_flags():
    """A resume mismatch tells the user which flag to change: that flag must exist."""
    known = {a for action in build_parser()._actions for a in action.option_strings}
    ident = run_identity(_cfg("--use_lora", "--dpm_algorithm_type", "dpmsolver++", "--dpm_apply_strategy", "all"), 2)
    for key in ident:
        label = FLAGS.get(key, "--" + key)
        named = re.findall(r"--[a-z_]+", label)
        assert named or label == "the number of processes", (key, label)
        assert set(named) <= known, (key, label, set(named) - known)


def test_how_prompts_are_loaded_is_not_part_of_the_identity():
    """The embedding cache and the loader threads change how the same tensors are read, not the run."""
    base = run_identity(_cfg(), 2)
    assert run_identity(_cfg("--embedding_cache_mb", "0", "--dataloader_num_workers", "0"), 2) == base
    assert not {"embedding_cache_mb", "dataloader_num_workers"} & set(base)


def test_dpm_settings_are_part_of_the_identity():
    post = run_identity(_cfg("--training_strategy", "part", "--dpm_algorithm_type", "dpmsolver++"), 1)
    every = run_identity(_cfg("--training_strategy", "part", "--dpm_algorithm_type", "dpmsolver++",
                              "--dpm_apply_strategy", "all"), 1)
    diffs = identity_differences(post, every)
    assert any(d.startswith("dpm_all (--dpm_apply_strategy): checkpoint False, this run True") for d in diffs), diffs
    assert any(d.startswith("sde_kind") for d in diffs)


PART = ("--training_strategy", "part")
FAST = ("--sde_steps", "2")
POST = (*PART, "--dpm_algorithm_type", "dpmsolver++")
LORA = ("--use_lora",)
# (identity key, flags of the saved run, flags of the resuming run, world sizes, the keys that must differ):
# each row changes one setting; a mode switch also changes the keys that only it defines.
CHANGES = [
    ("seed", ("--seed", "1", "--sampler_seed", "9"), ("--seed", "2", "--sampler_seed", "9"), None),
    ("sampler_seed", ("--sampler_seed", "1"), ("--sampler_seed", "2"), None),
    ("num_generations", ("--use_group", "--num_generations", "4"), ("--use_group", "--num_generations", "6"), None),
    ("sampling_steps", ("--sampling_steps", "16"), ("--sampling_steps", "20"), None),
    ("shift", ("--shift", "3"), ("--shift", "2.5"), None),
    ("sigma_grid", (), ("--sigma_grid", "diffusers"), None),
    ("eta", ("--eta", "0.3"), ("--eta", "0.5"), None),
    ("h", ("--h", "64"), ("--h", "128"), None),
    ("w", ("--w", "64"), ("--w", "128"), None),
    ("rewards", ("--rewards", "compressibility:1"), ("--rewards", "compressibility:2"), None),  # a weight alone
    ("use_group", (), ("--use_group",), {"use_group", "num_generations"}),  # 1 image per prompt without it,
    ("world_size", (), (), None),  # 2 ranks saved, 4 resume
    ("train_batch_size", ("--train_batch_size", "1"), ("--train_batch_size", "2"), None),
    ("use_lora", (), LORA, None),
    ("lora_rank", (*LORA, "--lora_rank", "8"), (*LORA, "--lora_rank", "16"), None),
    ("lora_alpha", (*LORA, "--lora_alpha", "8"), (*LORA, "--lora_alpha", "16"), None),
    ("lora_target_modules", (*LORA, "--lora_target_modules", "to_q,to_k"), (*LORA, "--lora_target_modules", "to_q"),
     None),
    ("mix_mode", (), PART, {"mix_mode", "sde_window"}),
    ("sde_window", (*PART, "--group_size", "2"), (*PART, "--group_size", "3"), {"sde_window", "window_move_step"}),
    ("window_strategy", (*PART, "--sample_strategy", "progressive"), (*PART, "--sample_strategy", "random"), None),
    ("window_fixed_start", (*FAST, "--sde_start", "0"), (*FAST, "--sde_start", "1"), None),
    ("iters_per_group", (*PART, "--iters_per_group", "25"), (*PART, "--iters_per_group", "10"), None),
    ("sde_window_range", (*FAST, "--sde_window_range", "0,5"), (*FAST, "--sde_window_range", "1,5"), None),
    ("window_move_step", (*PART, "--prog_overlap", "--prog_overlap_step", "1"),
     (*PART, "--prog_overlap", "--prog_overlap_step", "2"), None),
    ("max_iters_per_group", (*PART, "--max_iters_per_group", "10"), (*PART, "--max_iters_per_group", "12"), None),
    ("min_iters_per_group", (*PART, "--min_iters_per_group", "1"), (*PART, "--min_iters_per_group", "2"), None),
    ("roll_back", PART, (*PART, "--roll_back"), None),  # MixGRPO's roll-back
    ("frozen_init_timesteps", (), ("--frozen_init_timesteps", "3"), None),
    ("dpm_post_compress_ratio", (*POST, "--dpm_post_compress_ratio", "0.4"),
     (*POST, "--dpm_post_compress_ratio", "0.5"), None),
    ("dpm_solver_order", (*POST, "--dpm_solver_order", "2"), (*POST, "--dpm_solver_order", "3"), None),
    ("dpm_solver_type", (*POST, "--dpm_solver_type", "heun"), (*POST, "--dpm_solver_type", "midpoint"), None),
    ("sde_kind", (), ("--flow_grpo_sampling",), None),
    ("dpm_all", POST, (*POST, "--dpm_apply_strategy", "all"), {"dpm_all", "sde_kind", "dpm_post_compress_ratio"}),
    ("dpm_algorithm", POST, (*PART, "--dpm_algorithm_type", "dpmsolver"), None),
    ("model_family", (), ("--model_family", "my_pkg.models:Other"), None),
    # another objective draws --num_generations (default 12) samples per prompt without --use_group,
    # where GRPO draws one (issue 46: group sampling for every objective)
    ("algorithm", (), ("--algorithm", "my_pkg.algos:DPO"), {"algorithm", "num_generations"}),
]


def _worlds(key):
    return (2, 4) if key == "world_size" else (2, 2)


def test_the_table_covers_every_identity_key():
    """A key added to the identity without a row here fails this test."""
    keys = set()
    for flags in ((), LORA, PART, FAST, POST, (*POST, "--dpm_apply_strategy", "all")):
        keys |= set(run_identity(_cfg(*flags), 2))
    assert keys == {row[0] for row in CHANGES}


@pytest.mark.parametrize("key, saved_flags, flags, differing", CHANGES, ids=[row[0] for row in CHANGES])
def test_each_identity_setting_changed_alone_is_refused(key, saved_flags, flags, differing):
    """Issue #39 test 24: the resume check refuses a run that differs from the saved one in any single
    identity setting, naming it with both values; the same run resumes."""
    from fastvideo.errors import ConfigError
    from fastvideo.training.run.identity import check_resume

    ws_saved, ws_now = _worlds(key)
    saved = run_identity(_cfg(*saved_flags), ws_saved)
    cfg = _cfg(*flags)
    now = run_identity(cfg, ws_now)
    changed = {k for k in set(saved) & set(now) if saved[k] != now[k]}
    assert changed == (differing or {key}) & (set(saved) & set(now)), changed
    assert check_resume({"run_identity": saved}, _cfg(*saved_flags), ws_saved, "ckpt") == []
    with pytest.raises(ConfigError) as refused:
        check_resume({"run_identity": saved}, cfg, ws_now, "ckpt")
    line = next(ln.strip() for ln in str(refused.value).splitlines() if ln.strip().startswith(f"{key} ("))
    assert line.endswith(f"checkpoint {saved[key]!r}, this run {now[key]!r}"), line
    allowed = _cfg(*flags, "--resume_allow_changes")
    assert check_resume({"run_identity": saved}, allowed, ws_now, "ckpt") == identity_differences(saved, now)


def test_a_checkpoint_from_before_the_identity_record_is_checked_on_its_seed():
    """Checkpoints written before run_identity existed hold only {"seed": ...}: that seed is still checked
    (the settings added later compare against the value every earlier run had)."""
    from fastvideo.errors import ConfigError
    from fastvideo.training.run.identity import check_resume

    old = {"seed": 5, "step": 3}
    assert check_resume(old, _cfg("--seed", "5", "--shift", "2"), 2, "ckpt") == []  # the rest was never recorded
    with pytest.raises(ConfigError, match=r"seed \(--seed\): checkpoint 5, this run 6"):
        check_resume(old, _cfg("--seed", "6"), 2, "ckpt")
    with pytest.raises(ConfigError, match=r"algorithm \(--algorithm\): checkpoint 'grpo'"):
        check_resume(old, _cfg("--seed", "5", "--algorithm", "my_pkg.algos:DPO"), 2, "ckpt")
    assert check_resume({}, _cfg("--seed", "6"), 2, "ckpt") == []  # no seed at all: nothing to compare


def test_a_sequence_group_counts_as_one_data_parallel_rank():
    """sp 2 on 4 processes draws the prompts and noise of 2 data-parallel ranks: the same run as sp 1 on 2
    processes (resume across sp sizes), and not the run of sp 1 on 4."""
    sp1_on_2 = run_identity(_cfg(), 2)
    assert run_identity(_cfg("--sp_size", "2"), 4) == sp1_on_2
    assert identity_differences(run_identity(_cfg(), 4), run_identity(_cfg("--sp_size", "2"), 4)) == [
        "world_size (the number of processes / --sp_size (the data-parallel ranks)): checkpoint 4, this run 2"]
