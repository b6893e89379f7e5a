"""The GRPO loop: prompts -> rollout -> decode -> rewards -> group advantages -> clipped update.

Each phase is a method returning a typed container and is timed; the maths lives in
fastvideo.sampling.sde, fastvideo.grpo.* (pure functions), parallelism in fastvideo.distributed.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo import platform
from fastvideo.config import TrainConfig
from fastvideo.grpo.advantages import batch_advantages, group_advantages, zero_std_ratio
from fastvideo.grpo.kl import gaussian_step_kl
from fastvideo.grpo.loss import clipped_policy_loss
from fastvideo.sampling import sde
from fastvideo.sampling.mix import plan_for_iteration
from fastvideo.sampling.plan import SamplingPlan, full_sde_plan
from fastvideo.sampling.rollout import RolloutConfig, Trajectory, decode_images, rollout, sde_transition
from fastvideo.training.lora import lora_checkpoint_info
from fastvideo.training.run_identity import run_identity
from fastvideo.training.metrics import MetricsWriter, PhaseTimer, plot_reward_curve, reduce_scalars
from fastvideo.utils import main_print


class NonFiniteError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


@dataclass
class RewardResult:
    total: torch.Tensor  # [B] float32, weighted sum used for advantages
    per_reward: dict[str, torch.Tensor]  # name -> [B] raw scores (for logging)


@dataclass
class UpdateStats:
    loss: float
    grad_norm: float
    ratio_mean: float
    first_ratio_dev: float  # max |ratio - 1| over the first micro-batch's trained steps, before any update
    clip_fraction: float
    optimizer_steps: int
    skipped_steps: int
    forward_passes: int
    kl: float | None = None  # mean KL to the reference policy over the trained terms (--kl_coef > 0)


def gather_cat(t: torch.Tensor) -> torch.Tensor:
    """All ranks' [B] tensors concatenated in rank order ([W*B]); identity on one process."""
    n = platform.world_size()
    if n == 1:
        return t
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


class GRPOTrainer:
    def __init__(self, cfg: TrainConfig, info: platform.DistInfo):
        self.cfg = cfg
        self.data_randomness = None
        self.info = info
        self.device = info.device
        self.iteration = 0
        self.consecutive_nonfinite = 0
        self.timer = PhaseTimer(self.device)
        self.metrics = MetricsWriter(cfg.output.output_dir, enabled=info.is_main)
        self.autocast_dtype = torch.bfloat16 if cfg.model.mixed_precision == "bf16" else None
        self.rollout_cfg = RolloutConfig(
            height=cfg.rollout.height, width=cfg.rollout.width, sampling_steps=cfg.rollout.sampling_steps,
            eta=cfg.rollout.eta, shift=cfg.rollout.shift, guidance_scale=cfg.rollout.guidance_scale,
            num_generations=cfg.rollout.num_generations, rollout_batch_size=cfg.rollout.rollout_batch_size,
            init_same_noise=cfg.rollout.init_same_noise, quantize_timestep=cfg.rollout.quantize_timestep,
            share_ode_prefix=cfg.rollout.share_ode_prefix,
        )
        from fastvideo.training.builders import build_family

        self.family = build_family(cfg)
        self.wandb_run = None
        self.recorder = None
        self.scorer = None  # ChunkScorer when decode + reward overlap the rollout
        self.evaluation = None  # fastvideo.eval.loop.TrainingEvaluation with --eval_every

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        from fastvideo.training import builders

        cfg = self.cfg
        self._check_batch_layout()
        self.resume_path = self._check_resume()  # before any model loads: a refused resume costs nothing
        platform.set_fast_matmul(self.device, cfg.model.allow_tf32)
        platform.seed_everything(cfg.optim.seed)
        builders.check_reward_endpoints(cfg)  # remote:/vlm: URLs answer, before any model loads
        self.dataset = builders.build_dataset(cfg)
        self.transformer_config, self.model, self.vae = builders.build_models(cfg, self.device)
        self.dataset.check_against_transformer(self.transformer_config)
        self.kl_reference = builders.build_kl_reference(cfg, self.model, self.device)
        if cfg.output.dump_randomness or cfg.output.load_randomness:
            self.data_randomness = builders.build_randomness(cfg, self.info, kind="data")
        self.sampler = builders.build_sampler(cfg, len(self.dataset), self.info, self.data_randomness)
        self.reward = builders.build_rewards(cfg, self.device)
        if builders.overlap_reward_scoring(cfg.reward.overlap, self.device,
                                           builders.reward_device_for(cfg, self.device)):
            from fastvideo.training.reward_pipeline import ChunkScorer

            self.scorer = ChunkScorer(self.reward, self.vae, self.rollout_cfg, self.device, self.autocast_dtype,
                                      self.timer)
        self.optimizer, self.lr_scheduler = builders.build_optimizer(cfg, self.model)
        self.ema = builders.build_ema(cfg, self.model)
        self.randomness = builders.build_randomness(cfg, self.info)
        if cfg.output.record_dir:
            from fastvideo.alignment.recorder import RunRecorder

            self.recorder = RunRecorder(cfg, self.info)
        self.checkpointer = builders.build_checkpointer(cfg)
        self._maybe_resume()
        from fastvideo.eval.loop import build_training_evaluation

        self.evaluation = build_training_evaluation(self)  # None without --eval_every
        if cfg.output.probe_layers:
            from fastvideo.alignment.probes import run_probes_for_config

            run_probes_for_config(cfg, self.model, self.vae, self.device)
        if self.info.is_main:
            self._log_config()
        if cfg.output.report_to == "wandb" and self.info.is_main:
            self.wandb_run = builders.start_wandb(cfg)

    def _log_config(self) -> None:
        """Print the resolved config with its derived quantities and keep it as OUTPUT_DIR/config.json."""
        import json

        from fastvideo.utils import atomic_write_json

        cfg = self.cfg
        derived = cfg.derived(self.info.world_size)
        resolved = {**cfg.to_dict(), "derived": derived, "device": str(self.device)}
        resolved["reward"]["spec"] = [f"{s.kind}:{s.url}:{s.weight:g}" if s.url else f"{s.name}:{s.weight:g}"
                                      for s in cfg.reward.spec]
        atomic_write_json(Path(cfg.output.output_dir) / "config.json", resolved)
        for note in cfg.compat_notes:
            main_print(f"[config] {note}")
        main_print("[config] " + json.dumps({k: v for k, v in resolved.items() if k != "derived"}, default=str))
        main_print("[config] derived: " + " ".join(f"{k}={v}" for k, v in derived.items()))

    def _check_batch_layout(self) -> None:
        from fastvideo.config import ConfigError

        samples = self.info.world_size * self.cfg.prompts_per_rank
        if not self.cfg.grpo.use_group and samples < 2:
            raise ConfigError(
                f"without --use_group each prompt gets one sample and advantages are normalised over the "
                f"{samples} sample(s) of all ranks; that needs at least 2: raise --train_batch_size or add "
                "--use_group --num_generations G"
            )

    def _check_resume(self):
        """Resolve --resume_from_checkpoint and refuse a changed run (run_identity.check_resume)."""
        spec = self.cfg.output.resume_from_checkpoint
        if not spec:
            return None
        from fastvideo.training import checkpoint
        from fastvideo.training.run_identity import check_resume

        path, saved = checkpoint.read_resume_point(spec, self.cfg.output.output_dir)
        for diff in check_resume(saved, self.cfg, self.info.world_size, str(spec)):
            main_print(f"[resume] --resume_allow_changes: continuing with a changed setting: {diff}")
        return path

    def _maybe_resume(self) -> None:
        if self.resume_path is None:
            self.metrics.reset()
            return
        spec = self.resume_path
        extra = self.checkpointer.load(
            spec, model=self.model, optimizer=self.optimizer, lr_scheduler=self.lr_scheduler, ema=self.ema
        )
        self.iteration = int(extra["iteration"])
        self.consecutive_nonfinite = int(extra.get("consecutive_nonfinite", 0))
        self.sampler.load_state_dict(extra["sampler"], strict=not self.cfg.output.resume_allow_changes)
        self.metrics.truncate_after(self.iteration)
        main_print(f"[resume] continuing after iteration {self.iteration} from {spec}")

    def save_checkpoint(self) -> Path:
        extra = {
            "iteration": self.iteration,
            "consecutive_nonfinite": self.consecutive_nonfinite,
            "sampler": self.sampler.state_dict(),
            "seed": self.cfg.optim.seed,
            "run_identity": run_identity(self.cfg, self.info.world_size),
            **lora_checkpoint_info(self.cfg),
        }
        path = self.checkpointer.save(
            self.iteration, model=self.model, optimizer=self.optimizer, lr_scheduler=self.lr_scheduler,
            ema=self.ema, extra=extra, transformer_config=self.transformer_config,
        )
        if self.info.is_main:
            plot_reward_curve(self.metrics.read(), Path(self.cfg.output.output_dir) / "reward_curve.png")
        return path

    # ------------------------------------------------------------------ phases
    def load_prompts(self, indices: list[int]):
        """Stack the prompt embeddings of ``indices``: ([P, Lt, D], [P, P'], [Lt, 3], captions)."""
        workers = self.cfg.dataloader_num_workers
        if workers > 0:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                items = list(pool.map(self.dataset.__getitem__, indices))
        else:
            items = [self.dataset[i] for i in indices]
        return self.dataset.stack(items)

    def compute_rewards(self, traj: Trajectory) -> RewardResult:
        return self._reward_result(self.reward(traj.images, traj.captions))

    @staticmethod
    def _reward_result(out) -> RewardResult:
        return RewardResult(total=out.total.float().cpu(), per_reward={k: v.float().cpu() for k, v in out.raw.items()})

    def compute_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """[B] local rewards -> [B] advantages. Groups live on one rank; without --use_group the
        whole global batch is normalised, so rewards are gathered first."""
        g = self.cfg.grpo
        unbiased = g.adv_std == "sample"
        if g.use_group:
            return group_advantages(rewards, self.cfg.rollout.num_generations, g.adv_clip_max, unbiased)
        everything = gather_cat(rewards.to(self.device)).cpu()
        adv = batch_advantages(everything, g.adv_clip_max, unbiased)
        b = rewards.numel()
        return adv[platform.rank() * b:(platform.rank() + 1) * b]

    def _log_prob(self, traj: Trajectory, rows: torch.Tensor, steps: torch.Tensor):
        """Log-prob under the current policy of the stored transitions (rows[i], steps[i]) -> [b],
        and with --kl_coef the KL of each step to the reference policy's -> [b] (else None)."""
        lat = traj.latents[rows.to(traj.latents.device), steps.to(traj.latents.device)]
        nxt = traj.latents[rows.to(traj.latents.device), (steps + 1).to(traj.latents.device)]
        sig = traj.sigmas[steps.to(traj.sigmas.device)]
        sig_next = traj.sigmas[(steps + 1).to(traj.sigmas.device)]
        cond = traj.cond.select(rows)

        def velocity(model):
            with platform.autocast(self.device, self.autocast_dtype, enabled=self.autocast_dtype is not None):
                return self.family.velocity(model, lat, sig, cond, traj.layout)

        v = velocity(self.model)
        plan = traj.plan
        _, logp = sde_transition(plan.sde_kind if plan else "dance", lat, v, sig, sig_next, self.rollout_cfg.eta,
                                 plan.sigmas[1] if plan else None, prev_sample=nxt)
        if self.kl_reference is None:
            return logp, None
        # DanceGRPO's step Gaussian (config refuses --kl_coef with --flow_grpo_sampling).
        with torch.no_grad(), self.kl_reference.policy() as ref:
            ref_mean, _ = sde.step_gaussian(lat, velocity(ref), sig, sig_next, self.rollout_cfg.eta)
        mean, std = sde.step_gaussian(lat, v, sig, sig_next, self.rollout_cfg.eta)
        return logp, gaussian_step_kl(mean, ref_mean, std)

    def sampling_plan(self, iteration: int) -> SamplingPlan:
        """This iteration's schedule (SDE / ODE / DPM-Solver++ steps, trainable steps): sampling.mix."""
        n = self.cfg.rollout.sampling_steps
        g = self.cfg.grpo
        return plan_for_iteration(self.cfg.mix, n, self.cfg.rollout.shift, g.candidate_steps(n), g.trained_steps(n),
                                  iteration, self.randomness)

    def _plan_of(self, traj: Trajectory) -> SamplingPlan:
        """The trajectory's plan; a plan-less trajectory is DanceGRPO's (every step SDE, the GRPO flags' T)."""
        if traj.plan is not None:
            return traj.plan
        g, n = self.cfg.grpo, traj.num_steps
        return full_sde_plan(n, self.rollout_cfg.shift, g.candidate_steps(n), g.trained_steps(n))

    def update(self, traj: Trajectory, advantages: torch.Tensor, iteration: int) -> UpdateStats:
        """Clipped GRPO update over micro-batches; one optimizer step per accumulation window.

        Every sample's loss term at every trained step is weighted 1 / (mb * GA * T): a micro-batch's
        mean is scaled by rows / mb so a short last micro-batch weighs its samples like the others,
        and a trailing window of fewer than GA micro-batches still steps (upstream drops its
        gradients; docs/upstream.md)."""
        g = self.cfg.grpo
        plan = self._plan_of(traj)
        num_trained = plan.num_trained
        perms = self.randomness.timestep_permutations(iteration, traj.sample_ids, len(plan.trainable))
        selected = plan.select_steps(perms)  # [B, T] on CPU
        adv = advantages.to(self.device)
        old_logp = traj.log_probs
        b = traj.num_samples
        mb = g.train_micro_batch_size
        n_micro = math.ceil(b / mb)
        scale = g.loss_coef / (g.gradient_accumulation_steps * num_trained)

        self.model.train()
        loss_sum = torch.zeros((), device=self.device)
        window_loss = torch.zeros((), device=self.device)  # this accumulation window's loss
        ratio_sum = torch.zeros((), device=self.device)
        clip_sum = torch.zeros((), device=self.device)
        first_dev = torch.zeros((), device=self.device)
        kl_sum = torch.zeros((), device=self.device)
        grad_norms, opt_steps, skipped, terms = [], 0, 0, 0
        for m in range(n_micro):
            rows = torch.arange(m * mb, min(b, (m + 1) * mb))
            for t in range(num_trained):
                steps = selected[rows, t]
                logp, kl = self._log_prob(traj, rows, steps)
                old = old_logp[rows.to(old_logp.device), steps.to(old_logp.device)]
                loss, stats = clipped_policy_loss(logp, old, adv[rows.to(adv.device)], g.clip_range)
                if kl is not None:  # beta * mean KL, normalised like the policy term below
                    loss = loss + g.kl_coef * kl.mean()
                    kl_sum += kl.detach().mean()
                loss = loss * (scale * rows.numel() / mb)
                loss.backward()
                loss_sum += loss.detach()
                window_loss += loss.detach()
                ratio_sum += stats.ratio_mean
                clip_sum += stats.clip_fraction
                terms += 1
                if m == 0:  # every trained step of the first micro-batch precedes any optimizer step
                    first_dev = torch.maximum(first_dev, stats.ratio_abs_dev_max)
            last = m == n_micro - 1
            if (m + 1) % g.gradient_accumulation_steps == 0 or last:
                norm, ok = self._optimizer_step(window_loss)
                window_loss = torch.zeros((), device=self.device)
                if ok:
                    grad_norms.append(norm)
                opt_steps += int(ok)
                skipped += int(not ok)
        self.model.eval()
        return UpdateStats(
            loss=float(loss_sum),
            grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            ratio_mean=float(ratio_sum / max(1, terms)), first_ratio_dev=float(first_dev),
            clip_fraction=float(clip_sum / max(1, terms)), optimizer_steps=opt_steps,
            skipped_steps=skipped, forward_passes=terms,
            kl=float(kl_sum / max(1, terms)) if self.kl_reference is not None else None,
        )

    def _optimizer_step(self, window_loss: torch.Tensor) -> tuple[float, bool]:
        """Clip, check finiteness (the same decision on every rank), step or skip."""
        from fastvideo.distributed.fsdp import clip_grad_norm

        norm = clip_grad_norm(self.model, self.cfg.optim.max_grad_norm)
        bad = (~torch.isfinite(norm)).float() + (~torch.isfinite(window_loss)).float()
        bad = platform.all_reduce_max(bad.reshape(1).to(self.device))
        if bad.item() > 0:
            self.optimizer.zero_grad(set_to_none=True)
            self.consecutive_nonfinite += 1
            main_print(f"[warning] iteration {self.iteration + 1}: non-finite loss or gradient "
                       f"(grad norm {float(norm)}); optimizer step skipped "
                       f"({self.consecutive_nonfinite} in a row)")
            if self.consecutive_nonfinite >= self.cfg.optim.max_nonfinite_steps:
                raise NonFiniteError(
                    f"{self.consecutive_nonfinite} optimizer steps in a row had a non-finite loss or gradient; "
                    "stopping. Lower --learning_rate or --max_grad_norm, use --mixed_precision no to rule out "
                    "bf16 overflow, or resume from an earlier checkpoint."
                )
            return float("nan"), False
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.consecutive_nonfinite = 0
        return float(norm), True

    def _update_ema(self, iteration: int) -> None:
        """Once per iteration, after its optimizer steps (upstream's ema_handler.update after
        train_one_step), from --ema_start_step on."""
        if self.ema is not None and iteration >= self.cfg.optim.ema_start_step:
            self.ema.update(self.model)

    # ------------------------------------------------------------------ loop
    def run_iteration(self) -> dict:
        iteration = self.iteration + 1
        self.timer.reset()
        platform.reset_peak_memory(self.device)
        t0 = time.perf_counter()
        indices = self.sampler.next_batch()
        cond, captions = self.load_prompts(indices)
        self.model.eval()
        plan = self.sampling_plan(iteration)
        if self.scorer is not None:
            traj, rewards = self._rollout_overlapped(iteration, cond, captions, indices, plan)
        else:
            with self.timer.phase("rollout"):
                traj = rollout(
                    self.family, self.model, self.vae, cond, captions, indices, self.rollout_cfg,
                    self.randomness, iteration, self.device, self.autocast_dtype, decode=False, plan=plan,
                )
            with self.timer.phase("decode"):
                traj.images = decode_images(self.vae, traj.x0, self.rollout_cfg, self.device, self.autocast_dtype,
                                            family=self.family, layout=traj.layout)
            with self.timer.phase("reward"):
                rewards = self.compute_rewards(traj)
        with self.timer.phase("reward"):
            if getattr(self.reward, "mix", None):  # MixGRPO's --multi_reward_mix (rewards/mix.py)
                advantages = self.reward.mixed_advantages(rewards.per_reward).clamp(
                    -self.cfg.grpo.adv_clip_max, self.cfg.grpo.adv_clip_max)
            else:
                advantages = self.compute_advantages(rewards.total)
        with self.timer.phase("update"):
            stats = self.update(traj, advantages, iteration)
            self._update_ema(iteration)
        self.iteration = iteration
        record = self._iteration_metrics(iteration, traj, rewards, advantages, stats, time.perf_counter() - t0)
        self._save_images(iteration, traj, rewards)
        if self.recorder is not None:
            self.recorder.record_iteration(iteration, traj, rewards, advantages, record)
        for source in (self.randomness, self.data_randomness):
            if source is not None:
                source.flush()
        return record

    def _rollout_overlapped(self, iteration, cond, captions, indices, plan):
        """Rollout with each chunk decoded and scored while the next samples (--reward_overlap).

        Timings: time_rollout is sampling alone, time_decode the chunks' decoding, time_reward
        what scoring still costs after the last chunk (the exposed part), time_reward_busy the
        worker's whole scoring time."""
        G = self.cfg.rollout.num_generations
        self.scorer.begin([c for c in captions for _ in range(G)])
        with self.timer.phase("rollout"):
            traj = rollout(
                self.family, self.model, self.vae, cond, captions, indices, self.rollout_cfg,
                self.randomness, iteration, self.device, self.autocast_dtype, decode=False,
                on_chunk=self.scorer.on_chunk, plan=plan,
            )
        # The rollout phase's wall time includes decoding its chunks (timed on their own).
        self.timer.seconds["rollout"] -= self.timer.seconds.get("decode", 0.0)
        with self.timer.phase("reward"):
            scored = self.scorer.finish()
            traj.images = scored.images
            rewards = self._reward_result(self.reward.combine(scored.raw))
        self.timer.seconds["reward_busy"] = scored.busy_s
        return traj, rewards

    def _iteration_metrics(self, iteration, traj, rewards, advantages, stats, seconds) -> dict:
        G = self.cfg.rollout.num_generations
        all_rewards = gather_cat(rewards.total.to(self.device)).cpu()
        record = {
            "iteration": iteration,
            "reward_mean": all_rewards.mean().item(),
            "reward_std": all_rewards.std(unbiased=False).item(),
            # Without --use_group the whole gathered batch is the one normalisation group.
            "zero_std_ratio": zero_std_ratio(all_rewards, G if self.cfg.grpo.use_group else all_rewards.numel()).item(),
        }
        for name, vals in rewards.per_reward.items():
            everything = gather_cat(vals.to(self.device)).cpu()
            record[f"reward/{name}_mean"] = everything.mean().item()
            record[f"reward/{name}_std"] = everything.std(unbiased=False).item()
        all_adv = gather_cat(advantages.to(self.device)).cpu()
        record.update(adv_mean=all_adv.mean().item(), adv_std=all_adv.std(unbiased=False).item(),
                      adv_abs_max=all_adv.abs().max().item())
        means = reduce_scalars({
            "loss": stats.loss, "grad_norm": stats.grad_norm, "ratio_mean": stats.ratio_mean,
            "clip_fraction": stats.clip_fraction,
            **({"kl": stats.kl} if stats.kl is not None else {}),
            **{f"time_{k}": v for k, v in self.timer.seconds.items()},
        }, self.device, "mean")
        maxes = reduce_scalars({
            "first_ratio_dev": stats.first_ratio_dev, "time_iteration": seconds,
            "peak_memory_gb": platform.peak_memory_bytes(self.device) / 2**30,
            "skipped_steps": stats.skipped_steps,
        }, self.device, "max")
        record.update(means)
        record.update(maxes)
        record["optimizer_steps"] = stats.optimizer_steps
        record["forward_passes_update"] = stats.forward_passes
        record["forward_passes_rollout"] = traj.rollout_forward_samples()
        record["shared_ode_prefix"] = traj.shared_prefix
        if traj.plan is not None and traj.plan.window_start >= 0:
            record["sde_window_start"] = traj.plan.window_start
        record["lr"] = self.lr_scheduler.get_last_lr()[0]
        record["samples_per_s"] = all_rewards.numel() / max(seconds, 1e-9)
        self.metrics.write(record)
        if self.wandb_run is not None:
            self.wandb_run.log(record, step=iteration)
        return record

    def _save_images(self, iteration: int, traj: Trajectory, rewards: RewardResult) -> None:
        every = self.cfg.output.save_images_every
        if every <= 0 or iteration % every:
            return
        from fastvideo.sampling.images import save_group_grids, save_images

        out = self.cfg.output.image_dir
        save_images(traj.images, out, iteration, self.info.rank)
        save_group_grids(traj.images, rewards.total, self.cfg.rollout.num_generations, out, iteration,
                         self.info.rank, traj.captions)

    def train(self) -> list[dict]:
        from tqdm.auto import tqdm

        cfg = self.cfg
        records = []
        bar = tqdm(total=cfg.optim.max_train_steps, initial=self.iteration, desc="GRPO", unit="it",
                   disable=not self.info.is_main, dynamic_ncols=True)
        if self.evaluation is not None:
            self.evaluation.start(self)  # evaluates the base model at iteration 0
        while self.iteration < cfg.optim.max_train_steps:
            record = self.run_iteration()
            records.append(record)
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward_mean']:.4f}", loss=f"{record['loss']:.3g}",
                            s_it=f"{record['time_iteration']:.1f}")
            if self.iteration % cfg.output.checkpointing_steps == 0 or self.iteration == cfg.optim.max_train_steps:
                self.save_checkpoint()
            if self.evaluation is not None and self.evaluation.after_iteration(self):
                break  # the reward-hacking guard stopped the run (after writing a checkpoint)
        bar.close()
        if self.scorer is not None:
            self.scorer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        return records
