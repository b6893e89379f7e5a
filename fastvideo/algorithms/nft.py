"""DiffusionNFT (NVlabs, "Online Diffusion Reinforcement via the Forward Process"), --algorithm nft.

Rollout: the OLD policy samples with a deterministic solver (--nft_solver dpm: DPM-Solver++ 2M;
ode: Euler; sde: the run's SDE plan); only each sample's clean latent (Trajectory.x0, what was
decoded and rewarded) and its conditioning are used, no log-probabilities.
Advantages: GRPO's (per group with --use_group, clipped to +-adv_clip_max), shaped by --adv_mode.
Update: each sample trains on T = int(N * --timestep_fraction) of the N sampling timesteps
(a seeded permutation per sample); at timestep t its clean latent is noised forward,
x_t = (1 - t) x0 + t eps, with eps drawn from the run's randomness source by (iteration, sample,
step), so a resumed run sees the same noise. Loss: nft_loss.nft_policy_loss, plus
--kl_coef * mean((v - v_ref)^2) against the frozen base (LoRA: adapters off).
Old policy (training.ema.WeightCopy, built by the trainer: ObjectiveContext.copy_weights): a
float32 copy of this rank's local shards of the trainable weights (FSDP: the flat
shards, so it is sharded by construction; LoRA: the adapters only, a second adapter set), swapped
into the model for the rollout and for v_old; after each iteration
old <- decay * old + (1 - decay) * current, decay = nft_loss.decay_schedule(optimizer steps so far).
It is checkpointed as old_policy.safetensors (gathered, like the EMA) through weight_sets().
"""

from __future__ import annotations

import contextlib
import math

import torch

from fastvideo.index_copies import on
from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator, Term
from fastvideo.algorithms.grpo import GRPOObjective
from fastvideo.algorithms.nft_settings import NFTSettings
from fastvideo.algorithms.nft_loss import decay_schedule, nft_policy_loss, optimality, velocity_kl
from fastvideo.errors import ConfigError

OLD_POLICY = "old_policy"  # the checkpoint's old_policy.safetensors


def nft_trained_steps(num_steps: int, fraction: float) -> int:
    """T: timesteps each sample trains on, int(N * fraction) as the reference, at least 1."""
    return max(1, int(num_steps * fraction))


def deterministic_plan(solver: str, sampling_steps: int, shift: float):
    """The rollout's schedule for --nft_solver ode|dpm (nothing trainable: NFT needs no densities)."""
    from fastvideo.sampling import sde
    from fastvideo.sampling.plan import DPM, SamplingPlan, ode_plan

    if solver == "ode":
        return ode_plan(sampling_steps, shift)
    return SamplingPlan(sigmas=sde.sigma_schedule(sampling_steps, shift), kinds=(DPM,) * sampling_steps,
                        trainable=(), num_trained=0, dpm_order=2, dpm_solver_type="midpoint",
                        dpm_algorithm="dpmsolver++")


def forward_process_terms(randomness, traj, iteration: int, fraction: float, micro_batch: int) -> list[list[Term]]:
    """Micro-batches of ``micro_batch`` samples, one Term per (micro-batch, trained timestep): each
    sample trains T = nft_trained_steps(N, fraction) of the N sampling timesteps, a seeded
    permutation per sample; Term.steps index the rollout's sigmas (t = sigmas[step], never 0)."""
    n = traj.plan.num_steps
    T = nft_trained_steps(n, fraction)
    selected = randomness.timestep_permutations(iteration, traj.sample_ids, n)[:, :T]
    b, mb = traj.num_samples, micro_batch
    return [[Term(m, rows, selected[rows, k]) for k in range(T)]
            for m in range(math.ceil(b / mb)) for rows in [torch.arange(m * mb, min(b, (m + 1) * mb))]]


def forward_noised(randomness, iteration: int, traj, rows: torch.Tensor, steps: torch.Tensor):
    """The forward process at the term's timesteps: (x0 [b, L, C], t [b], eps [b, L, C], x_t =
    (1 - t) x0 + t eps), float32; eps from the run's randomness by (iteration, sample, step)."""
    x0 = traj.x0[on(rows, traj.x0.device)].float()
    t = traj.sigmas[on(steps, traj.sigmas.device)].float()
    eps = randomness.train_noise(iteration, traj.sample_ids[rows], steps, x0.shape[1:]).to(x0.device)
    tb = t.reshape(-1, *([1] * (x0.ndim - 1)))
    return x0, t, eps, (1.0 - tb) * x0 + tb * eps


def scaled_forward_term(objective, traj, term: Term, stats: StatsAccumulator, loss: torch.Tensor, sums: dict,
                        v: torch.Tensor, v_ref: torch.Tensor | None, keep: torch.Tensor | None) -> torch.Tensor:
    """A forward-process objective's term (NFT's, AWM's): its policy loss plus --kl_coef *
    velocity_kl(v, v_ref) when v_ref is given, the statistics recorded, scaled so a sample's T
    terms weigh 1 / (micro-batch x GA x T) as GRPO's."""
    g, u = objective.g, objective.u
    if v_ref is not None:
        kl = velocity_kl(v, v_ref, keep)
        loss = loss + g.kl_coef * kl
        sums["kl"] = kl.detach()
    stats.add(term, sums)
    T = nft_trained_steps(traj.plan.num_steps, g.timestep_fraction)
    return loss * (g.loss_coef / (u.gradient_accumulation_steps * T) * term.rows.numel() / u.train_micro_batch_size)


class NFTObjective(GRPOObjective):
    name = "nft"
    settings = NFTSettings
    needs_log_probs = False
    needs_trajectory = False  # the update reads Trajectory.x0 and cond only
    needs_old_policy = True  # the rollout's and v_old's weights (training.ema.WeightCopy)

    def __init__(self, context: ObjectiveContext):
        super().__init__(context)
        cfg = context.cfg
        if context.copy_weights is None:
            raise ConfigError("--algorithm nft keeps a copy of the trainable weights: its context needs "
                              "copy_weights (the trainer's training.ema.WeightCopy of the model)")
        self.nft = cfg.nft
        self.old = context.copy_weights()  # training.ema.WeightCopy: this rank's shards, float32
        self.steps_per_iteration = cfg.derived(context.dims.dp_size)["optimizer_steps_per_iteration"]
        self.iteration = 0  # the update's iteration (plan_update), which addresses its noise
        self.last_decay = 0.0

    # ------------------------------------------------------------------ protocol hooks
    def sampling_plan(self, iteration: int, sampling_steps: int, shift: float):
        if self.nft.solver == "sde":  # the SDE plan of the sampling flags (GRPO's)
            return super().sampling_plan(iteration, sampling_steps, shift)
        return deterministic_plan(self.nft.solver, sampling_steps, shift)

    def sampling_policy(self) -> contextlib.AbstractContextManager:
        return self.old.swapped_in()

    def weight_sets(self) -> dict:
        return {OLD_POLICY: self.old}

    # ------------------------------------------------------------------ work
    def plan_update(self, traj, iteration: int) -> list[list[Term]]:
        """Micro-batches of --train_micro_batch_size samples, one Term per (micro-batch, trained
        timestep); Term.steps index the rollout's sigmas (t = sigmas[step], never 0)."""
        self.iteration = iteration
        return forward_process_terms(self.randomness, traj, iteration, self.g.timestep_fraction,
                                     self.u.train_micro_batch_size)

    def loss(self, policy, traj, advantages: torch.Tensor, term: Term, stats: StatsAccumulator) -> torch.Tensor:
        g, rows, steps = self.g, term.rows, term.steps
        x0, t, _, x_t = forward_noised(self.randomness, self.iteration, traj, rows, steps)
        with torch.no_grad():
            with self.old.swapped_in(policy.model):
                v_old = policy.velocity(traj, rows, x_t, t)
            v_ref = policy.reference_velocity(traj, rows, x_t, t) if g.kl_coef > 0 else None
        v = policy.velocity(traj, rows, x_t, t)
        r = optimality(advantages[on(rows, advantages.device)], g.adv_clip_max, self.nft.adv_mode)
        # A sample dropped for a non-finite reward has advantage 0, which NFT reads as r = 0.5 (half
        # positive, half negative): it must be masked out, not left to train (GRPO's advantages()).
        keep = self.kept_rows(rows)
        loss, sums = nft_policy_loss(v, v_old, x_t, x0, t, r.to(x0.device), self.nft.beta, g.adv_clip_max, keep)
        return scaled_forward_term(self, traj, term, stats, loss, sums, v, v_ref, keep)

    def summarize(self, stats: StatsAccumulator) -> tuple[dict[str, float], dict[str, float]]:
        keys = ["nft_positive", "nft_negative", "old_deviate"] + (["kl"] if self.g.kl_coef > 0 else [])
        means = {k: stats.mean(k) for k in keys}
        # the decay after_update applies to this iteration's weights
        means["old_decay"] = decay_schedule(self.iteration * self.steps_per_iteration, self.nft.decay_type)
        return means, {}

    def after_update(self, policy, iteration: int) -> None:
        """The reference's return_decay(global_step) after this iteration's optimizer steps."""
        self.last_decay = decay_schedule(iteration * self.steps_per_iteration, self.nft.decay_type)
        self.old.step(self.last_decay)

    # ------------------------------------------------------------------ state (the weights: weight_sets)
    def state_dict(self) -> dict:
        return {"old_updates": self.old.num_updates, "last_decay": self.last_decay}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"old_updates", "last_decay"}:
            raise ConfigError(f"the checkpoint's objective state {sorted(state)} is not NFT's; resume it with the "
                              "--algorithm it was trained with")
        self.old.num_updates = int(state["old_updates"])
        self.last_decay = float(state["last_decay"])
