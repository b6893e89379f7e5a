"""Evaluation inside tiny training runs: eval.jsonl at iteration 0 and every N, identical across
reruns and world sizes; the reward-hacking guard stops a compressibility run; OUTPUT_DIR/best."""

from __future__ import annotations

import json

import pytest

from helpers import read_metrics, torchrun, train_args
from fastvideo.eval.report import read_jsonl
from fastvideo.training.run.guard import RewardHackingGuard


def _run_single(argv, monkeypatch) -> int:
    from fastvideo.train_grpo_flux import main

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    return main(argv)


def _eval_args(json_path, model_dir, out, prompts, **overrides):
    flags = dict(save_images_every=0, eval_every=2, eval_prompts=str(prompts), eval_rewards="detail,saturation",
                 eval_num_images_per_prompt=2, eval_batch_size=4)
    flags.update(overrides)
    return train_args(json_path, model_dir, out, **flags)


def _without_time(records):
    return [{k: v for k, v in r.items() if k != "time_eval"} for r in records]


@pytest.mark.slow
def test_two_rank_eval_is_identical_across_reruns_and_world_sizes(
        tiny_flux_dir, tiny_embeddings, eval_prompt_file, tmp_path, monkeypatch):
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        proc = torchrun(_eval_args(tiny_embeddings, tiny_flux_dir, out, eval_prompt_file, max_train_steps=4,
                                   checkpointing_steps=4))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        runs.append(read_jsonl(out / "eval.jsonl"))
    assert [r["iteration"] for r in runs[0]] == [0, 2, 4]
    assert _without_time(runs[0]) == _without_time(runs[1])
    rec = runs[0][0]
    assert set(rec["rewards"]) == {"compressibility", "detail", "saturation"}
    assert len(rec["rewards"]["detail"]["per_prompt"]) == 6 and rec["time_eval"] > 0
    assert rec["trained_score"] == rec["rewards"]["compressibility"]["mean"]
    assert runs[0][1]["rewards"] != rec["rewards"]  # training moved the model
    out = tmp_path / "a"
    for name in ("eval_grid.png", "eval_curve.png", "eval/rows/row_000004.png"):
        assert (out / name).stat().st_size > 500, name

    one = tmp_path / "one"
    assert _run_single(_eval_args(tiny_embeddings, tiny_flux_dir, one, eval_prompt_file, max_train_steps=1,
                                  train_batch_size=2), monkeypatch) == 0
    single = read_jsonl(one / "eval.jsonl")
    assert [r["iteration"] for r in single] == [0]
    assert single[0]["rewards"] == rec["rewards"]  # the base model: same noise, same scores at 1 and 2 ranks


def _guard_args(json_path, model_dir, out, prompts, **overrides):
    # Settings under which compressibility visibly rises within a few iterations on the tiny model.
    flags = dict(learning_rate=1e-2, num_generations=4, train_batch_size=2, rollout_batch_size=8,
                 train_micro_batch_size=8, clip_range=0.2, timestep_fraction=1.0, max_grad_norm=10, eval_every=1,
                 eval_rewards="detail", eval_batch_size=12)
    flags.update(overrides)
    return _eval_args(json_path, model_dir, out, prompts, **flags)


def _reference_guard(records, patience, drop):
    """First iteration at which the guard should fire, and the best iteration, from the records."""
    guard = RewardHackingGuard(patience, drop)
    fired = None
    for r in records:
        if guard.update(r["iteration"], r["trained_score"], r["rewards"]["detail"]["mean"]).fired and fired is None:
            fired = r["iteration"]
    return fired, guard.best_iteration


@pytest.mark.slow
def test_guard_stops_a_compressibility_run_and_best_survives_rotation(
        tiny_flux_dir, tiny_embeddings, eval_prompt_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "guarded"
    # A clear trend on both library lines' tiny models (their seeded weights differ: diffusers 0.42 and
    # transformers 5 build and initialise modules in another order): the first update at learning rate 0
    # (warm-up) leaves the base model, which becomes the best checkpoint; then compressibility climbs
    # and detail falls within 2-3 iterations (measured: fired at 4 on the recipe line, 5 on the current
    # one; at 1e-2 without warm-up the current line's run drifted for 12 iterations before it hacked).
    argv = _guard_args(tiny_embeddings, tiny_flux_dir, out, eval_prompt_file, max_train_steps=12,
                       checkpointing_steps=1, checkpoints_total_limit=1, guard_reward="detail", guard_patience=2,
                       guard_action="stop", learning_rate=3e-2, lr_warmup_steps=2)
    assert _run_single(argv, monkeypatch) == 0
    text = capsys.readouterr().out
    records = read_jsonl(out / "eval.jsonl")
    fired, best = _reference_guard(records, 2, 0.0)
    assert fired is not None and fired < 12, [(r["iteration"], r["trained_score"], r["guard_score"]) for r in records]
    last = records[-1]
    assert last["iteration"] == fired and last["guard"]["fired"] and last["guard"]["streak"] == 2
    assert last["trained_score"] > records[0]["trained_score"]  # compressibility went up ...
    assert last["guard_score"] < max(r["guard_score"] for r in records)  # ... while detail fell
    assert [r["iteration"] for r in read_metrics(out)] == list(range(1, fired + 1))
    assert "reward hacking suspected" in text and f"stopping the run at iteration {fired}" in text
    # The stop wrote a checkpoint; rotation (limit 1) deleted the best one, but best/ survives.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{fired}"]
    assert best is not None and best < fired and last["best_iteration"] == best
    marker = json.loads((out / "best" / "BEST.json").read_text())
    assert marker["iteration"] == best and marker["source"] == f"checkpoint-{best}"
    assert json.loads((out / "best" / "COMPLETE.json").read_text())["iteration"] == best
    from fastvideo.training.checkpoint import verify_checkpoint

    verify_checkpoint(out / "best")


@pytest.mark.slow
def test_without_the_guard_the_same_run_goes_on(tiny_flux_dir, tiny_embeddings, eval_prompt_file, tmp_path,
                                                monkeypatch, capsys):
    out = tmp_path / "unguarded"
    argv = _guard_args(tiny_embeddings, tiny_flux_dir, out, eval_prompt_file, max_train_steps=7, checkpointing_steps=7)
    assert _run_single(argv, monkeypatch) == 0
    assert "[guard]" not in capsys.readouterr().out
    assert [r["iteration"] for r in read_metrics(out)] == list(range(1, 8))
    records = read_jsonl(out / "eval.jsonl")
    assert [r["iteration"] for r in records] == list(range(8)) and "guard" not in records[-1]
    best = max(records[1:], key=lambda r: r["trained_score"])["iteration"]
    assert json.loads((out / "best" / "BEST.json").read_text())["iteration"] == best


def test_resumed_run_continues_eval_jsonl_and_guard(tiny_flux_dir, tiny_embeddings, eval_prompt_file, tmp_path,
                                                    monkeypatch):
    common = dict(eval_every=1, guard_reward="detail", guard_patience=5, guard_drop=1.0, checkpointing_steps=2)
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert _run_single(_eval_args(tiny_embeddings, tiny_flux_dir, straight, eval_prompt_file, max_train_steps=3,
                                  **common), monkeypatch) == 0
    assert _run_single(_eval_args(tiny_embeddings, tiny_flux_dir, split, eval_prompt_file, max_train_steps=3,
                                  **common), monkeypatch) == 0
    # Resume from iteration 2: the record of iteration 3 is dropped and written again.
    assert _run_single(_eval_args(tiny_embeddings, tiny_flux_dir, split, eval_prompt_file, max_train_steps=3,
                                  resume_from_checkpoint=str(split / "checkpoint-2"), **common), monkeypatch) == 0
    a, b = read_jsonl(straight / "eval.jsonl"), read_jsonl(split / "eval.jsonl")
    assert [r["iteration"] for r in b] == [0, 1, 2, 3]
    assert _without_time(a) == _without_time(b)  # including the guard's streak and best_iteration
    best = json.loads((straight / "best" / "BEST.json").read_text())["iteration"]
    assert json.loads((split / "best" / "BEST.json").read_text())["iteration"] == best


def test_resume_forgets_a_best_from_the_abandoned_future(tmp_path):
    from fastvideo.eval.loop import TrainingEvaluation
    from fastvideo.training.run.guard import publish_best

    for it in (2, 4):
        ckpt = tmp_path / f"checkpoint-{it}"
        ckpt.mkdir()
        (ckpt / "COMPLETE.json").write_text(json.dumps({"iteration": it, "files": {}}))
    publish_best(tmp_path / "checkpoint-4", tmp_path, 4, 9.0)
    ev = TrainingEvaluation.__new__(TrainingEvaluation)
    ev.out, ev.guard = tmp_path, RewardHackingGuard(guard_enabled=False)
    for it, score in ((0, 0.0), (1, 2.0), (2, 3.0)):
        ev.guard.update(it, score)
    ev._forget_other_best(3)
    assert json.loads((tmp_path / "best" / "BEST.json").read_text())["iteration"] == 2
    ev.guard.best_iteration = 1  # its checkpoint is gone: best/ is removed rather than left wrong
    publish_best(tmp_path / "checkpoint-4", tmp_path, 4, 9.0)
    ev._forget_other_best(3)
    assert not (tmp_path / "best").exists()


def test_resume_checks_best_files_against_their_checksums(tmp_path, capsys):
    """Issue #39 item 18: a bit flip in best/ is found on resume: best/ is published again from its
    intact checkpoint, or removed when that checkpoint is damaged too (best/'s files are hard links
    of the checkpoint's: a flip in place damages both)."""
    import os

    from fastvideo.eval.loop import TrainingEvaluation
    from fastvideo.training.checkpoint.files import file_digest
    from fastvideo.training.run.guard import publish_best

    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights of iteration 2")
    (ckpt / "COMPLETE.json").write_text(json.dumps({"iteration": 2, "files": {"model.safetensors": 22},
                                                    "sha256": {"model.safetensors": file_digest(ckpt / "model.safetensors")}}))
    ev = TrainingEvaluation.__new__(TrainingEvaluation)
    ev.out, ev.guard = tmp_path, RewardHackingGuard(guard_enabled=False)
    for it, score in ((0, 0.0), (2, 3.0)):
        ev.guard.update(it, score)
    publish_best(ckpt, tmp_path, 2, 3.0)
    ev._forget_other_best(2)  # intact: left as it is
    assert capsys.readouterr().out == ""
    model = tmp_path / "best" / "model.safetensors"
    os.unlink(model)  # a new file (another inode) with one bit flipped: the checkpoint's own copy is intact
    model.write_bytes(b"weights of iteration 3")
    ev._forget_other_best(2)
    assert model.read_bytes() == b"weights of iteration 2"
    out = capsys.readouterr().out
    assert "best was damaged (" in out and "model.safetensors does not match its sha256" in out and "published again" in out
    with open(model, "r+b") as f:  # in place: the hard-linked checkpoint file flips too
        f.write(b"W")
    ev._forget_other_best(2)
    assert not (tmp_path / "best").exists()
    assert "removed" in capsys.readouterr().out
