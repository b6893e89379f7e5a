"""The --eval_* / --guard_* flags: resolved settings and every refusal."""

import pytest

from fastvideo.config import build_parser, validate_args, ConfigError

BASE = ["--data_json_path", "x.json", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility:2"]


def _cfg(*extra):
    return validate_args(build_parser().parse_args(BASE + list(extra)))


def test_off_by_default():
    assert _cfg().eval is None


def test_resolved_settings_include_trained_and_guard_rewards():
    cfg = _cfg("--eval_every", "5", "--eval_prompts", "p.txt", "--eval_rewards", "saturation",
               "--guard_reward", "detail", "--guard_action", "stop", "--sampling_steps", "7")
    e = cfg.eval
    assert e.rewards == ("compressibility", "saturation", "detail")
    assert e.trained == (("compressibility", 2.0),)
    assert e.steps == 7 and e.eta == 0.0 and e.num_images_per_prompt == 1 and e.batch_size == 1
    assert e.guard.reward == "detail" and e.guard.action == "stop" and e.guard.patience == 2
    assert e.guard.drop is None  # auto: the measured noise (training/run/guard.py)
    assert cfg.to_dict()["eval"]["guard"]["reward"] == "detail"


@pytest.mark.parametrize("extra, message", [
    (["--eval_every", "2"], "--eval_prompts"),
    (["--eval_prompts", "p.txt"], "needs --eval_every"),
    (["--guard_reward", "detail"], "needs --eval_every"),
    (["--eval_every", "-1"], ">= 0"),
    (["--eval_every", "2", "--eval_prompts", "p", "--eval_rewards", "hps"], "unknown reward 'hps'"),
    (["--eval_every", "2", "--eval_prompts", "p", "--eval_rewards", "detail,"], "empty entry"),
    (["--eval_every", "2", "--eval_prompts", "p", "--guard_reward", "compressibility"], "is a trained reward"),
    (["--eval_every", "2", "--eval_prompts", "p", "--guard_reward", "detail", "--guard_patience", "0"],
     "--guard_patience"),
    (["--eval_every", "2", "--eval_prompts", "p", "--guard_drop", "-1"], "--guard_drop"),
    (["--eval_every", "2", "--eval_prompts", "p", "--guard_drop", "half"], "'auto' or a number"),
    (["--eval_every", "2", "--eval_prompts", "p", "--eval_eta", "-0.1"], "--eval_eta"),
    (["--eval_every", "2", "--eval_prompts", "p", "--eval_steps", "0"], "--eval_steps"),
])
def test_bad_flags_are_refused(extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _cfg(*extra)
