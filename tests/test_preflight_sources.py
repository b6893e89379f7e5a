"""A reward that needs source images (clip_edit) in a text-to-image run is refused in one line,
exit 2, before any model loads: by the launcher's preflight and by the entry point itself. An
editing family passes; a VLM judge (shows sources when there are some) is not refused. The same for
a remote reward whose server's /health says it uses sources (#36), checked against the real server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
    from fastvideo.rewards.base import needs_sources
    from fastvideo.rewards.registry import reward_class
    from fastvideo.rewards.vlm import VLMJudgeReward

    argv = train_args(kontext_embeddings, tiny_kontext_dir, tmp_path / "out", rewards="clip_edit:1.0",
                      clip_dir=str(tiny_rewards.pickscore_dir), model_family="kontext", guidance_scale=2.5)
    problems = preflight.check_training(argv, nproc_per_node=2)
    assert not [p for p in problems if "source image" in p], problems
    assert needs_sources(reward_class("clip_edit")) and not needs_sources(VLMJudgeReward)
    args, _ = preflight.parse_all(train_args(tmp_path / "x.json", tmp_path / "m", tmp_path / "o",
                                             rewards="vlm:http://127.0.0.1:9/v1?model=judge:1.0"))
    assert validate_args(args).reward.spec[0].kind == "vlm"  # a judge in a text-to-image run is no problem


class _Keeps:
    """A served plugin reward scoring each image against its source (it needs them)."""

    uses_sources = True

    def __call__(self, images, prompts, sources=None):
        return (images - sources).abs().mean(dim=(1, 2, 3))


class _ShowsWhenThere(_Keeps):
    """One that scores without sources too (as the VLM judge does)."""

    sources_optional = True

    def __call__(self, images, prompts, sources=None):
        return images.mean(dim=(1, 2, 3)) if sources is None else super().__call__(images, prompts, sources)


@pytest.fixture(scope="module")
def edit_server(tiny_rewards):
    """The project's reward server answering /health with what each reward says: clip_edit (built
    in, needs sources), a plugin that needs them, one that does not, and compressibility."""
    from fastvideo.rewards import build_reward
    from fastvideo.tools.reward_server import PluginReward, build_app, served_info
    from server_utils import serve_in_thread

    kwargs = {"clip_dir": str(tiny_rewards.pickscore_dir), "batch_size": 2}
    rewards = {"clip_edit": build_reward("clip_edit", **kwargs), "compressibility": build_reward("compressibility"),
               "keeps": PluginReward("keeps", _Keeps(), 2), "shows": PluginReward("shows", _ShowsWhenThere(), 2)}
    info = {"clip_edit": served_info("clip_edit", rewards["clip_edit"], kwargs),
            "compressibility": served_info("compressibility", rewards["compressibility"], {}),
            "keeps": served_info("keeps", rewards["keeps"], {}), "shows": served_info("shows", rewards["shows"], {})}
    with serve_in_thread(build_app(rewards, info)) as (url, _):
        yield url


def test_a_served_reward_that_needs_sources_is_refused_for_text_to_image(edit_server, tiny_flux_dir,
                                                                        tiny_embeddings, tmp_path, capsys):
    """#36: the server's /health says the reward uses sources; a text-to-image run is refused by the
    pre-flight in one line naming the reward and the fix (it used to be a 400 at the first reward call)."""
    for name in ("clip_edit", "keeps"):
        argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / name, rewards=f"remote:{edit_server}/{name}:1.0")
        assert preflight.main(["--nproc_per_node", "2", "fastvideo/train_grpo_flux.py", *argv]) == 2
        errors = [ln for ln in capsys.readouterr().err.splitlines() if ": error:" in ln]
        assert len(errors) == 1, errors
        assert f"--rewards remote:{edit_server}/{name}: the reward server says" in errors[0], errors[0]
        assert "source image" in errors[0] and "model family 'flux' generates from text" in errors[0]
        assert "--model_family kontext" in errors[0]
    for name in ("compressibility", "shows"):  # no sources used, or scored without them: no problem
        argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / f"ok_{name}",
                          rewards=f"remote:{edit_server}/{name}:1.0")
        assert preflight.check_training(argv, nproc_per_node=2) == [], name


def test_the_entry_point_refuses_a_served_source_reward_before_any_model_loads(edit_server, tiny_flux_dir,
                                                                             tiny_embeddings, tmp_path,
                                                                             monkeypatch, capsys):
    from fastvideo.train_grpo_flux import main
    from fastvideo.training import builders

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(builders, "build_models", no_model)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "out", rewards=f"remote:{edit_server}/clip_edit:1.0")
    assert main(argv) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(errors) == 1 and "/health: uses_sources" in errors[0], errors


def test_an_editing_family_may_use_a_served_source_reward(edit_server, tiny_kontext_dir, kontext_embeddings,
                                                          tmp_path):
    argv = train_args(kontext_embeddings, tiny_kontext_dir, tmp_path / "out",
                      rewards=f"remote:{edit_server}/clip_edit:1.0", model_family="kontext", guidance_scale=2.5)
    assert not [p for p in preflight.check_training(argv, nproc_per_node=2) if "source image" in p]
