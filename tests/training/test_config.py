import shlex
import subprocess
from pathlib import Path

import pytest

from fastvideo.config import ConfigError, build_parser, parse_config, validate_args

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility"]


def _validate(*extra):
    return validate_args(build_parser().parse_args(BASE + list(extra)))


@pytest.mark.parametrize("flags, message", [
    (["--sp_size", "2"], "sequence parallelism is not supported"),
    (["--num_generations", "1"], "at least 2 samples"),
    (["--h", "100"], "multiples of 16"),
    (["--timestep_fraction", "0"], r"must be in \(0, 1\]"),
    (["--timestep_fraction", "1.5"], r"must be in \(0, 1\]"),
    (["--cfg", "4.5"], "classifier-free guidance is not supported"),
    (["--t", "4"], "for images"),
    (["--mixed_precision", "fp16"], "fp16 is not supported"),
    (["--eta", "0"], "eta > 0"),
    (["--lr_scheduler", "cosine_wobble"], "is unknown; choose from"),
    (["--use_cpu_offload", "--fsdp_sharding_strategy", "none"], "needs FSDP sharding"),
    (["--dump_randomness", "a", "--load_randomness", "b"], "cannot be used together"),
    (["--probe_layers", "rope,bogus", "--record_dir", "r"], "unknown kind"),
    (["--probe_layers", "rope"], "needs --record_dir"),
    (["--use_hpsv2"], "either with --rewards or with --use_hpsv2"),
    (["--rewards", "hpsv2:1,nonsense:2"], "nonsense"),
    (["--selective_checkpointing", "0.5"], "needs --gradient_checkpointing"),
])
def test_bad_flags_fail_with_their_message(flags, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        _validate(*flags)


def test_no_reward_is_an_early_clear_error(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m"])
    assert "no reward given" in capsys.readouterr().err


def test_legacy_aliases_and_derived_quantities():
    cfg = validate_args(build_parser().parse_args(
        ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--use_hpsv2",
         "--num_generations", "12", "--train_batch_size", "1", "--train_micro_batch_size", "1",
         "--gradient_accumulation_steps", "4", "--sampling_steps", "16", "--timestep_fraction", "0.6",
         "--ignore_last", "--cache_dir", "x"]))
    assert [(s.name, s.weight) for s in cfg.reward.spec] == [("hpsv2", 1.0)]
    d = cfg.derived(world_size=16)
    assert d["train_global_batch_size"] == 64  # the recipe's 1 x 4 x 16
    assert d["trained_steps_per_sample"] == 9  # int(15 * 0.6)
    assert d["samples_per_iteration"] == 192
    assert d["optimizer_steps_per_iteration"] == 3
    assert any("--cache_dir" in n and "no effect" in n for n in cfg.compat_notes)


LAUNCHERS = [
    "scripts/finetune/finetune_flux_grpo_a3_16die.sh",
    "scripts/finetune/finetune_flux_grpo_8gpus.sh",
    "scripts/finetune/finetune_flux_grpo.sh",
    "scripts/demo/grpo_tiny_cpu.sh",
]


@pytest.mark.parametrize("script", LAUNCHERS)
def test_launcher_dry_run_is_accepted_by_the_parser(script):
    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin"}
    import os
    import sys

    env["PYTHON"] = sys.executable
    env["HOME"] = os.environ.get("HOME", "/root")
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "device: cpu; cann: none"
    line = [ln for ln in out.stdout.splitlines() if "train_grpo_flux.py" in ln][-1]
    words = shlex.split(line)
    argv = words[words.index(next(w for w in words if w.endswith("train_grpo_flux.py"))) + 1:]
    cfg = validate_args(build_parser().parse_args(argv))
    assert cfg.rollout.num_generations >= 2
