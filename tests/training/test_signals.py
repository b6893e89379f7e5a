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
