"""The run identity a checkpoint records: every setting is named by flags that exist."""

from __future__ import annotations

import re

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


def test_dpm_settings_are_part_of_the_identity():
    post = run_identity(_cfg("--training_strategy", "part", "--dpm_algorithm_type", "dpmsolver++"), 1)
    every = run_identity(_cfg("--training_strategy", "part", "--dpm_algorithm_type", "dpmsolver++",
                              "--dpm_apply_strategy", "all"), 1)
    diffs = identity_differences(post, every)
    assert any(d.startswith("dpm_all (--dpm_apply_strategy): checkpoint False, this run True") for d in diffs), diffs
    assert any(d.startswith("sde_kind") for d in diffs)
