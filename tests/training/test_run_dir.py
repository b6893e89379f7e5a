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


def test_a_worker_whose_launcher_died_before_the_guard_exits(tmp_path):
    """Issue #39 item 9: the launcher dies while the worker still starts (before PR_SET_PDEATHSIG is
    armed; the worker is re-parented, so 'my parent now' would be init): checked against the pid it
    was started by, the worker exits at once instead of living on as an orphan."""
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux only")
    ready, armed = tmp_path / "ready", tmp_path / "armed"
    worker = (f"import os, time; start = os.getppid(); open({str(ready)!r}, 'w').write(str(os.getpid())); "
              "deadline = time.monotonic() + 30\n"
              "while os.getppid() == start and time.monotonic() < deadline: time.sleep(0.01)\n"
              "from fastvideo.training.run.control import die_with_parent; die_with_parent(parent=start); "
              f"open({str(armed)!r}, 'w').write('survived'); time.sleep(60)")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(60)"], env=env)
    import time

    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(ready.read_text())
    parent.kill()  # kill -9 of the launcher, before the worker armed its guard
    parent.wait()
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child) and not armed.exists()


def test_workers_never_outlive_a_launcher_killed_as_they_start(tiny_flux_dir, tiny_embeddings, tmp_path):
    """kill -9 of fastvideo.launch the moment its 2 workers exist, while they are still starting (a
    sitecustomize holds each worker's Python start-up for 2 s, as slow imports from a shared file
    system do): no worker survives (they are gone within 30 s; an orphan would train for minutes)."""
    import signal
    import time

    from helpers import train_args

    slow_site = tmp_path / "slow_site"
    slow_site.mkdir()
    (slow_site / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('TORCHELASTIC_RUN_ID'):\n    time.sleep(2)\n")
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "out", max_train_steps=50)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join([str(slow_site), str(ROOT)]),
           "FASTVIDEO_DEVICE": "cpu", "FASTVIDEO_PREFLIGHT": "0", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    launcher = subprocess.Popen([sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=2",
                                 "fastvideo/train_grpo_flux.py", *argv], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, workers = time.monotonic() + 120, []
    try:
        while len(workers) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, "the launcher never started 2 workers"
            workers = _children(launcher.pid)
            time.sleep(0.005)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    deadline = time.monotonic() + 30
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [w for w in workers if _running(w)]
    for w in alive:  # do not leave them behind if the test fails
        os.kill(w, signal.SIGKILL)
    assert not alive, "orphaned workers"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(") ", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its new parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] not in "ZX"
    except FileNotFoundError:
        return False
