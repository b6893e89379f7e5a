"""The second upstream audit (issue 24) at the configuration level, and docs/upstream.md held to the
code: every "`--flag` default `VALUE`" in the document is the parser's default, and the launcher
values it states are the launchers'."""

from __future__ import annotations

import re

import pytest

from fastvideo.config import ConfigError, build_parser, validate_args
from helpers import ROOT

BASE = ["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility"]
DOC = ROOT / "docs" / "upstream.md"


def _cfg(*flags):
    return validate_args(build_parser().parse_args(BASE + list(flags)))


def test_documented_flag_defaults_are_the_parsers():
    stated = re.findall(r"`--(\w+)` default `([^`]+)`", DOC.read_text())
    assert len(stated) >= 5, stated
    parser = build_parser()
    for flag, value in stated:
        assert str(parser.get_default(flag)) == value, flag


def test_documented_launcher_values_are_the_launchers():
    text = DOC.read_text()
    args_sh = (ROOT / "scripts" / "finetune" / "mixgrpo_args.sh").read_text()
    for name, value in re.findall(r"default `([A-Z_]+)=([^`]+)`", text) + re.findall(r", `([A-Z_]+)=([^`]+)`", text):
        assert f"${{{name}:-{value}}}" in args_sh, name
    assert "REWARD_MODEL" in text and "UNIFIED_REWARD_URL" in text


def test_init_same_noise_is_rank_scoped_by_default():
    cfg = _cfg("--init_same_noise", "--train_batch_size", "2", "--use_group", "--num_generations", "4")
    assert cfg.prompts_per_rank == 2 and cfg.rollout.same_noise_scope == "rank"
    from fastvideo.training.parts import rollout_config

    assert rollout_config(cfg).same_noise_scope == "rank"
    assert _cfg("--init_same_noise", "--same_noise_scope", "prompt").rollout.same_noise_scope == "prompt"
    notes = _cfg("--same_noise_scope", "prompt").compat_notes
    assert any("--same_noise_scope prompt has no effect without --init_same_noise" in n for n in notes)
    from fastvideo.sampling.settings import RolloutSettings

    old = {"height": 64, "width": 64, "sampling_steps": 4, "eta": 0.3, "shift": 3.0, "guidance_scale": 3.5,
           "num_generations": 2, "rollout_batch_size": 1, "init_same_noise": True, "quantize_timestep": True,
           "share_ode_prefix": True}
    assert RolloutSettings.flags_from_resolved(old)["same_noise_scope"] == "prompt"  # how such a run sampled


def test_hps_input_defaults_to_upstreams_8bit_path():
    assert _cfg().reward.hps_input == "uint8"
    assert _cfg("--rewards", "hpsv2", "--hps_input", "float").reward.hps_input == "float"
    assert any("--hps_input float has no effect" in n for n in _cfg("--hps_input", "float").compat_notes)
    remote = _cfg("--rewards", "remote:http://h:1/hpsv2", "--hps_input", "float").compat_notes
    assert any("start the reward server with --hps_input float" in n for n in remote)
    evaluated = _cfg("--eval_every", "1", "--eval_prompts", "assets/eval_prompts.txt", "--eval_rewards", "hpsv2",
                     "--hps_input", "float")
    assert not any("--hps_input" in n for n in evaluated.compat_notes)  # evaluation scores with it


def test_upstream_sharding_names():
    assert _cfg("--fsdp_sharding_startegy", "hybrid_full").fsdp_strategy == "hybrid"
    assert _cfg("--fsdp_sharding_startegy", "hybrid_zero2").fsdp_strategy == "hybrid_zero2"
    assert _cfg("--fsdp_sharding_strategy", "hybrid_zero2", "--use_cpu_offload").cpu_offload


def test_use_hpsv3_is_refused_naming_the_reward_server_plugin():
    with pytest.raises(ConfigError, match=r"reward_server --plugin hpsv3=MODULE:FACTORY.*remote:http"):
        _cfg("--use_hpsv3")
