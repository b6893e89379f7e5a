"""Crashes that leave torn logs or half-published best/ lose nothing: readers drop a torn last line
(saying so), resume rewrites the logs atomically, publish_best's leftovers are recovered, and an
evaluation that was due but not recorded runs again on resume."""

from __future__ import annotations

import json
import os

import pytest

from helpers import train_args
from fastvideo.eval.report import read_jsonl, truncate_jsonl
from fastvideo.training.run.guard import BEST_DIR, publish_best, recover_best
from fastvideo.training.metrics import MetricsWriter
from fastvideo.utils import LogFileError


def _lines(n):
    return "".join(json.dumps({"iteration": i, "loss": i / 3}, sort_keys=True) + "\n" for i in range(1, n + 1))


def test_torn_last_line_is_dropped_and_named(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines(3) + '{"iteration": 4, "lo')
    assert [r["iteration"] for r in read_jsonl(path)] == [1, 2, 3]
    err = capsys.readouterr().err
    assert str(path) in err and "torn last line 4" in err and '{"iteration": 4, "lo' in err
    path.write_text(_lines(3))
    assert len(read_jsonl(path)) == 3 and capsys.readouterr().err == ""  # an intact file: no word


def test_damage_before_the_last_line_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text(_lines(1) + "garbage\n" + _lines(2))
    with pytest.raises(LogFileError, match=r"eval.jsonl line 2 is not JSON"):
        read_jsonl(path)


def test_truncations_rewrite_atomically(tmp_path, monkeypatch, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_lines(5) + '{"itera')
    writer = MetricsWriter(tmp_path, enabled=True)
    replaced = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (replaced.append((str(a), str(b))), real(a, b))[1])
    writer.truncate_after(3)
    assert metrics.read_text() == _lines(3)  # the same text as written, torn line and later ones gone
    ev = tmp_path / "eval.jsonl"
    ev.write_text(_lines(4) + '{"iteration": 5')
    assert [r["iteration"] for r in truncate_jsonl(ev, 2)] == [1, 2] and ev.read_text() == _lines(2)
    assert [b for _, b in replaced] == [str(metrics), str(ev)]  # write-then-rename, never in place
    assert not list(tmp_path.glob(".*.tmp"))
    assert "eval.jsonl: dropped its torn last line" in capsys.readouterr().err


def _checkpoint(root, it):
    ckpt = root / f"checkpoint-{it}"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"w%d" % it)
    return ckpt


def test_recover_best_after_a_crash_between_the_renames(tmp_path):
    publish_best(_checkpoint(tmp_path, 2), tmp_path, 2, 1.0)
    # The crash: best/ moved aside, the new one built but not yet swapped in.
    os.replace(tmp_path / BEST_DIR, tmp_path / "best.old-abc")
    publish_best(_checkpoint(tmp_path, 4), tmp_path, 4, 2.0)
    os.replace(tmp_path / BEST_DIR, tmp_path / "best.tmp-xyz")
    recover_best(tmp_path)
    assert json.loads((tmp_path / BEST_DIR / "BEST.json").read_text())["iteration"] == 2
    assert (tmp_path / BEST_DIR / "model.safetensors").read_bytes() == b"w2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [BEST_DIR, "checkpoint-2", "checkpoint-4"]
    # After the second rename: best/ is the new one, the old one is only removed.
    (tmp_path / "best.old-def").mkdir()
    recover_best(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [BEST_DIR, "checkpoint-2", "checkpoint-4"]


def test_resume_after_torn_logs_reruns_the_unrecorded_evaluation(tiny_flux_dir, tiny_embeddings, eval_prompt_file,
                                                                tmp_path, monkeypatch, capsys):
    """The crash: checkpoint 1 written, its evaluation's eval.jsonl line cut mid-line, and a torn
    metrics line of iteration 2. Resuming (no iterations left) drops both torn lines, saying so,
    runs evaluation 1 again with the same result, and best/ follows it."""
    from fastvideo.train_grpo_flux import main

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    out = tmp_path / "run"
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, save_images_every=0, eval_every=1,
                      eval_prompts=str(eval_prompt_file), eval_rewards="detail", eval_num_images_per_prompt=1,
                      eval_batch_size=6, max_train_steps=1, checkpointing_steps=1)
    assert main(argv) == 0
    full = read_jsonl(out / "eval.jsonl")
    text = (out / "eval.jsonl").read_text()
    (out / "eval.jsonl").write_text(text[:text.rindex('{"best_iteration"') + 25])  # record 1 torn
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 2, "loss": 0.12')
    capsys.readouterr()
    assert main(argv + ["--resume_from_checkpoint", "latest"]) == 0
    err = capsys.readouterr()
    said = err.out + err.err
    assert "metrics.jsonl: dropped its torn last line 2" in said and "eval.jsonl: dropped its torn last line 2" in said
    assert "evaluation 1 was due but not recorded" in said
    again = read_jsonl(out / "eval.jsonl")
    assert [r["iteration"] for r in again] == [0, 1]
    strip = lambda r: {k: v for k, v in r.items() if k != "time_eval"}  # noqa: E731
    assert strip(again[1]) == strip(full[1])
    assert [r["iteration"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    assert json.loads((out / BEST_DIR / "BEST.json").read_text())["iteration"] == again[1]["best_iteration"] == 1


def test_a_log_damaged_before_its_last_line_stops_every_rank_with_one_line(tiny_flux_dir, tiny_embeddings,
                                                                          eval_prompt_file, tmp_path):
    """Issue #39 item 18: rank 0 refuses the damaged eval.jsonl, and rank 1 stops with it (exit 2,
    silent) instead of going on to a collective rank 0 never joins (a gloo traceback, exit 1); under
    the launcher, one line and exit 2 (metrics.jsonl: test_every_rank_stops_on_rank_0s_damaged_metrics)."""
    log = "eval.jsonl"
    from helpers import torchrun

    out = tmp_path / "run"
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=2, checkpointing_steps=1,
                      save_images_every=0, fsdp_sharding_strategy="none", eval_every=1,
                      eval_prompts=str(eval_prompt_file), eval_rewards="compressibility", eval_steps=2)
    first = torchrun(argv)
    assert first.returncode == 0, first.stderr[-3000:]
    path = out / log
    lines = path.read_text().splitlines()
    path.write_text("\n".join(["garbage", *lines[1:]]) + "\n")  # the first of its lines damaged
    import subprocess
    import sys

    from helpers import ROOT, python_path

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": python_path(ROOT), "FASTVIDEO_DEVICE": "cpu",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    resumed = subprocess.run([sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=2",
                              "fastvideo/train_grpo_flux.py", *argv, "--resume_from_checkpoint", str(out / "checkpoint-1")],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    err = resumed.stderr
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("+ torchrun")]
    assert resumed.returncode == 2 and "Traceback" not in err and "gloo" not in err, err[-3000:]
    assert len(lines) == 1 and f"{log} line 1 is not JSON" in lines[0], lines


def _resume_with_damaged_metrics(info, out_dir):
    """Trainer._maybe_resume on a stand-in trainer (rank 0 writes metrics.jsonl): what each rank raises."""
    from types import SimpleNamespace

    import torch

    from fastvideo.training.trainer import Trainer

    nothing = SimpleNamespace()
    fake = SimpleNamespace(
        resume_path="checkpoint-1", cfg=SimpleNamespace(output=SimpleNamespace(resume_allow_changes=False)),
        sampler=nothing, stateful_parts=lambda: {"randomness": nothing},
        checkpointer=SimpleNamespace(load=lambda *a, **k: None), model=None, optimizer=None, lr_scheduler=None,
        ema=None, objective=SimpleNamespace(weight_sets=lambda: {}), iteration=1, info=info,
        device=torch.device("cpu"), metrics=MetricsWriter(out_dir, enabled=info.rank == 0))
    try:
        Trainer._maybe_resume(fake)
    except Exception as exc:  # noqa: BLE001 - the test compares what each rank raised
        return type(exc).__name__
    return None


def test_every_rank_stops_on_rank_0s_damaged_metrics(tmp_path):
    """The rank that reads metrics.jsonl (0) raises its LogFileError, the other stops with it
    (PeerRefused: silent, exit 2) instead of going on to the next collective alone."""
    from dist_utils import run_distributed

    (tmp_path / "metrics.jsonl").write_text("garbage\n" + _lines(2))
    assert run_distributed(_resume_with_damaged_metrics, str(tmp_path)) == ["LogFileError", "PeerRefused"]
