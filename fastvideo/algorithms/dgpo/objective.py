"""DGPO (arXiv 2510.08425), --algorithm dgpo, after Flow-Factory's DGPOTrainer (X-GenGroup/Flow-Factory
at a0b2bc5, src/flow_factory/trainers/dgpo.py).

Rollout: the Euler ODE (no log-probabilities, no stored steps), with the old policy (an EMA of the
weights, training.ema.WeightCopy) after --dgpo_switch_ema_ref optimizer steps. Advantages: GRPO's
per group. Update: iso-temporal: every sample of an iteration trains the same T = int(N x
--timestep_fraction) timesteps (one seeded permutation per iteration), each group with one noise
eps (by iteration and group id, the same at every timestep) at x_t = (1 - t) x0 + t eps; a term's
micro-batch holds whole groups (the settings refuse otherwise); loss dgpo.loss.dgpo_loss against
the frozen base (d_ref), with the DSM clip against the old policy, plus --kl_coef * mean((v - v_ref)^2).
After each iteration old <- decay old + (1 - decay) current, decay = min(--dgpo_ema_max_decay,
--dgpo_ema_ramp x optimizer steps so far) (Flow-Factory updates after every optimizer step).
"""

from __future__ import annotations

import contextlib
import math

import torch

from fastvideo.algorithms.base import ObjectiveContext, StatsAccumulator, Term
from fastvideo.algorithms.dgpo.loss import dgpo_loss
from fastvideo.algorithms.dgpo.settings import DGPOSettings
from fastvideo.algorithms.grpo import GRPOObjective
from fastvideo.algorithms.nft import OLD_POLICY, deterministic_plan, nft_trained_steps, scaled_forward_term
from fastvideo.errors import ConfigError
from fastvideo.index_copies import on

TIMESTEP_ID = 0  # the id the iteration's shared timestep permutation is drawn under


class DGPOObjective(GRPOObjective):
    name = "dgpo"
    settings = DGPOSettings
    needs_log_probs = False
    needs_trajectory = False  # the update reads Trajectory.x0 and cond only
    needs_old_policy = True  # the DSM clip's and the late rollout's weights

    def __init__(self, context: ObjectiveContext):
        super().__init__(context)
        if context.copy_weights is None:
            raise ConfigError("--algorithm dgpo keeps a copy of the trainable weights: its context needs copy_weights")
        self.dgpo = context.settings
        self.old = context.copy_weights()
        self.trained_group = context.cfg.rollout.trained_per_prompt  # |G| of a trained group (--bestofn K: K)
        self.steps_per_iteration = context.cfg.derived(context.dims.dp_size)["optimizer_steps_per_iteration"]
        self.iteration = 0

    def sampling_plan(self, iteration: int, sampling_steps: int, shift: float):
        return deterministic_plan("ode", sampling_steps, shift)

    def sampling_policy(self) -> contextlib.AbstractContextManager:
        late = self.old.num_updates * self.steps_per_iteration > self.dgpo.switch_ema_ref
        return self.old.swapped_in() if late else contextlib.nullcontext()

    def weight_sets(self) -> dict:
        return {OLD_POLICY: self.old}

    def plan_update(self, traj, iteration: int) -> list[list[Term]]:
        """Micro-batches of whole groups, one Term per (micro-batch, shared timestep)."""
        self.iteration = iteration
        n = traj.plan.num_steps
        T = nft_trained_steps(n, self.g.timestep_fraction)
        shared = self.randomness.timestep_permutations(iteration, [TIMESTEP_ID], n)[0, :T]
        b, mb = traj.num_samples, self.u.train_micro_batch_size
        return [[Term(m, rows, shared[k].repeat(rows.numel())) for k in range(T)]
                for m in range(math.ceil(b / mb)) for rows in [torch.arange(m * mb, min(b, (m + 1) * mb))]]

    def loss(self, policy, traj, advantages: torch.Tensor, term: Term, stats: StatsAccumulator) -> torch.Tensor:
        rows, steps = term.rows, term.steps
        x0 = traj.x0[on(rows, traj.x0.device)].float()
        t = traj.sigmas[on(steps, traj.sigmas.device)].float()
        groups = traj.group_ids[rows.cpu()]
        eps = self.randomness.train_noise(self.iteration, groups, torch.zeros_like(groups), x0.shape[1:])
        tb = t.reshape(-1, *([1] * (x0.ndim - 1)))
        x_t = (1.0 - tb) * x0 + tb * eps.to(x0.device)
        with torch.no_grad():
            v_ref = policy.reference_velocity(traj, rows, x_t, t)
            v_old = None
            if self.dgpo.clip_dsm:
                with self.old.swapped_in(policy.model):
                    v_old = policy.velocity(traj, rows, x_t, t)
        v = policy.velocity(traj, rows, x_t, t).float()
        _, index = torch.unique(groups, return_inverse=True)
        adv = advantages[on(rows, advantages.device)].to(x0.device)
        loss, sums = dgpo_loss(v, v_ref.float(), None if v_old is None else v_old.float(), eps.to(x0.device) - x0,
                               adv, index.to(x0.device), int(index.max()) + 1, self.dgpo.beta,
                               self.trained_group, self.g.clip_range)
        v_kl = v_ref if self.g.kl_coef > 0 else None
        return scaled_forward_term(self, traj, term, stats, loss, sums, v, v_kl, self.kept_rows(rows))

    def summarize(self, stats: StatsAccumulator) -> tuple[dict[str, float], dict[str, float]]:
        keys = ["dgpo_dsm", "dgpo_ref_gap", "dgpo_weight"] + (["clip_fraction"] if self.dgpo.clip_dsm else [])
        keys += ["kl"] if self.g.kl_coef > 0 else []
        means = {k: stats.mean(k) for k in keys}
        means["old_decay"] = self.decay(self.iteration)
        return means, {}

    def decay(self, iteration: int) -> float:
        return min(self.dgpo.ema_max_decay, self.dgpo.ema_ramp * iteration * self.steps_per_iteration)

    def after_update(self, policy, iteration: int) -> None:
        self.old.step(self.decay(iteration))

    def state_dict(self) -> dict:
        return {"old_updates": self.old.num_updates}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"old_updates"}:
            raise ConfigError(f"the checkpoint's objective state {sorted(state)} is not DGPO's; resume it with the "
                              "--algorithm it was trained with")
        self.old.num_updates = int(state["old_updates"])
