"""DanceGRPO's clipped GRPO objective (with MixGRPO's advantage modes and the KL term).

Advantages: per group of G samples (--use_group), or over the data-parallel group's gathered batch
(upstream without --use_group); MixGRPO's --multi_reward_mix mixes per-reward scores instead.
Update work: each sample trains on T of the plan's trainable transitions, chosen by a seeded
permutation per sample; micro-batches of --train_micro_batch_size samples, one Term per
(micro-batch, trained step). Loss of a Term: the clipped ratio of the stored transition's
log-probability under the current policy to the rollout's, plus beta * KL to the reference,
scaled so every sample's term weighs 1 / (mb * GA * T).
"""

from __future__ import annotations

import math

import torch

from fastvideo.index_copies import on
from fastvideo.algorithms.base import Objective, ObjectiveContext, RewardResult, StatsAccumulator, Term
from fastvideo.algorithms.settings import GRPOSettings
from fastvideo.grpo.advantages import finite_batch_advantages, finite_group_advantages, global_std_advantages
from fastvideo.grpo.kl import flow_grpo_step_kl, gaussian_step_kl
from fastvideo.grpo.loss import clipped_policy_loss
from fastvideo.algorithms.grpo_guard.term import GUARD_TERMS, guard_term
from fastvideo.sampling.rollout import transition_gaussian


class GRPOObjective(Objective):
    name = "grpo"
    settings = GRPOSettings
    needs_log_probs = True

    def __init__(self, context: ObjectiveContext):
        cfg = context.cfg
        self.g = cfg.grpo
        self.u = cfg.update  # micro-batch size and accumulation (the update's)
        self.mix = cfg.mix  # the SDE window / solver of the rollout plan (sampling.mix)
        self.num_generations = cfg.rollout.num_generations
        self.eta = cfg.rollout.eta
        self.dims = context.dims
        self.device = context.device
        self.randomness = context.randomness
        self.reward = context.reward
        if self.g.global_std and getattr(self.reward, "mix", None):
            from fastvideo.errors import ConfigError

            raise ConfigError("--global_std does not apply with --reward_mix (MixGRPO's mixed advantages have "
                              "their own per-group statistics): drop one of them")
        if self.g.trimmed_ratio > 0:
            kept = self.num_generations - min(int(self.num_generations * self.g.trimmed_ratio), self.num_generations - 1)
            if kept < 2:
                from fastvideo.errors import ConfigError

                raise ConfigError(f"--trimmed_ratio {self.g.trimmed_ratio} leaves {kept} of the {self.num_generations} "
                                  "rewards of a group: a std needs 2; lower it or raise --num_generations")

    # ------------------------------------------------------------------ advantages
    def advantages(self, rewards: RewardResult) -> torch.Tensor:
        if getattr(self.reward, "mix", None):  # --reward_mix (MixGRPO's --multi_reward_mix)
            trim = {"trim_ratio": self.g.trimmed_ratio} if self.g.trimmed_ratio > 0 else {}
            adv = self.reward.mixed_advantages(rewards.per_reward, **trim)
            adv = adv.clamp(-self.g.adv_clip_max, self.g.adv_clip_max)
        else:
            adv = self.group_advantages(rewards.total)
        self._last_advantages = adv  # the sign decides --advantage_rerange_strategy balance's order
        # MultiReward.combine marks a sample any reward scored non-finite NaN in the total: its
        # advantage is 0 (no policy term) and its KL terms are masked in loss(). Always a mask, never
        # a host-side "all kept?" test: that read-back would cost a sync per iteration (the budget in
        # tests/training/test_sync_budget.py), and where(True, x, 0) is x bit for bit.
        self._kept = torch.isfinite(rewards.total)
        if self.g.drop_zero_advantage:  # Flow-GRPO: out of the update, KL term included (still a mask)
            self._kept = self._kept & (adv.to(self._kept.device) != 0)
        return adv

    def keep_samples(self, rows: torch.Tensor) -> None:
        """--bestofn: the per-sample state of advantages() re-indexed to the trained rows."""
        for name in ("_last_advantages", "_kept"):
            value = getattr(self, name, None)
            if value is not None:
                setattr(self, name, value[rows.to(value.device)])

    def kept_rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        """[b] bool: which of ``rows`` kept a finite reward (and, with --drop_zero_advantage, a
        non-zero advantage); None when no advantages were computed (a reference loop calling loss()
        alone)."""
        kept = getattr(self, "_kept", None)
        return None if kept is None else kept[on(rows, kept.device)]

    def _dropped_masked(self, per_sample: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[b] per-sample terms with the rows of dropped samples set to 0 (as their policy term is)."""
        keep = self.kept_rows(rows)
        if keep is None:
            return per_sample
        return torch.where(keep.to(per_sample.device), per_sample, torch.zeros_like(per_sample))

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """[B] local rewards -> [B] advantages. Groups live on one rank; without --use_group the
        whole data-parallel batch is normalised, so rewards are gathered first. A non-finite
        reward (a sample MultiReward dropped) gets advantage 0 and stays out of its group's
        statistics; all finite, the plain formulas run (bit-identical)."""
        g = self.g
        unbiased = g.adv_std == "sample"
        if g.use_group and not g.global_std:
            return finite_group_advantages(rewards, self.num_generations, g.adv_clip_max, unbiased, g.trimmed_ratio)
        # Gathered with the NaNs in: every rank sees the same mask and takes the same path.
        everything = self.dims.gather_dp(rewards.to(self.device)).cpu()
        if g.use_group:  # --global_std: a rank's groups are whole, so the gathered batch's are too
            adv = global_std_advantages(everything, self.num_generations, g.adv_clip_max, unbiased)
        else:
            adv = finite_batch_advantages(everything, g.adv_clip_max, unbiased)
        b = rewards.numel()
        return adv[self.dims.dp_rank * b:(self.dims.dp_rank + 1) * b]

    # ------------------------------------------------------------------ work
    def sampling_plan(self, iteration: int, sampling_steps: int, shift: float):
        """The SDE / ODE / DPM-Solver++ steps of the sampling flags and the transitions that may
        train (DanceGRPO's, or MixGRPO's window of this iteration): sampling.mix."""
        from fastvideo.sampling.mix import plan_for_iteration

        n = sampling_steps
        return plan_for_iteration(self.mix, n, shift, self.g.candidate_steps(n), self.g.trained_steps(n), iteration,
                                  self.randomness)

    def plan_update(self, traj, iteration: int) -> list[list[Term]]:
        self.iteration = iteration  # the rollout's, which addresses its step noise (GRPO-Guard's old means)
        plan = traj.plan
        perms = self.randomness.timestep_permutations(iteration, traj.sample_ids, len(plan.trainable))
        selected = plan.select_steps(perms)  # [B, T] on CPU
        order = self.sample_order(traj, iteration)
        b, mb = order.numel(), self.u.train_micro_batch_size
        micro = []
        for m in range(math.ceil(b / mb)):
            rows = order[m * mb:min(b, (m + 1) * mb)]
            micro.append([Term(m, rows, selected[rows, t]) for t in range(plan.num_trained)])
        return micro

    def sample_order(self, traj, iteration: int) -> torch.Tensor:
        """int64 [B'] rows in the order the update visits them: 0..B-1, or MixGRPO's
        --advantage_rerange_strategy (random: shuffled; balance: the positive and the negative
        advantages each shuffled, then alternated starting with the smaller set, the rest of the
        larger set after; zero advantages are left out, as MixGRPO's balance_pos_neg does)."""
        b = traj.num_samples
        if self.g.advantage_rerange == "null":
            return torch.arange(b)
        key = int(traj.sample_ids[0])
        if self.g.advantage_rerange == "random":
            return self.randomness.sample_order(iteration, key, b)
        adv = getattr(self, "_last_advantages", None)
        if adv is None or adv.numel() != b:
            raise RuntimeError("advantage_rerange_strategy balance needs this iteration's advantages first")
        pos, neg = torch.nonzero(adv.cpu() > 0).flatten(), torch.nonzero(adv.cpu() < 0).flatten()
        pos = pos[self.randomness.sample_order(iteration, key, pos.numel(), part=1)]
        neg = neg[self.randomness.sample_order(iteration, key, neg.numel(), part=2)]
        small, large = (pos, neg) if pos.numel() < neg.numel() else (neg, pos)
        pairs = torch.stack([small, large[:small.numel()]], dim=1).flatten()
        return torch.cat([pairs, large[small.numel():]])

    # ------------------------------------------------------------------ loss
    def log_prob(self, policy, traj, rows: torch.Tensor, steps: torch.Tensor):
        """Log-prob under the current policy of the stored transitions (rows[i], steps[i]) -> [b],
        and with --kl_coef the KL of each step to the reference policy's -> [b] (else None)."""
        t, kl = self.transition(policy, traj, rows, steps)
        self.last_transition = t  # what a policy loss reads beyond the log-prob (GRPO-Guard's step means)
        return t.log_prob, kl

    def transition(self, policy, traj, rows: torch.Tensor, steps: torch.Tensor):
        """(training.policy.TransitionLogProb of the stored transitions under the current policy,
        the KL of each step to the reference's [b] with --kl_coef, else None)."""
        t = policy.transition_log_prob(traj, rows, steps, self.eta)
        if not policy.has_reference:
            return t, None
        # The step Gaussians of the plan's SDE; under guidance both velocities are the guided ones
        # (the family's velocity), as Flow-GRPO's compute_log_prob with the adapters off.
        v_ref = policy.reference_velocity(traj, rows, t.x, t.sigma)
        kind, sigma_max = traj.plan.sde_kind, traj.plan.host_sigmas[1]
        ref_mean, _ = transition_gaussian(kind, t.x, v_ref, t.sigma, t.sigma_next, self.eta, sigma_max)
        mean, std = transition_gaussian(kind, t.x, t.velocity, t.sigma, t.sigma_next, self.eta, sigma_max)
        if kind in ("dance", "flash"):  # Flash-GRPO's: mean((mu - mu_ref)^2) / (2 (g sqrt(-dt))^2)
            return t, gaussian_step_kl(mean, ref_mean, std)
        return t, flow_grpo_step_kl(mean, ref_mean, std, t.sigma, t.sigma_next)

    def loss(self, policy, traj, advantages: torch.Tensor, term: Term, stats: StatsAccumulator) -> torch.Tensor:
        g = self.g
        rows, steps = term.rows, term.steps
        num_trained = traj.plan.num_trained
        scale = g.loss_coef / (self.u.gradient_accumulation_steps * num_trained)
        logp, kl = self.log_prob(policy, traj, rows, steps)
        old = traj.rollout_log_prob(rows, steps)
        loss, s, extra = self.policy_term(traj, logp, old, advantages[on(rows, advantages.device)], term)
        sums = {"ratio_mean": s.ratio_mean, "clip_fraction": s.clip_fraction, **extra}
        if kl is not None:  # beta * mean KL, normalised like the policy term below
            kl = self._dropped_masked(kl, rows).mean()
            loss = loss + g.kl_coef * kl
            sums["kl"] = kl.detach()
        if g.rollout_kl_coef > 0:  # MixGRPO's kl_loss: 0.5 * mean((logp - logp_rollout)^2), same scale
            rollout_kl = 0.5 * self._dropped_masked((logp - old) ** 2, rows).mean()
            loss = loss + g.rollout_kl_coef * rollout_kl
            sums["rollout_kl"] = rollout_kl.detach()
        stats.add(term, sums, {"first_ratio_dev": s.ratio_abs_dev_max})
        return loss * (scale * rows.numel() / self.u.train_micro_batch_size)

    def policy_term(self, traj, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, term: Term):
        """(loss, grpo.loss.LossStats, {metric: detached 0-d}) of the term's policy loss: --policy_loss's."""
        return POLICY_LOSSES[self.g.policy_loss](self, traj, logp, old, adv, term)

    def summarize(self, stats: StatsAccumulator) -> tuple[dict[str, float], dict[str, float]]:
        means = {"ratio_mean": stats.mean("ratio_mean"), "clip_fraction": stats.mean("clip_fraction")}
        if self.g.kl_coef > 0:
            means["kl"] = stats.mean("kl")
        if self.g.rollout_kl_coef > 0:
            means["rollout_kl"] = stats.mean("rollout_kl")
        means.update({k: stats.mean(k) for k in POLICY_LOSS_TERMS[self.g.policy_loss]})
        first = stats.first_max.get("first_ratio_dev", torch.zeros(()))
        return means, {"first_ratio_dev": float(first)}



def clip_term(objective: GRPOObjective, traj, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, term: Term):
    """DanceGRPO's clipped ratio (grpo.loss.clipped_policy_loss) -> (loss, LossStats, {})."""
    loss, s = clipped_policy_loss(logp, old, adv, objective.g.clip_range)
    return loss, s, {}


# --policy_loss NAME -> term(objective, traj, log-probs [b] (objective.last_transition: their step),
# the rollout's log-probs [b], advantages [b], term)
# -> (loss, grpo.loss.LossStats, {metric: detached 0-d}); and the metrics each one logs
POLICY_LOSSES = {"clip": clip_term, "grpo_guard": guard_term}
POLICY_LOSS_TERMS = {"clip": (), "grpo_guard": GUARD_TERMS}
