"""Output folders: a non-empty folder is refused unless resumed or --overwrite; --overwrite deletes
only what a run writes; the lock refuses a live run and is taken over after a crash."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from pathlib import Path

from fastvideo.errors import ConfigError
from fastvideo.training.run import output_dir as run_dir

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _write_lock(folder, pid, host=None):
    (folder / run_dir.LOCK_NAME).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                                        "started": "2026-01-01T00:00:00"}))


def _earlier_run(folder):
    (folder / "checkpoint-10").mkdir(parents=True)
    (folder / "checkpoint-10" / "model.safetensors").write_bytes(b"x")
    (folder / "metrics.jsonl").write_text("{}\n")
    (folder / "images" / "step_000001").mkdir(parents=True)
    (folder / "best").mkdir()
    (folder / "eval_grid.png").write_bytes(b"png")
    (folder / "eval" / "rows").mkdir(parents=True)
    (folder / "notes.txt").write_text("the user's own file")


def test_empty_or_missing_folders_are_accepted(tmp_path):
    assert run_dir.folder_problems(tmp_path / "new", resume=False, overwrite=False) == []
    assert run_dir.folder_problems(tmp_path, resume=False, overwrite=False) == []


def test_a_folder_with_outputs_is_refused_unless_resumed_or_overwritten(tmp_path):
    _earlier_run(tmp_path)
    [problem] = run_dir.folder_problems(tmp_path, resume=False, overwrite=False)
    assert "already holds" in problem and "--resume_from_checkpoint latest" in problem and "--overwrite" in problem
    assert run_dir.folder_problems(tmp_path, resume=True, overwrite=False) == []
    with pytest.raises(ConfigError, match="already holds"):
        run_dir.prepare_output_dir(tmp_path, resume=False, overwrite=False)
    assert (tmp_path / "checkpoint-10").is_dir()  # refused: nothing deleted
    assert not (tmp_path / run_dir.LOCK_NAME).exists()


def test_overwrite_deletes_only_what_a_run_writes(tmp_path):
    _earlier_run(tmp_path)
    notes = run_dir.prepare_output_dir(tmp_path, resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", run_dir.LOCK_NAME]
    assert "checkpoint-10" in notes[0] and "notes.txt" not in notes[0]
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"
    run_dir.release_lock(tmp_path)
    assert not (tmp_path / run_dir.LOCK_NAME).exists()


def test_a_live_lock_refuses_and_a_stale_one_is_taken_over(tmp_path):
    live = subprocess.Popen(["sleep", "60"])
    try:
        _write_lock(tmp_path, live.pid)
        with pytest.raises(ConfigError, match=f"in use by another run \\(pid {live.pid}"):
            run_dir.prepare_output_dir(tmp_path, resume=True, overwrite=False)
        # even --overwrite does not clear a live run's folder
        assert "in use" in run_dir.folder_problems(tmp_path, resume=False, overwrite=True)[0]
    finally:
        live.kill()
        live.wait()
    _write_lock(tmp_path, _dead_pid())  # a crashed run's lock
    assert run_dir.folder_problems(tmp_path, resume=False, overwrite=False) == []
    run_dir.prepare_output_dir(tmp_path, resume=False, overwrite=False)
    assert run_dir.read_lock(tmp_path).pid == os.getpid()
    (tmp_path / run_dir.LOCK_NAME).write_text("{tor")  # torn by a crash while writing: stale
    run_dir.acquire_lock(tmp_path)
    assert run_dir.read_lock(tmp_path).pid == os.getpid()


def test_a_lock_from_another_host_is_not_guessed_stale(tmp_path):
    _write_lock(tmp_path, _dead_pid(), host="some-other-node")
    [problem] = run_dir.folder_problems(tmp_path, resume=True, overwrite=False)
    assert "some-other-node" in problem and run_dir.LOCK_NAME in problem


def test_release_never_removes_another_runs_lock(tmp_path):
    _write_lock(tmp_path, _dead_pid())
    run_dir.release_lock(tmp_path)
    assert (tmp_path / run_dir.LOCK_NAME).exists()


def test_die_with_parent_kills_an_orphan(tmp_path):
    """A worker whose launcher is killed (kill -9) dies too (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux only")
    pid_file = tmp_path / "pid"
    worker = (f"import time; from fastvideo.training.run.control import die_with_parent; "
              f"assert die_with_parent(); open({str(pid_file)!r}, 'w').write(str(__import__('os').getpid())); "
              "time.sleep(60)")
    # A bare environment: the session's PYTHONPATH carries an HCCL-rules sitecustomize that imports torch.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); "
                               "time.sleep(60)"], env=env)
    import time

    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    while run_dir.pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
        try:  # reap it if it became ours (it is not: it is re-parented to init or a subreaper)
            os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            pass
    assert not _running(child)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its new parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] not in "ZX"
    except FileNotFoundError:
        return False
