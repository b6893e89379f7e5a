"""A reward that needs source images (clip_edit) in a text-to-image run is refused in one line,
exit 2, before any model loads: by the launcher's preflight and by the entry point itself. An
editing family passes; a VLM judge (shows sources when there are some) is not refused."""

from __future__ import annotations

import sys
from pathlib import Path

from fastvideo import preflight

sys.path.insert(0, str(Path(__file__).resolve().parent / "training"))
from helpers import train_args  # noqa: E402


def _t2i_argv(tiny_flux_dir, tiny_embeddings, tiny_rewards, out, rewards="clip_edit:1.0,compressibility:0.5"):
    return train_args(tiny_embeddings, tiny_flux_dir, out, rewards=rewards, clip_dir=str(tiny_rewards.pickscore_dir))


def test_the_preflight_refuses_clip_edit_for_a_text_to_image_family(tiny_flux_dir, tiny_embeddings, tiny_rewards,
                                                                    tmp_path, capsys):
    argv = _t2i_argv(tiny_flux_dir, tiny_embeddings, tiny_rewards, tmp_path / "out")
    assert preflight.main(["--nproc_per_node", "2", "fastvideo/train_grpo_flux.py", *argv]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ": error:" in ln]
    assert len(errors) == 1, errors
    assert "--rewards clip_edit compares each image with its source image" in errors[0]
    assert "model family 'flux' generates from text" in errors[0] and "--model_family kontext" in errors[0]
    fine = _t2i_argv(tiny_flux_dir, tiny_embeddings, tiny_rewards, tmp_path / "out2", rewards="clip:1.0")
    assert preflight.check_training(fine, nproc_per_node=2) == []


def test_the_entry_point_refuses_it_before_any_model_loads(tiny_flux_dir, tiny_embeddings, tiny_rewards, tmp_path,
                                                            monkeypatch, capsys):
    from fastvideo.train_grpo_flux import main
    from fastvideo.training import builders

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(builders, "build_models", no_model)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert main(_t2i_argv(tiny_flux_dir, tiny_embeddings, tiny_rewards, tmp_path / "out")) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(errors) == 1 and "clip_edit compares each image with its source image" in errors[0], errors
    assert not (tmp_path / "out").exists()


def test_an_editing_family_and_a_judge_pass(tiny_kontext_dir, kontext_embeddings, tiny_rewards, tmp_path):
    from fastvideo.config import validate_args
    from fastvideo.rewards.base import needs_sources, reward_class
    from fastvideo.rewards.vlm import VLMJudgeReward

    argv = train_args(kontext_embeddings, tiny_kontext_dir, tmp_path / "out", rewards="clip_edit:1.0",
                      clip_dir=str(tiny_rewards.pickscore_dir), model_family="kontext", guidance_scale=2.5)
    problems = preflight.check_training(argv, nproc_per_node=2)
    assert not [p for p in problems if "source image" in p], problems
    assert needs_sources(reward_class("clip_edit")) and not needs_sources(VLMJudgeReward)
    args, _ = preflight.parse_all(train_args(tmp_path / "x.json", tmp_path / "m", tmp_path / "o",
                                             rewards="vlm:http://127.0.0.1:9/v1?model=judge:1.0"))
    assert validate_args(args).reward.spec[0].kind == "vlm"  # a judge in a text-to-image run is no problem
