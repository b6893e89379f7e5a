"""Flags changed on resume that do not change what the run is: applied and logged, never ignored.

The run-defining settings are refused by the run-identity check (training/run/identity.py). The
rest either take effect by themselves because the loop reads them every iteration (max steps, the
logging, checkpoint, image and evaluation cadences) -- they are logged here against the previous
run's OUTPUT_DIR/config.json -- or would be undone by the checkpoint: the learning rate, whose base
value the LR schedule's saved state carries. That one is re-applied after the load.
"""

from __future__ import annotations

import json
from pathlib import Path

# (flag, section of config.json, key): settings a resumed run may change, read every iteration.
CADENCE = (("--max_train_steps", "optim", "max_train_steps"), ("--log_every", "output", "log_every"),
           ("--checkpointing_steps", "output", "checkpointing_steps"),
           ("--checkpoints_total_limit", "output", "checkpoints_total_limit"),
           ("--save_images_every", "output", "save_images_every"), ("--eval_every", "eval", "every"))


def apply_learning_rate(optimizer, lr_scheduler, learning_rate: float) -> float | None:
    """Make ``learning_rate`` the schedule's base again after a checkpoint restored another one;
    the current step's factor of the schedule is kept. Returns the checkpoint's rate if it differed."""
    old = lr_scheduler.base_lrs[0]
    if old == learning_rate:
        return None
    factor = [group["lr"] / base if base else 1.0 for group, base in zip(optimizer.param_groups, lr_scheduler.base_lrs)]
    lr_scheduler.base_lrs = [learning_rate for _ in lr_scheduler.base_lrs]
    for group, f in zip(optimizer.param_groups, factor):
        group["initial_lr"] = learning_rate
        group["lr"] = learning_rate * f
    lr_scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return old


def cadence_changes(previous: dict | None, current: dict) -> list[str]:
    """'--flag old -> new' for each CADENCE setting that differs from the previous run's config."""
    if not previous:
        return []
    out = []
    for flag, section, key in CADENCE:
        old = (previous.get(section) or {}).get(key) if isinstance(previous.get(section), dict) else None
        new = (current.get(section) or {}).get(key) if isinstance(current.get(section), dict) else None
        if old is not None and new is not None and old != new:
            out.append(f"{flag} {old} -> {new}")
    return out


def previous_config(output_dir: str | Path) -> dict | None:
    try:
        return json.loads((Path(output_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def apply_and_log(trainer, log) -> list[str]:
    """After a resume's load: re-apply the learning rate, log every changed setting; the lines."""
    cfg = trainer.cfg
    lines = []
    old = apply_learning_rate(trainer.optimizer, trainer.lr_scheduler, cfg.optim.learning_rate)
    if old is not None:
        lines.append(f"--learning_rate {old:g} -> {cfg.optim.learning_rate:g}")
        # Loud: a launcher that sets its own --learning_rate puts it back on a second resume,
        # silently undoing the rate the first resume changed.
        log(learning_rate_warning(old, cfg.optim.learning_rate))
    lines += cadence_changes(previous_config(cfg.output.output_dir), cfg.to_json())
    for line in lines:
        log(f"[resume] applied a changed setting: {line}")
    return lines


def learning_rate_warning(saved: float, new: float) -> str:
    """The start-up line of a resume whose --learning_rate differs from the checkpoint's."""
    return (f"[resume] WARNING: --learning_rate {new:g} replaces the checkpoint's {saved:g} (a launcher's own "
            f"--learning_rate counts); to keep the saved rate, add --learning_rate {saved:g}")
