"""Checks before spawning: a launch with several mistakes reports all of them, one line each, and
exits 2 before any worker starts; a user error inside the ranks is printed once (exit 2, no
torchrun traceback)."""

from __future__ import annotations

import os
import re
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
                      hps_ckpt_dir=str(tmp_path / "no_hps"), sp_size=3,
                      resume_from_checkpoint=str(tmp_path / "no_ckpt"))
    problems = preflight.check_training(argv, nproc_per_node=2)
    assert len(problems) == 5, problems  # the rewards too, although another flag does not validate
    for needle, problem in zip(["none.json", "no_model", "no_ckpt", "no_hps", "--sp_size 3 does not divide the world size 2"],
                               problems):
        assert needle in problem, (needle, problem)
    valid_flags = preflight.check_training(argv[:-4], nproc_per_node=2)  # without --sp_size 3 and the resume
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


# The launcher's pre-flight, table-driven: flags over the tiny run's -> a pattern for each of its
# problem lines, in order (one line each, then the summary; exit 2; no traceback).
PREFLIGHT = {
    "reward-server-not-answering": ({"rewards": "remote:http://127.0.0.1:9/x:1"}, [r"127\.0\.0\.1:9 .*does not answer"]),
    # 2 ranks x 2 samples of 65536 x 65536 (their decoded images alone 103 GB a rank), on the 64 GiB host
    "image-too-large-for-memory": ({"h": 65536, "w": 65536}, [r"--h 65536 --w 65536: .* at 206\.2 GB or more, over this host's 68\.7 GB"]),
    "image-far-too-large": ({"h": 1048576, "w": 1048576}, [r"--h 1048576 .*memory model"]),
    # #51 item 2: 8192 x 8192 holds 2.4 GB a rank through the rollout, but the VAE decode's peak is the 35,190 GB
    # cost_model --memory prices for these flags (its mid-block attention over 1M latent pixels, 2 ranks)
    "image-over-the-decode-peak": ({"h": 8192, "w": 8192}, [
        r"--h 8192 --w 8192: .*the VAE decode's\) at 35,190\.1 GB or more, over this host's 68\.7 GB of RAM"]),
    "one-prompt-for-two-ranks": ({"data_json_path": "{one_prompt}"}, [r"1 prompts cannot fill one iteration of 2 ranks"]),
    "device-type-unknown": ({"_env": {"FASTVIDEO_DEVICE": "tpu"}}, [r"FASTVIDEO_DEVICE='tpu' is not a device type"]),
    # #51 item 6: an empty --model_family is one line (not also the registry's), with a family's example;
    # an empty --algorithm's example is an objective's
    "model-family-empty": ({"model_family": ""}, [r"--model_family '': give a registered name \(e\.g\. flux, sd3\)"]),
    "algorithm-empty": ({"algorithm": ""}, [r"--algorithm '': give a registered name \(e\.g\. grpo, nft\)"]),
    # #39 item 20: a bad value, a missing index and missing reward weights: all three, at once
    "flag-and-files-at-once": ({"h": 100, "data_json_path": "{root}/none.json", "rewards": "hpsv2:1",
                                "hps_ckpt_dir": "{root}/no_hps"}, [r"--h", r"none\.json", r"no_hps"]),
    # #50 item 8: the same through DanceGRPO's --use_hpsv2 (the launchers' flag), read as --rewards hpsv2:1.0
    "flag-and-files-at-once-use_hpsv2": ({"h": 100, "data_json_path": "{root}/none.json", "rewards": None,
                                          "use_hpsv2": True, "hps_ckpt_dir": "{root}/no_hps"},
                                         [r"--h", r"none\.json", r"no_hps"]),
}
HOST_RAM = 64 << 30  # the table's host (the CPU's "device"): fixed, so that the memory rows hold anywhere


@pytest.mark.parametrize("case", list(PREFLIGHT))
def test_the_preflight_reports_each_problem_as_one_line(case, tiny_flux_dir, tiny_embeddings, tmp_path, capsys,
                                                        monkeypatch):
    from fastvideo import devices

    monkeypatch.setattr(devices, "total_memory_bytes", lambda dev_type: HOST_RAM)
    monkeypatch.setenv("FASTVIDEO_DEVICE", "cpu")
    flags, needles = PREFLIGHT[case]
    flags = dict(flags)
    for k, v in flags.pop("_env", {}).items():
        monkeypatch.setenv(k, v)
    places = {"root": tmp_path, "one_prompt": tmp_path / "one" / "videos2caption.json"}
    if "{one_prompt}" in str(flags):  # the tiny index cut to its first prompt
        import json
        import shutil

        shutil.copytree(Path(tiny_embeddings).parent, tmp_path / "one")
        entries = json.loads(Path(tiny_embeddings).read_text())
        places["one_prompt"].write_text(json.dumps(entries[:1]))
    flags = {k: (v.format(**places) if isinstance(v, str) else v) for k, v in flags.items()}
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "out", **flags)
    assert preflight.main(["--nproc_per_node", "2", "fastvideo/train_grpo_flux.py", *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == len(needles) + 1, err
    for line, pattern in zip(lines, needles):
        assert line.startswith("train_grpo_flux: error: ") and re.search(pattern, line), (pattern, line)
    assert f"{len(needles)} problem" in lines[-1]


def test_world_size_against_the_devices():
    assert preflight.world_problems(64, 1, "cpu") == []
    [problem] = preflight.world_problems(3, 1, "npu")  # HCCL cannot shard over 3 ranks
    assert "world size 3" in problem


def test_a_repeated_unknown_flag_is_reported_once(tmp_path):
    """Issue #39 test 26: --bogus_flag given three times (two spellings) is one problem, in the pre-flight
    and in the ranks' own parse check."""
    from fastvideo.config import parse_config
    from fastvideo.errors import ConfigError

    argv = ["--data_json_path", "x.json", "--pretrained_model_name_or_path", "m", "--bogus_flag", "1",
            "--bogus_flag=2", "--learning_rat3", "1e-5", "--bogus_flag", "3", "--learning_rat3", "2e-5"]
    problems = preflight.check_training(argv, 1, 1, "cpu", check_world=False)
    assert [p for p in problems if p.startswith("unknown flag")] == [
        "unknown flag --bogus_flag", "unknown flag --learning_rat3 (did you mean --learning_rate?)"]
    with pytest.raises(ConfigError) as refused:
        parse_config(argv, usage=False)
    assert str(refused.value).splitlines() == [
        "unknown flag --bogus_flag", "unknown flag --learning_rat3 (did you mean --learning_rate?)"]


class _Cuda:
    def __init__(self, available: bool, count: int):
        self.available, self.count = available, count

    def is_available(self):
        return self.available

    def device_count(self):
        return self.count


@pytest.mark.parametrize("available, count, nproc, problem", [
    (True, 2, 2, None), (True, 2, 1, None),
    (True, 2, 3, "3 processes on this node but 2 cuda device(s) visible"),
    (False, 8, 1, "1 processes on this node but 0 cuda device(s) visible"),  # torch built with CUDA, no driver
])
def test_the_cuda_world_check_counts_the_visible_devices(available, count, nproc, problem, monkeypatch):
    """Issue #39 test 26: the pre-flight's CUDA branch: more processes per node than visible devices is one
    problem naming both numbers; a CUDA that is not available counts 0 devices."""
    from fastvideo import devices

    monkeypatch.setattr(devices, "_device_module", lambda kind: _Cuda(available, count) if kind == "cuda" else None)
    found = preflight.world_problems(nproc, 2, "cuda")  # per node: nnodes does not multiply the check
    if problem is None:
        assert found == []
    else:
        [line] = found
        assert line.startswith(problem) and "--nproc_per_node" in line, line


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


@pytest.mark.parametrize("codes, expected", [
    ({0: 2, 1: 2}, 2), ({0: 143, 1: 2}, 2), ({0: -15, 1: 2}, 2), ({0: -9, 1: 2}, 2),  # torn down for rank 1's error
    ({0: 1, 1: 2}, 1), ({0: 143, 1: 143}, 1), ({0: 1}, 1), ({0: -11, 1: 2}, 1),  # a bug, or no user error
])
def test_ranks_torn_down_for_a_user_error_keep_exit_2(codes, expected, tmp_path):
    from types import SimpleNamespace

    from fastvideo.launch import report_children

    for rank, code in codes.items():
        if code == 2:
            (tmp_path / f"error-rank{rank}.txt").write_text("train_grpo_flux: error: prompt 1: missing\n")
    stream = __import__("io").StringIO()
    assert report_children({r: SimpleNamespace(exitcode=c) for r, c in codes.items()}, tmp_path, stream) == expected
    lines = stream.getvalue().splitlines()
    if expected == 2:
        assert lines == ["train_grpo_flux: error: prompt 1: missing (rank 1)"] or lines == [
            "train_grpo_flux: error: prompt 1: missing"], lines


def test_a_missing_file_in_rank_1s_share_is_one_line_exit_2(tiny_flux_dir, tiny_embeddings, tmp_path):
    """Issue #39 item 15: rank 1 finds prompt 1's file missing (exit 2), rank 0 is torn down: the
    launch exits 2 with rank 1's line alone."""
    import shutil

    data = tmp_path / "emb"
    shutil.copytree(Path(tiny_embeddings).parent, data)
    (data / "prompt_embed" / "1.pt").unlink()
    argv = train_args(data / Path(tiny_embeddings).name, tiny_flux_dir, tmp_path / "out")
    cmd = [sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=2",
           "fastvideo/train_grpo_flux.py", *argv]
    proc = subprocess.run(cmd, env=_launch_env(HF_HUB_OFFLINE="1"), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("+ torchrun")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and "1.pt" in lines[0] and "is missing" in lines[0] and "(rank 1)" in lines[0], lines


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (FileNotFoundError, StopIteration):
        return False
    return bool(mask & (1 << (sig - 1)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig, code", [("SIGTERM", 0), ("SIGINT", 130)])
def test_a_signal_while_the_launcher_starts_is_one_line(sig, code, tiny_flux_dir, tiny_embeddings, tmp_path):
    """Issue #39 item 17: SIGTERM / SIGINT while the launcher still imports (before any worker): one
    line and the signal's documented code, not a silent -15 (or a KeyboardInterrupt traceback)."""
    import signal
    import time

    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "out")
    proc = subprocess.Popen([sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=2",
                             "fastvideo/train_grpo_flux.py", *argv], env=_launch_env(HF_HUB_OFFLINE="1"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signum = getattr(signal, sig)
    deadline = time.monotonic() + 60
    # The launcher sets SIGTERM's handler last (Python's own SIGINT handler is there from start-up)
    while not _catches(proc.pid, signal.SIGTERM) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == code and "Traceback" not in err, err[-3000:]
    assert lines == [f"train_grpo_flux: {sig} before any worker started: nothing to stop or save"], lines


def test_a_busy_port_is_one_line(tiny_flux_dir, tiny_embeddings, tmp_path):
    """Issue #39 item 9: a --master_port something else listens on is one line naming the port
    (exit 2), not the rendezvous' DistNetworkError traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "out")
        cmd = [sys.executable, "-m", "fastvideo.launch", "--nnodes=1", "--nproc_per_node=2", f"--master_port={port}",
               "fastvideo/train_grpo_flux.py", *argv]
        proc = subprocess.run(cmd, env=_launch_env(HF_HUB_OFFLINE="1"), cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 2 and lines[0].startswith("+ torchrun"), lines
    assert lines[1].startswith("train_grpo_flux: error: port ") and f"{port} on this node is in use" in lines[1]


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


@pytest.mark.parametrize("words, problem", [
    (["--use_group", "false"], "--use_group takes no value (got 'false'): write --use_group to turn it on, leave it "
                               "out to keep it off"),
    (["--h", "64", "64"], "unexpected word '64' on the command line (every setting is a --flag; a value belongs "
                          "right after its flag)"),
    (["stray", "--h", "64"], "unexpected word 'stray' on the command line"),
])
def test_a_value_for_a_switch_and_a_stray_word_are_refused(words, problem, tmp_path):
    """--use_group false used to read as --use_group on, and a stray word was dropped: both are a
    problem line, in the launcher's check and in the entry point run directly (exit 2)."""
    argv = ["--data_json_path", "x.json", "--pretrained_model_name_or_path", "m", *words]
    args, problems = preflight.parse_all(argv)
    assert args is None and len(problems) == 1 and problems[0].startswith(problem)
    proc = subprocess.run([sys.executable, "fastvideo/train_grpo_flux.py", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": python_path(ROOT)})
    assert proc.returncode == 2 and problem in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_a_repeated_value_after_an_unknown_flag_is_that_flags():
    """'1' is --max_train_steps' value and then --bogus_flag's: one problem, the unknown flag."""
    args, problems = preflight.parse_all(["--data_json_path", "x.json", "--pretrained_model_name_or_path", "m",
                                          "--max_train_steps", "1", "--bogus_flag", "1", "--use_group", "1"])
    assert problems == ["unknown flag --bogus_flag", "--use_group takes no value (got '1'): write --use_group to "
                        "turn it on, leave it out to keep it off"]


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
