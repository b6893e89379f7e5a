"""A run's output folder: refuse to mix two runs in one folder, clear one on --overwrite, and a
lock that refuses a second live run (and is taken over after a crash).

Rules (rank 0 applies them before any model loads; the pre-spawn check, fastvideo.preflight,
reports the same problems before torchrun starts):

- a folder holding anything but a stale lock is refused unless the run resumes
  (--resume_from_checkpoint) or clears it (--overwrite);
- --overwrite deletes only what a run writes (RUN_ENTRIES): a file of the user's stays;
- OUTPUT_DIR/train.lock holds {pid, host, started}; a lock whose process is gone (same host, pid not
  alive) is stale and taken over; a live one, or one from another host, refuses the run.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from fastvideo.errors import ConfigError, UserError

LOCK_NAME = "train.lock"
# What a training run writes into OUTPUT_DIR (checkpoints and their temporaries, metrics, the
# resolved config, images, evaluation files, the guard's best/ copy, atomic-write temporaries).
RUN_ENTRIES = ("config.json", "metrics.jsonl", "reward_curve.png", "eval", "eval.jsonl", "eval_*.png", "eval_*.jsonl",
               "best", "images", "checkpoint-*", ".*.tmp", LOCK_NAME)


class PeerRefused(UserError):
    """Another rank (rank 0) refused the output folder and says why; this rank stops silently."""


@dataclass(frozen=True)
class Lock:
    pid: int
    host: str
    started: str

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started}"


def is_run_entry(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_ENTRIES)


def read_lock(folder: str | Path) -> Lock | None:
    path = Path(folder) / LOCK_NAME
    try:
        d = json.loads(path.read_text())
        return Lock(int(d["pid"]), str(d["host"]), str(d["started"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):  # a torn lock (a crash while writing it) is stale
        return Lock(-1, socket.gethostname(), "unknown")


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def lock_is_live(lock: Lock) -> bool:
    """Whether ``lock`` may belong to a running run: its pid is alive on this host, or it is from
    another host (whose processes cannot be checked from here)."""
    return lock.host != socket.gethostname() or pid_alive(lock.pid)


def _lock_problem(folder: Path) -> str | None:
    lock = read_lock(folder)
    if lock is None or not lock_is_live(lock) or lock.pid == os.getpid():
        return None
    return (f"--output_dir {str(folder)!r} is in use by another run ({lock.describe()}): give another "
            f"--output_dir, or if that run is no longer running, delete {str(folder / LOCK_NAME)!r}")


def folder_problems(folder: str | Path, resume: bool, overwrite: bool) -> list[str]:
    """Why a run may not write into ``folder`` (empty if it may): a live lock, or earlier
    outputs without --resume_from_checkpoint / --overwrite."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"--output_dir {str(folder)!r} exists and is not a folder"] if folder.exists() else []
    problem = _lock_problem(folder)
    if problem:
        return [problem]
    entries = sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME)
    if entries and not resume and not overwrite:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        return [f"--output_dir {str(folder)!r} already holds a run's files ({shown}): continue it with "
                "--resume_from_checkpoint latest, clear it with --overwrite, or give a new --output_dir"]
    return []


def clear_run_outputs(folder: str | Path) -> list[str]:
    """Delete what a run writes in ``folder`` (RUN_ENTRIES, not the lock); returns the names
    deleted. Anything else (a file of the user's) is kept."""
    folder = Path(folder)
    removed = []
    for p in sorted(folder.iterdir()):
        if p.name == LOCK_NAME or not is_run_entry(p.name):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        removed.append(p.name)
    return removed


def acquire_lock(folder: str | Path) -> Path:
    """Write OUTPUT_DIR/train.lock for this process (refusing a live one); returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    problem = _lock_problem(folder)
    if problem:
        raise ConfigError(problem)
    path = folder / LOCK_NAME
    body = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for _ in range(2):
        try:  # O_EXCL: of two runs starting together, one gets the lock
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            problem = _lock_problem(folder)
            if problem:
                raise ConfigError(problem) from None
            path.unlink(missing_ok=True)  # stale: its run crashed
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(body) + "\n")
        return path
    raise ConfigError(f"could not lock --output_dir {str(folder)!r}: another run keeps taking it")


def release_lock(folder: str | Path) -> None:
    """Remove the lock if it is this process's (never another run's)."""
    lock = read_lock(folder)
    if lock is not None and lock.pid == os.getpid() and lock.host == socket.gethostname():
        try:
            (Path(folder) / LOCK_NAME).unlink()
        except FileNotFoundError:
            pass


def prepare_output_dir(folder: str | Path, resume: bool, overwrite: bool) -> list[str]:
    """Rank 0, before any model loads: refuse (ConfigError) or clear the folder, then lock it.
    Returns start-up notes (what --overwrite deleted)."""
    problems = folder_problems(folder, resume, overwrite)
    if problems:
        raise ConfigError(problems[0])
    notes = []
    if overwrite and not resume and Path(folder).is_dir():
        removed = clear_run_outputs(folder)
        if removed:
            notes.append(f"--overwrite: deleted the earlier run's {', '.join(removed)} from {folder}")
    acquire_lock(folder)
    return notes
