"""Preemption: SIGTERM to the launcher mid-iteration on 2 ranks finishes the iteration, writes a
checkpoint, prints the resume command and exits 0; running that command gives the metrics of an
uninterrupted run bit for bit."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import python_path, read_metrics, torchrun, train_args

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("time_", "samples_per_s", "peak_memory_gb")


def _env() -> dict:
    return dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                PYTHONPATH=python_path(ROOT))


def _launch_cmd(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=2",
            "fastvideo/train_grpo_flux.py", *argv]


def _values(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def _wait_for_rows(path: Path, n: int, proc: subprocess.Popen, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if path.is_file() and len([ln for ln in path.read_text().splitlines() if ln.strip()]) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} metrics rows in {timeout_s} s")


@pytest.mark.slow
def test_sigterm_mid_iteration_then_resume_equals_an_uninterrupted_run(tiny_flux_dir, tiny_embeddings, tmp_path):
    flags = dict(max_train_steps=4, checkpointing_steps=100, save_images_every=0, checkpoints_total_limit=5)
    full = tmp_path / "full"
    done = torchrun(train_args(tiny_embeddings, tiny_flux_dir, full, **flags), timeout=600)  # the reference run
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "stopped"
    proc = subprocess.Popen(_launch_cmd(train_args(tiny_embeddings, tiny_flux_dir, out, **flags)), env=_env(),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_rows(out / "metrics.jsonl", 1, proc)  # iteration 2 is under way
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "ChildFailedError" not in stderr, stderr[-3000:]
    hint = stdout.splitlines()[stdout.splitlines().index(next(ln for ln in stdout.splitlines()
                                                              if ln.startswith("[stop] SIGTERM"))) + 1]
    stopped_at = len(read_metrics(out))
    assert 2 <= stopped_at < 4 and (out / f"checkpoint-{stopped_at}" / "COMPLETE.json").is_file()
    assert f"--resume_from_checkpoint {out / f'checkpoint-{stopped_at}'}" in hint
    assert not (out / "train.lock").exists()

    resumed = subprocess.run(shlex.split(hint), env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _values(read_metrics(out)) == _values(read_metrics(full))


@pytest.mark.slow
def test_sigterm_to_a_plain_torchrun_keeps_the_checkpoint_and_names_the_agents_traceback(tiny_flux_dir,
                                                                                         tiny_embeddings, tmp_path):
    """Issue #39 item 17, a plain torchrun (not fastvideo.launch): the workers finish the iteration, write
    the checkpoint, print the resume command and exit 0 without a traceback; the one traceback left is
    torchrun's agent's own SignalException (its pid, torch's code: the exit status 1 is its), and rank 0
    says so in one line after the checkpoint."""
    out = tmp_path / "plain"
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=6, checkpointing_steps=100,
                      save_images_every=0)
    env = {k: v for k, v in _env().items() if k not in ("FASTVIDEO_LAUNCHER_PID", "FASTVIDEO_CONTROL_DIR")}
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "300"  # torchrun's own 30 s could cut a loaded machine's checkpoint
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "fastvideo/train_grpo_flux.py", *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_rows(out / "metrics.jsonl", 1, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=600)
    stopped_at = len(read_metrics(out))
    assert 1 <= stopped_at < 6 and (out / f"checkpoint-{stopped_at}" / "COMPLETE.json").is_file(), stderr[-3000:]
    assert f"[stop] SIGTERM: checkpoint {out / f'checkpoint-{stopped_at}'} written" in stdout, stdout[-2000:]
    assert f"--resume_from_checkpoint {out / f'checkpoint-{stopped_at}'}" in stdout
    assert stderr.count("Traceback") == 1, stderr[-4000:]  # the agent's; no worker's
    assert f"SignalException: Process {proc.pid} got signal: {int(signal.SIGTERM)}" in stderr, stderr[-2000:]
    note = [ln for ln in stderr.splitlines() if ln.startswith("[stop] SIGTERM: the checkpoint above is complete")]
    assert len(note) == 1 and "exits 0 instead" in note[0], stderr[-3000:]
    assert proc.returncode == 1  # torchrun's agent, re-raising the signal as SignalException
    assert not (out / "train.lock").exists()


def test_the_plain_torchrun_note_only_under_a_plain_torchrun(monkeypatch):
    from fastvideo.training.run.control import LAUNCHER_PID_ENV, plain_torchrun_note

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv(LAUNCHER_PID_ENV, raising=False)
    assert plain_torchrun_note(signal.SIGTERM) is None  # no torchrun at all
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert "exits 130 instead" in plain_torchrun_note(signal.SIGINT)
    monkeypatch.setenv(LAUNCHER_PID_ENV, "123")  # fastvideo.launch: it exits 0 / 130 itself
    assert plain_torchrun_note(signal.SIGTERM) is None


def test_the_resume_command_gives_each_flag_once_with_the_value_argparse_used(monkeypatch):
    """A launcher's own flags come first and the user's repeat wins: the command keeps the winner."""
    from fastvideo.config import parse_config
    from fastvideo.training.run.control import LAUNCH_ENV, resume_command

    monkeypatch.delenv(LAUNCH_ENV, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    argv = ["fastvideo/train_grpo_flux.py", "--data_json_path", "d.json", "--pretrained_model_name_or_path", "m",
            "--rewards", "compressibility", "--learning_rate", "1e-5", "--use_group", "--h", "64",
            "--learning_rate=3e-5", "--overwrite", "--h", "32", "--use_group", "--resume_from_checkpoint", "old"]
    words = shlex.split(resume_command(argv, "out/checkpoint-4"))
    assert words == ["torchrun", "--nproc_per_node=2", "fastvideo/train_grpo_flux.py", "--data_json_path", "d.json",
                     "--pretrained_model_name_or_path", "m", "--rewards", "compressibility", "--learning_rate=3e-5",
                     "--h", "32", "--use_group", "--resume_from_checkpoint", "out/checkpoint-4"]
    given = parse_config([w for w in argv[1:-2] if w != "--overwrite"])
    assert parse_config(words[3:-2]) == given  # the configuration of the command it continues


@pytest.mark.parametrize("rank, printed", [("0", True), ("1", False)])
def test_the_stop_notice_is_printed_by_rank_0_only(monkeypatch, capsys, rank, printed):
    from fastvideo.training.run.control import StopRequest

    monkeypatch.setenv("RANK", rank)
    stop = StopRequest()
    stop._handle(signal.SIGTERM, None)
    assert stop.signum == signal.SIGTERM  # every rank stops
    assert ("[stop] SIGTERM received" in capsys.readouterr().err) == printed


def _worker_pid(launcher: int, rank: int) -> int:
    """The pid of worker ``rank`` among the launcher's children (torchrun's agent runs in it)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no worker of rank {rank} among {children}")


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_every_rank_with_a_checkpoint_and_one_line(tiny_flux_dir, tiny_embeddings,
                                                                               tmp_path):
    """Issue #51 item 5, a scheduler killing one rank: the others learn it when they agree at the end of
    the iteration, the checkpoint is written and loads, the launcher says so in one line, exit 0 (the
    SIGTERM exit of docs/operations.md), no gloo traceback."""
    from fastvideo.training.checkpoint.files import verify_checkpoint

    out = tmp_path / "one"
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=4, checkpointing_steps=100,
                      save_images_every=0)
    proc = subprocess.Popen(_launch_cmd(argv), env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _wait_for_rows(out / "metrics.jsonl", 1, proc)
    os.kill(_worker_pid(proc.pid, 1), signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=600)
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("+ torchrun")]
    assert proc.returncode == 0, stderr[-4000:]
    assert lines == ["train_grpo_flux: SIGTERM reached rank 1 alone (not this launcher): every rank stopped after "
                     "the iteration under way; the checkpoint and the command that resumes it are above"], stderr[-4000:]
    stopped_at = len(read_metrics(out))
    checkpoint = out / f"checkpoint-{stopped_at}"
    assert 1 <= stopped_at < 4 and verify_checkpoint(checkpoint)["iteration"] == stopped_at
    assert f"[stop] SIGTERM: checkpoint {checkpoint} written" in stdout, stdout[-2000:]
    assert not (out / "train.lock").exists()


def test_a_worker_tells_a_stop_a_teardown_and_a_signal_to_it_alone(monkeypatch, tmp_path):
    from fastvideo.training.run import control

    monkeypatch.setenv(control.CONTROL_ENV, str(tmp_path))
    assert control._signal_kind(wait_s=0.1) == "lone"
    control.mark_teardown(tmp_path, [os.getpid() + 1])  # another worker's
    assert control._signal_kind(wait_s=0.1) == "lone"
    control.mark_teardown(tmp_path, [os.getpid()])
    assert control._signal_kind(wait_s=0.1) == "teardown"
    control.mark_stop_requested(tmp_path, signal.SIGTERM)
    assert control._signal_kind(wait_s=0.1) == "stop"
    (tmp_path / "teardown-7").unlink(missing_ok=True)
    control.mark_teardown(tmp_path, [7])  # the run ends after a stop request: no teardown marks
    assert not (tmp_path / "teardown-7").exists()
    monkeypatch.setenv("RANK", "1")
    stop = control.StopRequest()
    (tmp_path / control.STOP_MARK).unlink()
    (tmp_path / f"teardown-{os.getpid()}").unlink()
    monkeypatch.setattr(control, "_signal_kind", lambda: "lone")
    stop._handle(signal.SIGTERM, None)
    assert stop.signum == signal.SIGTERM and control.lone_signals(tmp_path) == {1: int(signal.SIGTERM)}


def test_the_launcher_marks_each_worker_its_agent_stops(monkeypatch, tmp_path):
    """fastvideo.launch's agent marks each worker pid before it signals them to stop (a peer failed):
    those workers exit at once; none is marked after a stop request."""
    from torch.distributed.elastic.multiprocessing import api

    from fastvideo import launch
    from fastvideo.training.run import control

    closed = []
    monkeypatch.setattr(api, "_terminate_process_handler", api._terminate_process_handler)
    monkeypatch.setattr(api.PContext, "close", lambda self, *a, **k: closed.append(sorted(os.listdir(tmp_path))))
    launch._mark_signals(tmp_path)

    class Workers:
        def pids(self):
            return {0: 11, 1: 12}

    api.PContext.close(Workers(), signal.SIGTERM)
    assert closed == [["teardown-11", "teardown-12"]]  # marked before torch's close signals them
    for mark in tmp_path.iterdir():
        mark.unlink()
    control.mark_stop_requested(tmp_path, signal.SIGTERM)
    api.PContext.close(Workers(), signal.SIGTERM)
    assert closed[-1] == ["stop"]
