"""A run's start-up steps that cost nothing and must come before any model loads: the objective's
rules on the data-parallel world, the output folder (refused, cleared or locked on rank 0, every
rank learning the outcome), and the resume check; and, once built, the logged configuration
(OUTPUT_DIR/config.json)."""

from __future__ import annotations

from pathlib import Path

import torch

from fastvideo import devices
from fastvideo.errors import ConfigError
from fastvideo.utils import main_print


def check_world(cfg, dims) -> None:
    """The objective's rules on the data-parallel world (GRPO without --use_group: at least two
    samples over all ranks)."""
    cfg.objective_settings().check_world(cfg, dims.dp_size)


def check_resume(cfg, world_size: int):
    """Resolve --resume_from_checkpoint and refuse a changed run (run.identity.check_resume)."""
    spec = cfg.output.resume_from_checkpoint
    if not spec:
        return None
    from fastvideo.library_lines import check_recorded_line
    from fastvideo.training import checkpoint
    from fastvideo.training.run.identity import check_resume as check

    path, saved = checkpoint.read_resume_point(spec, cfg.output.output_dir)
    line_note = check_recorded_line(checkpoint.recorded_line(path), f"checkpoint {path}")
    if line_note:
        main_print(f"[resume] note: {line_note}")
    for diff in check(saved, cfg, world_size, str(spec)):
        main_print(f"[resume] --resume_allow_changes: continuing with a changed setting: {diff}")
    return path


def fail_together(failure: Exception | None, world_size: int, device, peer_reason: str) -> None:
    """Every rank calls this at the same point: the rank that met ``failure`` raises it, the others
    raise PeerRefused (silent, exit 2) when any did (one int32 MAX), so that all stop together
    instead of the others going on to a collective the failed rank never joins (a gloo traceback)."""
    from fastvideo.training.run import output_dir

    if world_size > 1:
        flag = torch.tensor([1 if failure is not None else 0], dtype=torch.int32, device=device)
        devices.all_reduce_max(flag)
        if failure is None and flag.item():
            raise output_dir.PeerRefused(peer_reason)
    if failure is not None:
        raise failure


def prepare_output_dir(cfg, info, device) -> None:
    """Rank 0 refuses, clears (--overwrite) and locks OUTPUT_DIR (run/output_dir.py); every rank
    learns whether it failed (one int32 MAX), so that all stop together before any model loads."""
    from fastvideo.training.run import output_dir

    failure, notes = None, []
    if info.is_main:
        try:
            notes = output_dir.prepare_output_dir(cfg.output.output_dir, bool(cfg.output.resume_from_checkpoint),
                                                  cfg.output.overwrite)
        except ConfigError as exc:
            failure = exc
    fail_together(failure, info.world_size, device, "rank 0 refused the output folder")
    for note in notes:
        main_print(f"[outputs] {note}")


def log_config(cfg, info, device) -> None:
    """Print the resolved config with its derived quantities and keep it as OUTPUT_DIR/config.json."""
    from fastvideo.utils import atomic_write_json

    derived = cfg.derived(info.world_size)
    resolved = {**cfg.to_json(), "derived": derived, "device": str(device)}  # a valid --config file
    atomic_write_json(Path(cfg.output.output_dir) / "config.json", resolved)
    for note in cfg.compat_notes:
        main_print(f"[config] {note}")
    main_print("[config] " + summary(cfg, Path(cfg.output.output_dir) / "config.json"))
    main_print("[config] derived: " + " ".join(f"{k}={v}" for k, v in derived.items()))


def summary(cfg, config_path: Path) -> str:
    """What the run is, on one line (every setting is in ``config_path``, a valid --config file)."""
    from fastvideo.rewards.settings import spec_text

    r, o = cfg.rollout, cfg.optim
    rewards = ",".join(spec_text(s) for s in cfg.reward.spec)
    return (f"{cfg.model.family} {cfg.algorithm}, rewards {rewards}, {o.max_train_steps} iterations at learning rate "
            f"{o.learning_rate:g}, {r.num_generations} images per prompt of {r.height}x{r.width} in "
            f"{r.sampling_steps} steps, seed {o.seed}; every setting: {config_path}")


def closing_line(output_dir: str, saved: tuple[int, Path] | None, iteration: int) -> str:
    """The line a finished run ends with: where its last checkpoint, metrics and plots are."""
    out = Path(output_dir)
    checkpoint = f"last checkpoint {saved[1]} (iteration {saved[0]})" if saved else "no checkpoint"
    metrics = out / "metrics.jsonl"
    plots = [str(out / name) for name in ("reward_curve.png", "eval_curve.png", "eval_grid.png")
             if (out / name).is_file()]
    return (f"[done] {iteration} iterations; {checkpoint}; metrics {metrics if metrics.is_file() else 'none'}; "
            f"plots {', '.join(plots) if plots else 'none'}")
