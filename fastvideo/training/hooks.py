"""Trainer hooks: what runs around the loop without the loop knowing it.

The entry point registers hooks (evaluation and the reward-hacking guard, the run recorder,
image saving, wandb) with ``trainer.add_hook``; the trainer calls them at named points:

    on_train_start(trainer)                 after set-up and resume, before the first iteration
    on_iteration_end(trainer, result)       after an iteration's metrics (result: IterationResult)
    on_checkpoint(trainer, path)            after a checkpoint is written (every rank)
    on_step_end(trainer) -> bool            after the iteration's checkpointing; True stops the run
    on_train_end(trainer)                   after the last iteration
    log(record, step)                       extra metrics another hook reports (e.g. evaluation)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class IterationResult:
    """What one iteration produced, for hooks (rollout, rewards, advantages, the logged record)."""

    iteration: int
    traj: object  # fastvideo.sampling.rollout.Trajectory
    rewards: object  # fastvideo.algorithms.base.RewardResult
    advantages: torch.Tensor
    record: dict


class TrainerHook:
    """Base class: every point is a no-op."""

    def on_train_start(self, trainer) -> None:
        pass

    def on_iteration_end(self, trainer, result: IterationResult) -> None:
        pass

    def on_checkpoint(self, trainer, path: Path) -> None:
        pass

    def on_step_end(self, trainer) -> bool:
        return False

    def on_train_end(self, trainer) -> None:
        pass

    def log(self, record: dict, step: int) -> None:
        pass


class WandbHook(TrainerHook):
    """Logs every iteration's record (and hooks' extra metrics) to a wandb run (rank 0)."""

    def __init__(self, cfg):
        import os

        from fastvideo.utils import main_print, require

        wandb = require("wandb", "wandb", "--report_to wandb")
        os.environ.setdefault("WANDB_MODE", "offline")
        main_print(f"[wandb] mode {os.environ['WANDB_MODE']} (set WANDB_MODE=online and log in to upload)")
        self.run = wandb.init(project="flux-grpo", dir=cfg.output.output_dir, config=cfg.to_dict())

    def on_iteration_end(self, trainer, result: IterationResult) -> None:
        self.run.log(result.record, step=result.iteration)

    def log(self, record: dict, step: int) -> None:
        self.run.log(record, step=step)

    def on_train_end(self, trainer) -> None:
        self.run.finish()


class TensorBoardHook(TrainerHook):
    """Writes every iteration's numeric metrics (and hooks' extra metrics) as TensorBoard scalars
    under OUTPUT_DIR/tensorboard (rank 0); torch's SummaryWriter, imported here (tensorboard optional)."""

    def __init__(self, cfg):
        import os

        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=os.path.join(cfg.output.output_dir, "tensorboard"))

    def log(self, record: dict, step: int) -> None:
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def on_iteration_end(self, trainer, result: IterationResult) -> None:
        self.log(result.record, result.iteration)

    def on_train_end(self, trainer) -> None:
        self.writer.close()


class ImageSaverHook(TrainerHook):
    """Rollout images and per-group grids every --save_images_every iterations (a video family's
    clips as MP4s at its ``video_fps``, its grids as frame strips: fastvideo.sampling.images)."""

    def __init__(self, every: int, out: str, num_generations: int):
        self.every, self.out, self.num_generations = every, out, num_generations

    def on_iteration_end(self, trainer, result: IterationResult) -> None:
        if self.every <= 0 or result.iteration % self.every or trainer.dims.sp_rank:
            return  # (a sequence group's ranks hold the same images: its first rank saves them)
        from fastvideo.sampling.images import save_group_grids, save_images

        traj = result.traj
        save_images(traj.images, self.out, result.iteration, trainer.dims.dp_rank,
                    getattr(trainer.family, "video_fps", None))
        save_group_grids(traj.images, result.rewards.total, self.num_generations, self.out, result.iteration,
                         trainer.dims.dp_rank, traj.captions)


class LogLineHook(TrainerHook):
    """One plain text line of an iteration's metrics every ``every`` iterations (rank 0): what a
    batch job's log shows, where a progress bar cannot redraw."""

    def __init__(self, every: int, max_iterations: int):
        self.every, self.max_iterations = every, max_iterations
        self.start: tuple[float, int] | None = None

    def on_train_start(self, trainer) -> None:
        import time

        self.start = (time.perf_counter(), trainer.iteration)

    def on_iteration_end(self, trainer, result: IterationResult) -> None:
        if self.every <= 0 or result.iteration % self.every or not trainer.info.is_main:
            return
        from fastvideo.utils import main_print

        main_print(format_log_line(result.record, self.max_iterations, self._seconds_per_iteration(result)))

    def _seconds_per_iteration(self, result: IterationResult) -> float:
        import time

        if self.start is None:
            return float(result.record.get("time_iteration", float("nan")))
        t0, first = self.start
        return (time.perf_counter() - t0) / max(1, result.iteration - first)


def format_log_line(record: dict, max_iterations: int, seconds_per_iteration: float) -> str:
    """``[it 12/40] reward -3.84 +- 0.09 | loss -2.0e-04 | grad_norm 0.41 | ... | 0.52 s/it | ETA 15 s``."""
    it = record["iteration"]
    parts = [f"[it {it}/{max_iterations}] reward {record['reward_mean']:.4g} +- {record['reward_std']:.3g}",
             f"loss {record['loss']:.3g}", f"grad_norm {record['grad_norm']:.3g}"]
    for key, label in (("kl", "kl"), ("clip_fraction", "clip"), ("skipped_steps", "skipped")):
        if key in record and (key != "skipped_steps" or record[key]):
            parts.append(f"{label} {record[key]:.3g}")
    eta = seconds_per_iteration * max(0, max_iterations - it)
    parts.append(f"{seconds_per_iteration:.2f} s/it | ETA {_duration(eta)}")
    return " | ".join(parts)


def _duration(seconds: float) -> str:
    if seconds != seconds:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s} s")


def objective_label(algorithm: str) -> str:
    """A plot's name for --algorithm: a built-in's in capitals (GRPO, NFT), a plugin's as given."""
    return algorithm if ":" in algorithm else algorithm.upper()


class RewardCurveHook(TrainerHook):
    """OUTPUT_DIR/reward_curve.png redrawn at every checkpoint (rank 0)."""

    def on_checkpoint(self, trainer, path: Path) -> None:
        if trainer.info.is_main:
            from fastvideo.training.metrics import plot_reward_curve

            plot_reward_curve(trainer.metrics.read(), Path(trainer.cfg.output.output_dir) / "reward_curve.png",
                              title=f"{objective_label(trainer.cfg.algorithm)} reward")
