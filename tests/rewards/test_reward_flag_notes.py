"""The start-up notes of reward-model flags: a flag is "without effect" only when no reward that
reads it is used (editing runs with clip_edit were told --clip_dir had no effect)."""

from __future__ import annotations

import pytest


def _notes(argv):
    from fastvideo.config import _defaults, build_parser
    from fastvideo.rewards.settings import RewardSettings

    args = build_parser(argv).parse_args(["--data_json_path", "x", "--pretrained_model_name_or_path", "m", *argv])
    return RewardSettings.notes(args, _defaults())


@pytest.mark.parametrize("rewards, expected", [
    ("clip_edit:1.0", []),
    ("clip:1.0", []),
    ("compressibility:1.0,pickscore:1.0", ["--clip_dir /x/clip has no effect without the clip or clip_edit reward"]),
    ("compressibility:1.0", ["--clip_dir /x/clip has no effect without the clip or clip_edit reward"]),
])
def test_clip_dir_is_noted_only_without_a_reward_that_reads_it(rewards, expected):
    assert _notes(["--rewards", rewards, "--clip_dir", "/x/clip"]) == expected
