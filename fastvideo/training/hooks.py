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


class ImageSaverHook(TrainerHook):
    """Rollout images and per-group grids every --save_images_every iterations."""

    def __init__(self, every: int, out: str, num_generations: int):
        self.every, self.out, self.num_generations = every, out, num_generations

    def on_iteration_end(self, trainer, result: IterationResult) -> None:
        if self.every <= 0 or result.iteration % self.every:
            return
        from fastvideo.sampling.images import save_group_grids, save_images

        traj = result.traj
        save_images(traj.images, self.out, result.iteration, trainer.info.rank)
        save_group_grids(traj.images, result.rewards.total, self.num_generations, self.out, result.iteration,
                         trainer.info.rank, traj.captions)


class RewardCurveHook(TrainerHook):
    """OUTPUT_DIR/reward_curve.png redrawn at every checkpoint (rank 0)."""

    def on_checkpoint(self, trainer, path: Path) -> None:
        if trainer.info.is_main:
            from fastvideo.training.metrics import plot_reward_curve

            plot_reward_curve(trainer.metrics.read(), Path(trainer.cfg.output.output_dir) / "reward_curve.png")
