"""The training loop: prompts -> rollout -> decode -> rewards -> advantages -> update.

The loop is a sequence of timed phases and nothing else. What is optimised comes from an objective
(fastvideo.algorithms), what is sampled from the model family and the sampling plan, and
everything around the loop (evaluation, recorder, image saving, wandb) is a hook the entry point
registers (fastvideo.training.hooks).
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from fastvideo import devices
from fastvideo.algorithms.base import ObjectiveContext, RewardResult
from fastvideo.algorithms.registry import resolve_objective
from fastvideo.distributed import comm_count
from fastvideo.distributed.parallel import ParallelDims
from fastvideo.errors import UserError
from fastvideo.grpo.bestofn import best_of_n_rows
from fastvideo.sampling.plan import SamplingPlan, on_grid
from fastvideo.sampling.rollout import Trajectory, decode_images, rollout
from fastvideo.training import builders, lean
from fastvideo.training.ema import WeightCopy
from fastvideo.training.hooks import IterationResult, TrainerHook
from fastvideo.training.metrics import MetricsWriter, PhaseTimer, reduce_scalars, reward_metrics
from fastvideo.training.parts import RunParts, build_parts, rollout_config
from fastvideo.training.run.start import fail_together, log_config
from fastvideo.training.policy import Policy
from fastvideo.training.reward_pipeline import share_rewards
from fastvideo.training.update import (  # noqa: F401
    NonFiniteError, TrainerState, Updater, UpdateStats, iteration_problems)
from fastvideo.utils import main_print

__all__ = ["Trainer", "NonFiniteError", "RewardResult", "UpdateStats"]


class _Part:
    """``trainer.<name>`` reads ``trainer.parts.<name>``: one of the run's parts (RunParts)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, trainer, owner=None):
        return self if trainer is None else getattr(trainer.parts, self.name)


class Trainer:
    # The run's parts, built by setup() (training.parts.build_parts), read as trainer.model ...
    resume_path, dataset, transformer_config, model, vae = _Part(), _Part(), _Part(), _Part(), _Part()
    kl_reference, data_randomness, sampler, reward, scorer = _Part(), _Part(), _Part(), _Part(), _Part()
    optimizer, lr_scheduler, ema, randomness = _Part(), _Part(), _Part(), _Part()

    def __init__(self, cfg, info: devices.DistInfo, dims: ParallelDims | None = None):
        self.cfg = cfg
        self.info = info
        self.family = builders.build_family(cfg)  # the model family (--model_family), with its forward settings
        # --sp_size is refused on every rank before init_groups' first collective: a rank that refused
        # after it would leave its peers inside new_group with a reset connection and a traceback
        builders.check_sequence_parallel(cfg, self.family, info.world_size)
        self.dims = (dims or ParallelDims.build(info.world_size, info.rank, cfg.fsdp_strategy, sp=cfg.sp_size)).init_groups()
        self.device = info.device
        self.state = TrainerState()
        self.timer = PhaseTimer(self.device)
        self.metrics = MetricsWriter(cfg.output.output_dir, enabled=info.is_main)
        self.autocast_dtype = torch.bfloat16 if cfg.model.mixed_precision == "bf16" else None
        self.rollout_cfg = rollout_config(cfg)
        self.hooks: list[TrainerHook] = []
        self.parts: RunParts | None = None  # setup()
        self.stop_request = None  # run_control.StopRequest the entry point installs (SIGTERM / SIGINT)
        self.stopped_by: tuple[int, Path | None] | None = None  # (signal, its checkpoint) after a stop
        self.saved: tuple[int, Path] | None = None  # (iteration, folder) of the last checkpoint written

    @property
    def iteration(self) -> int:
        return self.state.iteration

    @iteration.setter
    def iteration(self, value: int) -> None:
        self.state.iteration = value

    def add_hook(self, hook: TrainerHook) -> None:
        self.hooks.append(hook)

    def log_metrics(self, record: dict, step: int) -> None:
        """Extra metrics (e.g. an evaluation's) for the hooks that keep metrics elsewhere (wandb)."""
        for hook in self.hooks:
            hook.log(record, step)

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        comm_count.install()  # collectives counted per phase into metrics.jsonl (cheap: stays on)
        make_objective = resolve_objective(self.cfg.algorithm)  # an unknown --algorithm fails before any model loads
        self.parts = build_parts(self.cfg, self.info, self.dims, self.family, self.timer, self.autocast_dtype)
        self.objective = make_objective(ObjectiveContext(
            cfg=self.cfg, dims=self.dims, device=self.device, settings=self.cfg.objective_settings(),
            update=self.cfg.update, group_size=self.cfg.rollout.num_generations, reward=self.reward,
            randomness=self.randomness,
            copy_weights=lambda: WeightCopy(self.model)))
        self.policy = Policy(self.model, self.family, self.device, self.autocast_dtype, self.kl_reference)
        self.lean = lean.choose(self.cfg, self.info.world_size, self.device, self.family, self.transformer_config,
                                dict(self.vae.config))
        self.updater = Updater(self.model, self.optimizer, self.lr_scheduler, self.cfg.optim,
                               self.cfg.update.gradient_accumulation_steps, self.dims, self.device, self.state,
                               self.lean.timesteps, self.cfg.update.grad_sync)
        self.checkpointer = builders.build_checkpointer(self.cfg)
        self._maybe_resume()
        if self.info.is_main:
            log_config(self.cfg, self.info, self.device)
            for note in self.lean.notes:
                main_print(f"[lean] {note}")

    def stateful_parts(self) -> dict:
        """The small stateful parts a checkpoint keeps by name (the model, optimizer, LR schedule
        and EMA tensors are saved by the checkpointer itself)."""
        return {"trainer": self.state, "sampler": self.sampler, "objective": self.objective,
                "randomness": self.randomness}

    def _maybe_resume(self) -> None:
        if self.resume_path is None:
            self.metrics.reset()
            return
        strict = not self.cfg.output.resume_allow_changes
        self.sampler.strict_resume = strict
        parts = self.stateful_parts()
        if not strict:  # a changed seed is allowed (and logged by the run-identity check)
            parts.pop("randomness")
        self.checkpointer.load(self.resume_path, model=self.model, optimizer=self.optimizer,
                               lr_scheduler=self.lr_scheduler, ema=self.ema, states=parts,
                               weight_sets=self.objective.weight_sets())
        failure = None
        try:  # rank 0's file: a damaged one stops every rank, not rank 0 alone
            self.metrics.truncate_after(self.iteration)
        except UserError as exc:
            failure = exc
        fail_together(failure, self.info.world_size, self.device, "rank 0 refused metrics.jsonl")
        main_print(f"[resume] continuing after iteration {self.iteration} from {self.resume_path}")
        from fastvideo.training.run.resume_changes import apply_and_log

        apply_and_log(self, main_print)  # a new --learning_rate, cadences: applied, and said

    def save_checkpoint(self) -> Path:
        from fastvideo.training.lora import lora_checkpoint_info
        from fastvideo.training.run.identity import run_identity

        extra = {"seed": self.cfg.optim.seed, "run_identity": run_identity(self.cfg, self.info.world_size),
                 **lora_checkpoint_info(self.cfg)}
        path = self.checkpointer.save(self.iteration, model=self.model, optimizer=self.optimizer,
                                      lr_scheduler=self.lr_scheduler, ema=self.ema, extra=extra,
                                      states=self.stateful_parts(), transformer_config=self.transformer_config,
                                      weight_sets=self.objective.weight_sets())
        self.saved = (self.iteration, path)
        for hook in self.hooks:
            hook.on_checkpoint(self, path)
        return path

    # ------------------------------------------------------------------ phases
    def load_prompts(self, indices: list[int]):
        """The prompts of ``indices``: (their Conditioning of P prompts, P captions)."""
        workers = self.cfg.dataloader_num_workers
        if workers > 0:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                items = list(pool.map(self.dataset.__getitem__, indices))
        else:
            items = [self.dataset[i] for i in indices]
        return self.dataset.stack(items)

    def compute_rewards(self, traj: Trajectory) -> RewardResult:
        """The rewards of the decoded samples, given their source images when the family edits."""
        sources = self.family.source_images(traj.cond)
        extra = {} if sources is None else {"sources": sources}  # a text-to-image run calls as before
        return _reward_result(self.reward(traj.images, traj.captions, **extra))

    def compute_advantages(self, rewards: RewardResult) -> torch.Tensor:
        """[B] advantages of this rank's samples (the objective's)."""
        return self.objective.advantages(rewards)

    def update(self, traj: Trajectory, advantages: torch.Tensor, iteration: int) -> UpdateStats:
        reference = self.reference_model()  # a frozen KL reference: gathered once per update
        with self.nograd_weights(reference) if reference is not None else contextlib.nullcontext():
            return self.updater.run(self.objective, self.policy, traj, advantages, iteration)

    def nograd_weights(self, model=None) -> contextlib.AbstractContextManager:
        """Around no-grad passes over many steps (the rollout, evaluation): the weights of ``model``
        (default: the trained one) gathered once for all of them under --rollout_weights gathered."""
        from fastvideo.distributed.fsdp import gathered_forwards

        model = self.model if model is None else model
        lean_choice = getattr(self, "lean", None)
        return gathered_forwards(model, enabled=model is not None and lean_choice is not None and lean_choice.gathered)

    def reference_model(self):
        """The KL reference's own wrapped copy (full fine-tuning), or None (none, or LoRA's adapters off)."""
        from fastvideo.training.kl_reference import FrozenCopyReference

        return self.kl_reference.model if isinstance(self.kl_reference, FrozenCopyReference) else None

    def sampling_plan(self, iteration: int) -> SamplingPlan:
        """This iteration's schedule (SDE / ODE / DPM-Solver++ steps, trainable steps): the objective's."""
        r = self.cfg.rollout
        return on_grid(self.objective.sampling_plan(iteration, r.sampling_steps, r.shift), r.sigma_grid,
                       r.sampling_steps, r.shift, self.family.schedule_terminal())

    def _rollout(self, iteration: int, cond, captions, indices, plan, on_chunk=None):
        with self.objective.sampling_policy(), self.nograd_weights():  # NFT samples with its old policy
            return rollout(self.family, self.model, self.vae, cond, captions, indices, self.rollout_cfg,
                           self.randomness, iteration, self.device, self.autocast_dtype, decode=False,
                           on_chunk=on_chunk, plan=plan, keep_latents=self.objective.needs_trajectory,
                           keep_log_probs=self.objective.needs_log_probs)

    def _sample_and_score(self, iteration: int, indices: list[int]) -> tuple[Trajectory, RewardResult]:
        """Rollout, decode, rewards. The ranks of a sequence group hold the same samples: its first
        rank alone decodes and scores them (traj.images stays None on the others, whose hooks
        skip images) and broadcasts the scores (reward_pipeline.share_rewards; none at sp = 1)."""
        cond, captions = self.load_prompts(indices)
        self.model.eval()
        plan = self.sampling_plan(iteration)
        scores_here = self.dims.sp_rank == 0
        if self.scorer is not None:
            traj, rewards = self._rollout_overlapped(iteration, cond, captions, indices, plan, scores_here)
        else:
            with self.timer.phase("rollout"):
                traj = self._rollout(iteration, cond, captions, indices, plan)
            rewards = self._decode_and_score(traj) if scores_here else None
        if self.dims.sp > 1:
            with self.timer.phase("reward"):
                rewards = share_rewards(self.dims, rewards, self.reward.names, traj.num_samples, self.device)
        return traj, rewards

    def _decode_and_score(self, traj: Trajectory) -> RewardResult:
        with self.timer.phase("decode"):
            traj.images = decode_images(self.vae, traj.x0, self.rollout_cfg, self.device, self.autocast_dtype,
                                        family=self.family, layout=traj.layout)
        with self.timer.phase("reward"):
            return self.compute_rewards(traj)

    def _rollout_overlapped(self, iteration, cond, captions, indices, plan, scores_here: bool = True):
        """Rollout with each chunk decoded and scored while the next samples (--reward_overlap);
        a rank that does not score (scores_here False: sp rank > 0) samples alone, rewards None.

        Timings: time_rollout is sampling alone, time_decode the chunks' decoding, time_reward
        what scoring still costs after the last chunk (the exposed part), time_reward_busy the
        worker's whole scoring time."""
        if not scores_here:
            with self.timer.phase("rollout"):
                return self._rollout(iteration, cond, captions, indices, plan), None
        G = self.cfg.rollout.num_generations
        sources = self.family.source_images(cond)  # [P, ...] of the prompts (editing), or None
        self.scorer.begin([c for c in captions for _ in range(G)],
                          None if sources is None else sources.repeat_interleave(G, dim=0))
        with self.timer.phase("rollout"):
            traj = self._rollout(iteration, cond, captions, indices, plan, self.scorer.on_chunk)
        # The rollout phase's wall time includes decoding its chunks (timed on their own).
        self.timer.seconds["rollout"] -= self.timer.seconds.get("decode", 0.0)
        with self.timer.phase("reward"):
            scored = self.scorer.finish()
            traj.images = scored.images
            rewards = _reward_result(self.reward.combine(scored.raw))
        self.timer.seconds["reward_busy"] = scored.busy_s
        return traj, rewards

    # ------------------------------------------------------------------ loop
    def run_iteration(self) -> dict:
        iteration = self.iteration + 1
        self.timer.reset()
        comm_count.reset()
        devices.reset_peak_memory(self.device)
        t0 = time.perf_counter()
        traj, rewards = self._sample_and_score(iteration, self.sampler.next_batch())
        with self.timer.phase("reward"):
            advantages = self.compute_advantages(rewards)
        with self.timer.phase("update"):
            trained, trained_advantages = self.trained_samples(traj, advantages)
            stats = self.update(trained, trained_advantages, iteration)
            self._update_ema(iteration)
            self.objective.after_update(self.policy, iteration)
        self.iteration = iteration
        record = self._iteration_metrics(iteration, traj, rewards, advantages, stats, time.perf_counter() - t0,
                                         None if trained is traj else trained.num_samples)
        self.updater.end_iteration(iteration, iteration_problems(record, stats))  # stops a run that stays non-finite
        result = IterationResult(iteration, traj, rewards, advantages, record)
        for hook in self.hooks:
            hook.on_iteration_end(self, result)
        for source in (self.randomness, self.data_randomness):
            if source is not None:
                source.flush()
        return record

    def _update_ema(self, iteration: int) -> None:
        """Once per iteration, after its optimizer steps (upstream's ema_handler.update after
        train_one_step), from --ema_start_step on, every --ema_update_interval-th iteration
        (Flow-Factory's EMAModuleWrapper.step after epoch iteration - 1: (epoch + 1) % interval == 0)."""
        optim = self.cfg.optim
        if self.ema is not None and iteration >= optim.ema_start_step and iteration % optim.ema_update_interval == 0:
            # optimizer steps so far, as upstream's global_step when it calls ema.step (--ema_warmup)
            steps = iteration * self.cfg.derived(self.dims.dp_size)["optimizer_steps_per_iteration"]
            self.ema.update(self.model, step=steps)

    def trained_samples(self, traj: Trajectory, advantages: torch.Tensor) -> tuple[Trajectory, torch.Tensor]:
        """The samples and advantages the update trains: all, or under --bestofn K each group's K/2
        lowest- and K/2 highest-advantage samples (grpo.bestofn; the advantages stay the full group's)."""
        r = self.cfg.rollout
        if not r.bestofn:
            return traj, advantages
        rows = best_of_n_rows(advantages, r.num_generations, r.bestofn)
        self.objective.keep_samples(rows)
        return traj.subset(rows), advantages[rows.to(advantages.device)]

    def _iteration_metrics(self, iteration, traj, rewards, advantages, stats: UpdateStats, seconds,
                           trained: int | None = None) -> dict:
        record = {"iteration": iteration,
                  **reward_metrics(self.dims, self.device, rewards, advantages, self.cfg)}
        means = reduce_scalars({"loss": stats.loss, "grad_norm": stats.grad_norm, **stats.means,
                                **{f"time_{k}": v for k, v in self.timer.seconds.items()}},
                               self.device, "mean", self.dims)
        maxes = reduce_scalars({**stats.maxes, "time_iteration": seconds,
                                "peak_memory_gb": devices.peak_memory_bytes(self.device) / 2**30,
                                "skipped_steps": stats.skipped_steps}, self.device, "max", self.dims)
        record.update(means)
        record.update(maxes)
        record["optimizer_steps"] = stats.optimizer_steps
        if trained is not None:  # --bestofn: the samples this rank's update trained
            record["trained_samples"] = trained
        # Under classifier-free guidance one velocity is two transformer passes (the family says).
        passes = getattr(self.family, "velocity_passes", 1)
        record["forward_passes_update"] = stats.forward_passes * passes
        record["forward_passes_rollout"] = traj.rollout_forward_samples() * passes
        record["shared_ode_prefix"] = traj.shared_prefix
        record["trajectory_bytes"] = sum(traj.nbytes().values())  # this rank's (no step latents / log-probs unneeded)
        if traj.plan is not None and traj.plan.window_start >= 0:
            record["sde_window_start"] = traj.plan.window_start
        record["lr"] = self.lr_scheduler.get_last_lr()[0]
        record["samples_per_s"] = record.pop("_samples") / max(seconds, 1e-9)
        record.update(comm_count.metrics())  # this rank's collectives (the reductions above included)
        self.metrics.write(record)
        return record

    def _stop_requested(self) -> bool:
        """At an iteration boundary, whether any rank got SIGTERM / SIGINT (all ranks agree); if so
        write a checkpoint of the iterations done (--no_checkpoint_on_signal: none) and record it
        in self.stopped_by."""
        signum = self.stop_request.agreed(self.dims, self.device) if self.stop_request is not None else 0
        if not signum:
            return False
        path = None
        if self.cfg.output.checkpoint_on_signal and self.iteration > 0:
            # The same decision on every rank (saving is collective): was this iteration just saved?
            path = self.saved[1] if self.saved and self.saved[0] == self.iteration else self.save_checkpoint()
        self.stopped_by = (signum, path)
        return True

    def train(self) -> list[dict]:
        from fastvideo.progress import Progress

        cfg = self.cfg
        records = []
        # A progress bar only on a terminal: in a batch job's log its redraws are noise (LogLineHook
        # prints plain lines there).
        bar = Progress(cfg.optim.max_train_steps, "GRPO", initial=self.iteration, enabled=self.info.is_main,
                       log_lines=False)
        for hook in self.hooks:
            hook.on_train_start(self)
        while self.iteration < cfg.optim.max_train_steps:
            if self._stop_requested():
                break
            record = self.run_iteration()
            records.append(record)
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward_mean']:.4f}", loss=f"{record['loss']:.3g}",
                            s_it=f"{record['time_iteration']:.1f}")
            if self.iteration % cfg.output.checkpointing_steps == 0 or self.iteration == cfg.optim.max_train_steps:
                self.save_checkpoint()
            if any([hook.on_step_end(self) for hook in self.hooks]):
                break  # a hook (the reward-hacking guard) stopped the run, after writing a checkpoint
        bar.close()
        if self.scorer is not None:
            self.scorer.close()
        for hook in self.hooks:
            hook.on_train_end(self)
        return records



def _reward_result(out) -> RewardResult:
    return RewardResult(total=out.total.float().cpu(), per_reward={k: v.float().cpu() for k, v in out.raw.items()})
