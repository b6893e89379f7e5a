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
    line, where, best = summary(tmp_path)
    assert line == f"demo: reward ({label}) first 2 iterations -3.500 -> last 2 iterations 4.500 (rose); 10 iterations, 15 s"
    assert where.startswith(f"demo: see {tmp_path}/reward_curve.png")
    assert best == "demo: no best/ (no held-out evaluation after the base model's)"


def test_the_closing_lines_say_where_best_is_or_why_there_is_none(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"reward_mean": -1.0, "time_iteration": 1.0}) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"reward": {"spec": ["compressibility:1"]}}))
    evals = [{"iteration": 0, "trained_score": -3.0}, {"iteration": 10, "trained_score": -2.0, "guard": {"hacking": True}},
             {"iteration": 20, "trained_score": -3.5, "guard": {"hacking": False}},
             {"iteration": 30, "trained_score": -2.5, "guard": {"hacking": True}}]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    assert summary(tmp_path)[2] == ("demo: no best/: of 3 held-out evaluations, 2 flagged by the reward-hacking guard "
                                    "and 1 below the base model's -3.000 (best/ takes only one that is neither)")
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "BEST.json").write_text(json.dumps({"iteration": 20, "score": -2.0, "source": "checkpoint-20"}))
    assert summary(tmp_path)[2] == f"demo: best checkpoint {tmp_path}/best (iteration 20)"


def test_a_video_run_names_its_clips(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"reward_mean": 1.0, "time_iteration": 1.0}) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"reward": {"spec": ["compressibility:1"]}}))
    assert summary(tmp_path)[1].endswith("eval_curve.png and images/")  # an image run: no clips
    (tmp_path / "images" / "step_000001").mkdir(parents=True)
    (tmp_path / "images" / "step_000001" / "clip_0_0.mp4").write_bytes(b"")
    assert summary(tmp_path)[1].endswith("images/ (the sample clips as MP4; their group grids and eval_grid.png "
                                         "as frame strips)")
