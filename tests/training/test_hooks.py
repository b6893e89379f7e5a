"""Trainer hooks: the per-iteration text line, and hooks called at their points of the loop."""

from __future__ import annotations

import pytest

from fastvideo.training.hooks import LogLineHook, TrainerHook, format_log_line
from helpers import single_process_trainer, train_args


def test_log_line_names_the_iteration_metrics_and_the_eta():
    record = {"iteration": 12, "reward_mean": -3.84123, "reward_std": 0.0912, "loss": -2.03e-4, "grad_norm": 0.41,
              "kl": 0.0012, "clip_fraction": 0.031, "skipped_steps": 0}
    line = format_log_line(record, 40, 0.5)
    assert line == ("[it 12/40] reward -3.841 +- 0.0912 | loss -0.000203 | grad_norm 0.41 | kl 0.0012 | "
                    "clip 0.031 | 0.50 s/it | ETA 14 s")
    assert "skipped 1" in format_log_line({**record, "skipped_steps": 1}, 40, 0.5)
    assert format_log_line(record, 4000, 2.0).endswith("ETA 2h12m")  # 3988 iterations left at 2 s
    assert format_log_line(record, 100, 1.0).endswith("ETA 1m28s")


def test_hooks_run_at_their_points_and_every_log_every_iterations(tiny_flux_dir, tiny_embeddings, tmp_path,
                                                                     monkeypatch, capsys):
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "run", max_train_steps=3, checkpointing_steps=2,
                      save_images_every=0, fsdp_sharding_strategy="none", log_every=2)
    trainer = single_process_trainer(argv, monkeypatch)
    seen = []

    class Recorder(TrainerHook):
        def on_train_start(self, t):
            seen.append(("start", t.iteration))

        def on_iteration_end(self, t, result):
            seen.append(("iteration", result.iteration, result.record["iteration"], tuple(result.advantages.shape)))

        def on_checkpoint(self, t, path):
            seen.append(("checkpoint", path.name))

        def on_step_end(self, t):
            seen.append(("step", t.iteration))
            return t.iteration == 3

        def on_train_end(self, t):
            seen.append(("end", t.iteration))

    trainer.add_hook(Recorder())
    trainer.train()
    assert seen == [("start", 0), ("iteration", 1, 1, (2,)), ("step", 1), ("iteration", 2, 2, (2,)),
                    ("checkpoint", "checkpoint-2"), ("step", 2), ("iteration", 3, 3, (2,)),
                    ("checkpoint", "checkpoint-3"), ("step", 3), ("end", 3)]
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[it ")]
    assert [l.split("]")[0] for l in lines] == ["[it 2/3"]  # --log_every 2: iteration 2 only


def test_log_every_must_not_be_negative(tiny_flux_dir, tiny_embeddings, tmp_path):
    from fastvideo.config import parse_config

    with pytest.raises(SystemExit):
        parse_config(train_args(tiny_embeddings, tiny_flux_dir, tmp_path, log_every=-1))


def test_a_run_starts_with_a_summary_and_ends_with_where_its_outputs_are(tiny_flux_dir, tiny_embeddings, tmp_path):
    """Stdout of a 2-rank run: a one-line summary (not the whole configuration as JSON: that is in
    config.json, which the line names) and, once, a closing line with the checkpoint, metrics, plots."""
    from helpers import torchrun, train_args

    out = tmp_path / "out"
    proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=2, checkpointing_steps=2,
                               save_images_every=0, learning_rate=3e-4))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    config_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[config] ")]
    first = [ln for ln in config_lines if "every setting:" in ln]
    assert len(first) == 1 and len(first[0]) < 400, config_lines
    assert first[0] == (f"[config] flux grpo, rewards compressibility:1, 2 iterations at learning rate 0.0003, "
                        f"2 images per prompt of 32x32 in 4 steps, seed 7; every setting: {out / 'config.json'}")
    assert not any(ln.startswith("[config] {") for ln in config_lines) and (out / "config.json").is_file()
    done = [ln for ln in proc.stdout.splitlines() if ln.startswith("[done]")]
    assert done == [f"[done] 2 iterations; last checkpoint {out / 'checkpoint-2'} (iteration 2); "
                    f"metrics {out / 'metrics.jsonl'}; plots {out / 'reward_curve.png'}"], proc.stdout[-2000:]
