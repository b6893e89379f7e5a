"""Flags changed on resume are applied and logged: a new --learning_rate (which the checkpoint's LR
schedule would otherwise undo) and the cadences the loop reads every iteration."""

from __future__ import annotations

import torch
from helpers import read_metrics, train_args

from fastvideo.training.run.resume_changes import apply_learning_rate, cadence_changes


def _schedule(lr: float, kind: str = "linear"):
    from diffusers.optimization import get_scheduler

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)
    return opt, get_scheduler(kind, optimizer=opt, num_warmup_steps=2, num_training_steps=10)


def test_a_new_learning_rate_replaces_the_restored_one_with_the_schedules_factor():
    opt, sched = _schedule(1e-3)
    for _ in range(4):
        opt.step()
        sched.step()
    new_opt, new_sched = _schedule(5e-3)
    new_opt.load_state_dict(opt.state_dict())
    new_sched.load_state_dict(sched.state_dict())
    assert new_sched.get_last_lr()[0] == sched.get_last_lr()[0]  # the checkpoint's rate came back
    assert apply_learning_rate(new_opt, new_sched, 5e-3) == 1e-3
    ref_opt, ref_sched = _schedule(5e-3)  # a run that had 5e-3 from the start
    for _ in range(4):
        ref_opt.step()
        ref_sched.step()
    assert abs(new_sched.get_last_lr()[0] - ref_sched.get_last_lr()[0]) < 1e-12
    new_opt.step()
    new_sched.step()
    ref_opt.step()
    ref_sched.step()
    assert abs(new_opt.param_groups[0]["lr"] - ref_opt.param_groups[0]["lr"]) < 1e-12
    assert apply_learning_rate(new_opt, new_sched, 5e-3) is None  # unchanged: nothing touched


def test_cadence_changes_name_each_flag():
    old = {"optim": {"max_train_steps": 4}, "output": {"log_every": 1, "checkpointing_steps": 2}, "eval": None}
    new = {"optim": {"max_train_steps": 6}, "output": {"log_every": 1, "checkpointing_steps": 3},
           "eval": {"every": 2}}
    assert cadence_changes(old, new) == ["--max_train_steps 4 -> 6", "--checkpointing_steps 2 -> 3"]
    assert cadence_changes(None, new) == []


def test_resume_with_a_new_learning_rate_trains_with_it(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch,
                                                        capsys):
    from fastvideo.train_grpo_flux import main

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    out = tmp_path / "run"
    common = dict(save_images_every=0, fsdp_sharding_strategy="none", checkpointing_steps=1)
    assert main(train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=1, **common)) == 0
    assert read_metrics(out)[0]["lr"] == 1e-3
    assert main(train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=2, learning_rate=2e-3,
                           log_every=2, resume_from_checkpoint="latest", **common)) == 0
    text = capsys.readouterr().out
    for line in ("--learning_rate 0.001 -> 0.002", "--max_train_steps 1 -> 2", "--log_every 1 -> 2"):
        assert f"[resume] applied a changed setting: {line}" in text, text[-2000:]
    assert text.count("[resume] WARNING: --learning_rate 0.002 replaces the checkpoint's 0.001 (a launcher's own "
                      "--learning_rate counts); to keep the saved rate, add --learning_rate 0.001") == 1, text[-2000:]
    assert [r["lr"] for r in read_metrics(out)] == [1e-3, 2e-3]
