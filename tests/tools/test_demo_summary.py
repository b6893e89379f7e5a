"""The demo's closing line names what its reward measures (an editing demo's clip_edit was called
"minus JPEG kB")."""

from __future__ import annotations

import json

import pytest

from fastvideo.tools.demo_summary import summary


@pytest.mark.parametrize("spec, label", [(["compressibility:1"], "minus JPEG kB"),
                                         (["clip_edit:1"], "clip_edit:1"),
                                         (["compressibility:1", "hpsv2:0.5"], "compressibility:1, hpsv2:0.5")])
def test_the_closing_line_names_the_reward_and_compares_the_first_and_last_fifth(spec, label, tmp_path):
    rewards = [-4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"reward_mean": r, "time_iteration": 1.5}) + "\n"
                                                    for r in rewards))
    (tmp_path / "config.json").write_text(json.dumps({"reward": {"spec": spec}}))
    line, where = summary(tmp_path)
    assert line == f"demo: reward ({label}) first 2 iterations -3.500 -> last 2 iterations 4.500 (rose); 10 iterations, 15 s"
    assert where.startswith(f"demo: see {tmp_path}/reward_curve.png")


def test_a_video_run_names_its_clips(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"reward_mean": 1.0, "time_iteration": 1.0}) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"reward": {"spec": ["compressibility:1"]}}))
    assert summary(tmp_path)[1].endswith("eval_curve.png and images/")  # an image run: no clips
    (tmp_path / "images" / "step_000001").mkdir(parents=True)
    (tmp_path / "images" / "step_000001" / "clip_0_0.mp4").write_bytes(b"")
    assert summary(tmp_path)[1].endswith("images/ (the sample clips as MP4; their group grids and eval_grid.png "
                                         "as frame strips)")
