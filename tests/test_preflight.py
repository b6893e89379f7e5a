"""Checks before spawning: a launch with several mistakes reports all of them, one line each, and
exits 2 before any worker starts; a user error inside the ranks is printed once (exit 2, no
torchrun traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastvideo import preflight

sys.path.insert(0, str(Path(__file__).resolve().parent / "training"))
from helpers import python_path, train_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_every_parse_problem_is_reported():
    args, problems = preflight.parse_all(["--data_json_path", "x.json", "--h", "tall", "--sampling_steps", "many",
                                          "--bogus_flag", "1", "--learning_rat3", "1e-5",
                                          "--pretrained_model_name_or_path", "m"])
    assert args is None
    assert problems == ["argument --h: invalid int value: 'tall'",
                        "argument --sampling_steps: invalid int value: 'many'",
                        "unknown flag --bogus_flag",
                        "unknown flag --learning_rat3 (did you mean --learning_rate?)"]


def test_files_and_rules_are_checked_together(tiny_flux_dir, tiny_embeddings, tmp_path):
    argv = train_args(tmp_path / "none.json", tmp_path / "no_model", tmp_path / "out", rewards="hpsv2:1",
                      hps_ckpt_dir=str(tmp_path / "no_hps"), sp_size=2,
                      resume_from_checkpoint=str(tmp_path / "no_ckpt"))
    problems = preflight.check_training(argv, nproc_per_node=2)
    assert len(problems) == 4, problems  # the rewards are not checked when the flags do not validate
    for needle, problem in zip(["sequence parallelism", "none.json", "no_model", "no_ckpt"], problems):
        assert needle in problem, (needle, problem)
    valid_flags = preflight.check_training(argv[:-4], nproc_per_node=2)  # without --sp_size 2 and the resume
    assert len(valid_flags) == 3 and "no_hps" in valid_flags[2], valid_flags
    assert all("\n" not in p for p in problems)
    ok = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "fresh")
    assert preflight.check_training(ok, nproc_per_node=2) == []
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "metrics.jsonl").write_text("{}\n")
    [problem] = preflight.check_training(ok, nproc_per_node=2)
    assert "already holds" in problem
    assert preflight.check_training([*ok, "--overwrite"], nproc_per_node=2) == []


def test_reward_checkpoint_of_another_architecture_is_one_problem(tiny_flux_dir, tiny_embeddings, tiny_rewards,
                                                                   tmp_path):
    """The tiny HPS checkpoint checked as ViT-H-14 (the default name): one line naming the first
    differing tensors and the architecture the folder's config gives; the right name passes."""
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "out", rewards="hpsv2:1",
                      hps_ckpt_dir=str(tiny_rewards.hps_ckpt_dir))
    [problem] = preflight.check_training(argv, nproc_per_node=2)
    assert "does not fit the 'ViT-H-14' architecture" in problem and "visual.class_embedding: (32,) vs (1280,)" in problem
    assert f"pass --hps_model_name {tiny_rewards.hps_model_name}" in problem and "\n" not in problem
    assert preflight.check_training([*argv, "--hps_model_name", tiny_rewards.hps_model_name], nproc_per_node=2) == []


def test_world_size_against_the_devices():
    assert preflight.world_problems(64, 1, "cpu") == []
    [problem] = preflight.world_problems(3, 1, "npu")  # HCCL cannot shard over 3 ranks
    assert "world size 3" in problem


def _launch_env(**extra) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "PYTHON": sys.executable,
            "FASTVIDEO_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path(ROOT), **extra}


def test_a_launch_with_three_mistakes_prints_three_lines_and_starts_nothing(tiny_flux_dir, tiny_rewards, tmp_path):
    """The acceptance test: wrong flag, missing weights folder, missing embeddings index, 2 ranks
    (the HPS weights are right: the tiny ones under their architecture's name)."""
    out, hps = tmp_path / "out", tiny_rewards.hps_ckpt_dir
    env = _launch_env(NPROC="2", MODEL_PATH=str(tmp_path / "no_flux"), DATA_JSON=str(tmp_path / "none.json"),
                      OUTPUT_DIR=str(out), EXTRA_ARGS=f"--bogus_flag 1 --hps_ckpt_dir {hps} "
                                                      f"--hps_model_name {tiny_rewards.hps_model_name}")
    proc = subprocess.run(["bash", "scripts/finetune/finetune_flux_grpo_a3_16die.sh"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) <= 6, lines
    text = "\n".join(lines)
    assert "unknown flag --bogus_flag" in text and "no_flux" in text and "none.json" in text
    assert "3 problems found before starting 2 rank(s)" in text
    assert "Traceback" not in text and "+ torchrun" not in text and not out.exists()


def test_a_user_error_inside_the_ranks_is_one_line(tiny_flux_dir, tmp_path):
    """Past the check (FASTVIDEO_PREFLIGHT=0): both ranks fail alike, the launcher prints it once."""
    argv = train_args(tmp_path / "none.json", tiny_flux_dir, tmp_path / "out")
    cmd = [sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=2",
           "fastvideo/train_grpo_flux.py", *argv]
    proc = subprocess.run(cmd, env=_launch_env(FASTVIDEO_PREFLIGHT="0", HF_HUB_OFFLINE="1"), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("+ torchrun")
    assert len(lines) == 2 and "none.json" in lines[1] and lines[1].startswith("train_grpo_flux: error:"), lines
    assert "ChildFailedError" not in proc.stderr and "usage:" not in proc.stderr


@pytest.mark.parametrize("device", ["npu", "cuda"])
def test_dry_run_previews_a_device_this_machine_lacks(device):
    env = {**_launch_env(FASTVIDEO_DEVICE=device, DRY_RUN="1"), "ASCEND_ROOT": "/nonexistent"}
    proc = subprocess.run(["bash", "scripts/finetune/finetune_flux_grpo_a3_16die.sh"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, command = proc.stdout.splitlines()[:2]
    assert first.startswith(f"device: {device}") and "--nproc_per_node=16" in command
    assert "Traceback" not in proc.stderr


def test_an_abbreviated_flag_is_an_unknown_flag_with_its_full_name():
    """--max_train 5 used to set --max_train_steps silently (argparse's prefix matching)."""
    from fastvideo.config import build_parser

    args, extras = build_parser().parse_known_args(["--data_json_path", "x.json",
                                                    "--pretrained_model_name_or_path", "m", "--max_train", "5"])
    assert extras == ["--max_train", "5"] and args.max_train_steps != 5
    args, problems = preflight.parse_all(["--data_json_path", "x.json", "--pretrained_model_name_or_path", "m",
                                          "--max_train", "5"])
    assert args is None and problems == ["unknown flag --max_train (did you mean --max_train_steps?)"]


def test_a_plugins_own_flag_passes_the_check():
    """The check parses with the flags of the plugin the command line selects."""
    sys.path.insert(0, str(ROOT / "tests" / "training"))
    args, problems = preflight.parse_all(["--data_json_path", "x.json", "--pretrained_model_name_or_path", "m",
                                          "--algorithm", "toy_plugins:ToyObjective", "--toy_baseline_decay", "0.25"])
    assert problems == [] and args.toy_baseline_decay == 0.25


def test_the_entry_point_run_directly_says_did_you_mean(tmp_path):
    """python fastvideo/train_grpo_flux.py (no launcher) checks like the launcher: every problem,
    the nearest name of a misspelled flag."""
    proc = subprocess.run([sys.executable, "fastvideo/train_grpo_flux.py", "--data_json_path", "x.json",
                           "--pretrained_model_name_or_path", "m", "--learning_rat3", "1e-5", "--max_train", "5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": python_path(ROOT)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "unknown flag --learning_rat3 (did you mean --learning_rate?)" in proc.stderr
    assert "unknown flag --max_train (did you mean --max_train_steps?)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_config_file_with_two_bad_keys_names_both(tmp_path):
    from fastvideo.config import parse_config
    from fastvideo.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text("learning_rat: 1.0e-5\nh: tall\nseed: 3\n")
    with pytest.raises(ConfigError) as exc:
        parse_config(["--config", str(path), "--data_json_path", "x.json", "--pretrained_model_name_or_path", "m",
                      "--rewards", "compressibility"], usage=False)
    lines = str(exc.value).splitlines()
    assert lines == ["--config: unknown key 'learning_rat'; did you mean learning_rate? (keys are flag names "
                     "without --)", "--config: h: expected an integer, got 'tall'"]


def test_print_config_runs_the_input_checks(tmp_path, capsys):
    """The entry point's --print_config runs the launcher's input checks (as warnings: it prints)."""
    from fastvideo.train_grpo_flux import main

    with pytest.raises(SystemExit) as exc:
        main(["--data_json_path", str(tmp_path / "none.json"), "--pretrained_model_name_or_path",
              str(tmp_path / "no_flux"), "--rewards", "compressibility", "--print_config", "json"])
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and '"algorithm": "grpo"' in out
    assert "warning: embedding index" in err and "none.json" in err and "no_flux" in err
