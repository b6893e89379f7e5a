"""A sampling schedule as data: which transitions are SDE, ODE or DPM-Solver++, and which train.

One ``SamplingPlan`` per iteration is computed from the flags and the iteration number
(fastvideo.sampling.mix); the rollout loop and the update read it. DanceGRPO (every transition
SDE), MixGRPO (an SDE window, Euler ODE elsewhere), MixGRPO-Flash (ODE after the window
compressed into fewer DPM-Solver++ steps) and Flow-GRPO-Fast (k SDE steps at a random place) are
different plans, not different loops. MixGRPO's --dpm_apply_strategy all is one more: every
deterministic transition a multistep DPM-Solver step on the full schedule, the SDE transitions
first-order SDE-DPM-Solver steps.

Transition k goes from sigmas[k] to sigmas[k+1]; n = len(kinds) = len(sigmas) - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fastvideo.sampling import sde
from fastvideo.sampling.solvers import DPM_ALGORITHMS, DPM_SDE_KINDS, DPM_SOLVER_TYPES

SDE, ODE, DPM = "sde", "ode", "dpm"
# DanceGRPO's SDE (sde.sde_step), Flow-GRPO's (solvers.flow_sde_step), SDE-DPM-Solver++
# (solvers.dpm_sde_step, for --dpm_apply_strategy all) or Flash-GRPO's (solvers.flash_sde_step,
# --algorithm flash_grpo's plan)
SDE_KINDS = ("dance", "flow") + DPM_SDE_KINDS + ("flash",)


@dataclass(frozen=True)
class SamplingPlan:
    """One iteration's schedule.

    sigmas: float32 CPU tensor [n + 1], 1 .. 0.
    kinds: n entries of SDE / ODE / DPM.
    trainable: transition indices the update may train (all of them SDE), in order.
    num_trained: how many of ``trainable`` each sample trains (T); a per-sample random
        permutation of ``trainable`` picks them, exactly as DanceGRPO's timestep selection.
    sde_kind: "dance", "flow" (--flow_grpo_sampling) or "sde-dpmsolver++" (--dpm_apply_strategy all).
    dpm_order, dpm_solver_type, dpm_algorithm: multistep DPM-Solver settings for DPM transitions
        (order 1-3; dpmsolver++ integrates the data prediction, dpmsolver the noise prediction).
    window_start: first SDE transition (-1 when every transition is SDE); logged.
    """

    sigmas: torch.Tensor
    kinds: tuple[str, ...]
    trainable: tuple[int, ...]
    num_trained: int
    sde_kind: str = "dance"
    dpm_order: int = 2
    dpm_solver_type: str = "midpoint"
    window_start: int = -1
    dpm_algorithm: str = "dpmsolver++"

    def __post_init__(self):
        n = len(self.kinds)
        if self.sigmas.ndim != 1 or self.sigmas.numel() != n + 1:
            raise ValueError(f"a plan with {n} transitions needs {n + 1} sigmas, got {tuple(self.sigmas.shape)}")
        bad = [k for k in self.kinds if k not in (SDE, ODE, DPM)]
        if bad:
            raise ValueError(f"unknown step kinds {bad}; valid: {SDE}, {ODE}, {DPM}")
        not_sde = [k for k in self.trainable if not 0 <= k < n or self.kinds[k] != SDE]
        if not_sde:
            raise ValueError(f"trainable transitions {not_sde} are not SDE transitions of this plan")
        if not 1 <= self.num_trained <= len(self.trainable) and (self.num_trained, self.trainable) != (0, ()):
            raise ValueError(f"num_trained {self.num_trained} must be in [1, {len(self.trainable)}] "
                             "(0 only for a plan with no trainable transition)")
        if self.sde_kind not in SDE_KINDS:
            raise ValueError(f"sde_kind {self.sde_kind!r}; valid: {SDE_KINDS}")
        if self.dpm_algorithm not in DPM_ALGORITHMS or self.dpm_solver_type not in DPM_SOLVER_TYPES:
            raise ValueError(f"dpm algorithm {self.dpm_algorithm!r} / solver type {self.dpm_solver_type!r}; valid: "
                             f"{DPM_ALGORITHMS} / {DPM_SOLVER_TYPES}")
        if not 1 <= self.dpm_order <= 3:
            raise ValueError(f"dpm_order {self.dpm_order} must be 1, 2 or 3")
        # The sigmas as Python floats, read once per plan: the step loops compare and pass them
        # without reading a tensor back (fastvideo.perf.syncs).
        object.__setattr__(self, "host_sigmas", tuple(self.sigmas.tolist()))
        if self.sde_kind in DPM_SDE_KINDS:
            to_data = [k for k in range(n) if self.kinds[k] == SDE and float(self.sigmas[k + 1]) <= 0.0]
            if to_data:
                raise ValueError(f"SDE-DPM-Solver transitions {to_data} end at sigma 0, where the step has no noise")

    @property
    def num_steps(self) -> int:
        return len(self.kinds)

    def select_steps(self, permutations: torch.Tensor) -> torch.Tensor:
        """Per-sample trained transitions. permutations int64 [B, len(trainable)] -> [B, T].

        With trainable = 0 .. n-1 this returns the permutations' first T columns unchanged, which
        keeps the DanceGRPO plan bit-identical to the path before plans existed."""
        if permutations.shape[-1] != len(self.trainable):
            raise ValueError(f"permutations over {permutations.shape[-1]} steps for {len(self.trainable)} trainable ones")
        from fastvideo.grpo.loss import timestep_selection

        index = torch.as_tensor(self.trainable, dtype=torch.long)
        return index[timestep_selection(permutations, self.num_trained)]

    def shared_prefix(self) -> int:
        """Leading Euler ODE transitions whose states depend only on the initial noise and the
        prompt: with --init_same_noise the G samples of a group pass through the same states, so
        the rollout computes them once per group. Limited so that the first DPM step still finds
        its multistep history (dpm_order - 1 earlier outputs) after the prefix."""
        lead = 0
        while lead < self.num_steps and self.kinds[lead] == ODE:
            lead += 1
        if DPM in self.kinds:
            lead = max(0, min(lead, self.kinds.index(DPM) - (self.dpm_order - 1)))
        return lead

    def describe(self) -> str:
        """'SSOO...D' one letter per transition (S sde, O ode, D dpm)."""
        return "".join({SDE: "S", ODE: "O", DPM: "D"}[k] for k in self.kinds)


def full_sde_plan(sampling_steps: int, shift: float, candidates: int, num_trained: int,
                  sde_kind: str = "dance", **dpm) -> SamplingPlan:
    """DanceGRPO: every transition SDE; transitions 0 .. candidates-1 may train, T of them.

    With an SDE-DPM-Solver kind the last transition (to sigma 0, where that SDE has no noise) is a
    deterministic DPM step instead, as upstream's sampler makes it. dpm: dpm_order,
    dpm_solver_type, dpm_algorithm."""
    kinds = (SDE,) * sampling_steps
    if sde_kind in DPM_SDE_KINDS:
        kinds = (SDE,) * (sampling_steps - 1) + (DPM,)
    return SamplingPlan(
        sigmas=sde.sigma_schedule(sampling_steps, shift), kinds=kinds,
        trainable=tuple(range(candidates)), num_trained=num_trained, sde_kind=sde_kind, **dpm,
    )


def ode_plan(sampling_steps: int, shift: float) -> SamplingPlan:
    """Euler ODE on every transition of the shifted schedule, nothing trainable (evaluation)."""
    return SamplingPlan(sigmas=sde.sigma_schedule(sampling_steps, shift), kinds=(ODE,) * sampling_steps,
                        trainable=(), num_trained=0)


def on_grid(plan: SamplingPlan, grid: str, sampling_steps: int, shift: float,
            terminal: float | None = None) -> SamplingPlan:
    """The plan on --sigma_grid's noise levels: the same transitions, kinds and trained steps,
    sigmas = sde.grid_sigmas(grid, N, shift). Every plan is built on the shifted_linspace grid, so
    that one stays the plan itself (bit for bit); another grid replaces the full schedule, and a
    plan whose sigmas are not the full schedule (a compressed DPM tail) is refused (the
    configuration refuses that combination before a run starts). ``terminal``: the family's
    scheduler's shift_terminal (ModelFamily.schedule_terminal): every non-zero sigma is stretched as
    that scheduler stretches its grid (sde.stretch_to_terminal, scaled by the full grid's last
    non-zero sigma, so a compressed tail maps consistently); None leaves the sigmas as they are."""
    if grid != "shifted_linspace":
        if plan.num_steps != sampling_steps or not torch.equal(plan.sigmas, sde.sigma_schedule(sampling_steps, shift)):
            raise ValueError(f"sigma grid {grid!r} replaces the full {sampling_steps}-step schedule; this plan's "
                             "sigmas are another schedule (a compressed tail)")
        plan = replace(plan, sigmas=sde.grid_sigmas(grid, sampling_steps, shift))
    if terminal is None:
        return plan
    last = sde.grid_sigmas(grid, sampling_steps, shift)[-2]
    return replace(plan, sigmas=sde.stretch_to_terminal(plan.sigmas, terminal, last))


def compressed_tail_sigmas(sampling_steps: int, shift: float, first: int, compress_ratio: float) -> torch.Tensor:
    """Sigmas of the ODE segment that starts at transition ``first`` (sigma_first .. 0), compressed.

    MixGRPO's rule (dpm_apply_strategy post): with the window's last SDE transition w = first-1,
    points = max(int((N - w) * ratio), 1) sigmas, uniformly spaced in the unshifted time
    t in [t_first, 0] and then shifted, i.e. points - 1 transitions. We keep at least one
    transition while the segment is not empty (MixGRPO's points = 1 would stop at sigma > 0).
    Returns float32 [M + 1] starting at exactly sigma_schedule(N)[first] and ending at 0.
    """
    full = sde.sigma_schedule(sampling_steps, shift)
    remaining = sampling_steps - first
    if remaining <= 0:
        return full[sampling_steps:]
    points = max(int((remaining + 1) * compress_ratio), 1)
    m = min(max(points - 1, 1), remaining)
    t_first = torch.linspace(1.0, 0.0, sampling_steps + 1, dtype=torch.float32)[first].item()
    t = torch.linspace(t_first, 0.0, m + 1, dtype=torch.float32)
    tail = shift * t / (1.0 + (shift - 1.0) * t)
    tail[0] = full[first]  # the window ends where it ends in the full schedule, bit for bit
    return tail


def window_plan(sampling_steps: int, shift: float, start: int, size: int, *, candidates: int,
                num_trained: int | None = None, sde_kind: str = "dance", dpm_post_ratio: float | None = None,
                dpm_all: bool = False, dpm_order: int = 2, dpm_solver_type: str = "midpoint",
                dpm_algorithm: str = "dpmsolver++") -> SamplingPlan:
    """SDE on transitions start .. start+size-1 (clipped to the candidates), Euler ODE before;
    after the window Euler ODE, or DPM-Solver on a compressed schedule when dpm_post_ratio is
    given (--dpm_apply_strategy post). dpm_all (--dpm_apply_strategy all): the full schedule,
    DPM-Solver before and after the window, whose SDE is then of an SDE-DPM-Solver kind. The
    window's transitions are trainable; num_trained None trains all of them (MixGRPO
    --training_strategy part)."""
    if not 0 <= start < candidates:
        raise ValueError(f"window start {start} must be in [0, {candidates})")
    end = min(start + size, candidates)
    window = tuple(range(start, end))
    full = sde.sigma_schedule(sampling_steps, shift)
    head_kind = ODE
    if dpm_all:
        if dpm_post_ratio is not None:
            raise ValueError("dpm_all uses the full schedule; it takes no dpm_post_ratio")
        sigmas, head_kind, tail_kind, n_tail = full, DPM, DPM, sampling_steps - end
    elif dpm_post_ratio is None:
        sigmas, tail_kind, n_tail = full, ODE, sampling_steps - end
    else:
        tail = compressed_tail_sigmas(sampling_steps, shift, end, dpm_post_ratio)
        sigmas, tail_kind, n_tail = torch.cat([full[:end], tail]), DPM, tail.numel() - 1
    kinds = (head_kind,) * start + (SDE,) * len(window) + (tail_kind,) * n_tail
    return SamplingPlan(
        sigmas=sigmas, kinds=kinds, trainable=window,
        num_trained=len(window) if num_trained is None else min(num_trained, len(window)),
        sde_kind=sde_kind, dpm_order=dpm_order, dpm_solver_type=dpm_solver_type, window_start=start,
        dpm_algorithm=dpm_algorithm,
    )
