"""MixGRPO's sliding SDE window, MixGRPO-Flash's DPM-Solver++ tail and Flow-GRPO-Fast: the flags,
their settings and the per-iteration SamplingPlan.

Window semantics follow MixGRPO (Tencent-Hunyuan/MixGRPO, fastvideo/utils/grpo_states.py and
train_grpo_flux.py):

- ``--training_strategy part``: SDE on a window of ``--group_size`` W transitions, Euler ODE
  elsewhere; every window transition is trained (``--timestep_fraction`` does not apply, as
  upstream). ``all`` (default) is DanceGRPO: every transition SDE, a fraction trained.
- ``--sample_strategy progressive``: the window starts at 0 and moves by ``--prog_overlap_step``
  (with ``--prog_overlap``; else by W) every ``--iters_per_group`` iterations; past the last
  start it rolls back to 0 (``--roll_back``) or stays there. ``decay``/``exp_decay`` change
  the iterations per position as upstream; ``random`` starts at 0 on the first iteration and then
  draws the start every iteration from 0 .. C-1-W (C trainable transitions; upstream's
  ``max_timesteps - group_size`` with max_timesteps = N - 2).
- ``--dpm_algorithm_type dpmsolver++|dpmsolver --dpm_apply_strategy post``: after the window, the
  ODE runs on a compressed schedule (``--dpm_post_compress_ratio``) with multistep DPM-Solver++
  (data prediction) or DPM-Solver (noise prediction) of ``--dpm_solver_order`` 1-3; the history
  of the first DPM step is the preceding transitions' predictions.
- ``--dpm_apply_strategy all``: no compression; every deterministic transition (before and after
  the window, or only the last one when every step is SDE) is a multistep DPM-Solver++ step and the
  SDE transitions are first-order SDE-DPM-Solver++ steps, in the rollout and in the update (their
  noise is the solver's: ``--eta`` does not apply). ``dpmsolver`` is refused here: the noise-
  prediction solver is singular at FLUX's first sigma, 1.
- ``--sde_steps k --sde_start random|INT``: Flow-GRPO-Fast, k SDE steps at a start drawn per
  iteration (or fixed), ODE before and after, those k trained. A random start is drawn within
  ``--sde_window_range LO,HI`` (Flow-GRPO's ``sde_window_range``, default 0,5): uniform in
  LO .. HI-k, so the window lies in transitions LO .. HI-1.

The window position is a pure function of the iteration (and of the run's seeded randomness for
random starts), so a resumed run continues it exactly. Choices where upstream is silent or
breaks are listed in ``DEVIATIONS`` and in docs/mixgrpo.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from typing import TYPE_CHECKING

from fastvideo.settings import Settings, flag_group

if TYPE_CHECKING:  # the plan module imports torch: not needed to build the parser
    from fastvideo.sampling.plan import SamplingPlan

STRATEGIES = ("progressive", "random", "decay", "exp_decay")
DEFAULT_SDE_WINDOW_RANGE = "0,5"  # Flow-GRPO's sde_window_range default (0, 5)
EXP_DECAY_THRESHOLD, EXP_DECAY_K = 13, 0.1  # upstream GRPOTrainingStates defaults (no flags)

DEVIATIONS = (
    "the window may reach the last candidate transition (upstream's window stops one short, and is empty "
    "at the last position), so it is never empty",
    "the first DPM-Solver++ step uses the last window step's x0 as history whichever SDE is used "
    "(upstream does this only with --flow_grpo_sampling)",
    "the compressed tail keeps at least one transition (upstream's ratio rounding can stop above sigma 0)",
    "random window starts come from the run's seeded randomness (upstream draws unseeded)",
    "--dpm_algorithm_type dpmsolver integrates the noise prediction eps = x + (1 - sigma) v, as DPM-Solver "
    "defines it (upstream passes the x0 prediction to DPM-Solver's noise formulas)",
    "under --dpm_apply_strategy all the SDE steps are first-order SDE-DPM-Solver steps in the rollout as in "
    "the update (upstream samples them with the multistep solver but scores them with the first-order one, "
    "so its importance ratio is not 1 on the first update)",
)


def _add_flags(parser: argparse.ArgumentParser) -> None:
    g = flag_group(parser, "mixed sampling (MixGRPO window, DPM-Solver++, Flow-GRPO-Fast)")
    g.add_argument("--training_strategy", type=str, default="all", choices=["all", "part"],
                   help="all: every step SDE (DanceGRPO); part: SDE only in a sliding window (MixGRPO)")
    g.add_argument("--group_size", type=int, default=4,
                   help="MixGRPO's name for the SDE window size W in transitions (not the GRPO group: "
                        "that is --num_generations)")
    g.add_argument("--iters_per_group", type=int, default=25, help="iterations before the window moves")
    g.add_argument("--sample_strategy", type=str, default="progressive", choices=list(STRATEGIES),
                   help="how the window's start moves across iterations (see docs/mixgrpo.md)")
    g.add_argument("--prog_overlap", action="store_true",
                   help="move the window by --prog_overlap_step instead of by its size")
    g.add_argument("--prog_overlap_step", type=int, default=1,
                   help="with --prog_overlap: transitions the window moves each time (0: it stays where it starts)")
    g.add_argument("--max_iters_per_group", type=int, default=10, help="decay strategy: iterations at start 0")
    g.add_argument("--min_iters_per_group", type=int, default=1, help="decay strategy: iterations at the end")
    g.add_argument("--roll_back", action="store_true", help="restart the window at 0 after the last position")
    g.add_argument("--frozen_init_timesteps", type=int, default=-1,
                   help="training_strategy all: train this many steps per sample instead of the fraction (-1: off)")
    g.add_argument("--dpm_algorithm_type", type=str, default="null", choices=["null", "dpmsolver", "dpmsolver++"],
                   help="null (Euler ODE), dpmsolver++ (data prediction; MixGRPO-Flash) or dpmsolver (noise "
                        "prediction) for the deterministic steps")
    g.add_argument("--dpm_apply_strategy", type=str, default="post", choices=["post", "all"],
                   help="post: a compressed DPM-Solver schedule after the SDE window; all: DPM-Solver on every "
                        "step of the full schedule, SDE-DPM-Solver on the SDE steps")
    g.add_argument("--dpm_post_compress_ratio", type=float, default=0.4,
                   help="fraction of the steps after the window that DPM-Solver++ keeps")
    g.add_argument("--dpm_solver_order", type=int, default=2, choices=[1, 2, 3], help="order of the multistep solver")
    g.add_argument("--dpm_solver_type", type=str, default="heun", choices=["midpoint", "heun"],
                   help="second-order update of the solver")
    g.add_argument("--flow_grpo_sampling", action="store_true",
                   help="use Flow-GRPO's SDE (noise g = eta sqrt(sigma/(1-sigma))) instead of DanceGRPO's")
    g.add_argument("--sde_steps", type=int, default=0,
                   help="Flow-GRPO-Fast: k SDE (and trained) steps, ODE elsewhere (0: off)")
    g.add_argument("--sde_start", type=str, default="random",
                   help="Flow-GRPO-Fast: first SDE step, 'random' (drawn per iteration) or an integer")
    g.add_argument("--sde_window_range", type=str, default=DEFAULT_SDE_WINDOW_RANGE,
                   help="Flow-GRPO-Fast with --sde_start random: LO,HI; the window of --sde_steps k lies in "
                        "transitions LO .. HI-1 (its start uniform in LO .. HI-k), Flow-GRPO's sde_window_range")


@dataclass(frozen=True)
class MixSettings(Settings):
    """Resolved mixed-sampling settings. mode: full (DanceGRPO) | window (MixGRPO) | fast.

    The window is placed among the transitions that may train, so from_args also reads the
    schedule's --sampling_steps and --train_last_step (GRPOSettings.candidate_steps)."""

    mode: str = "full"
    window_size: int = 0
    start_strategy: str = "progressive"  # progressive | decay | exp_decay | random | fixed
    fixed_start: int = 0
    window_range: tuple[int, int] | None = None  # fast mode, random start: (LO, HI) of the window
    iters_per_group: int = 25
    move_step: int = 4
    max_iters_per_group: int = 10
    min_iters_per_group: int = 1
    roll_back: bool = False
    frozen_init_timesteps: int = -1
    dpm_post_ratio: float | None = None
    dpm_all: bool = False
    dpm_algorithm: str = "dpmsolver++"
    dpm_order: int = 2
    dpm_solver_type: str = "heun"
    sde_kind: str = "dance"

    def trained_steps(self, dancegrpo_trained: int, candidates: int) -> int:
        """Trained transitions per sample: the window's size (clipped to the candidates) or DanceGRPO's T."""
        if self.mode != "full":
            return min(self.window_size, candidates)
        return self.frozen_init_timesteps if self.frozen_init_timesteps > 0 else dancegrpo_trained

    def identity(self) -> dict:
        """The settings that decide each iteration's plan (for the resume check)."""
        return {
            "mix_mode": self.mode, "sde_window": self.window_size, "window_strategy": self.start_strategy,
            "window_fixed_start": self.fixed_start, "iters_per_group": self.iters_per_group,
            "sde_window_range": list(self.window_range) if self.window_range else None,
            "window_move_step": self.move_step, "max_iters_per_group": self.max_iters_per_group,
            "min_iters_per_group": self.min_iters_per_group, "roll_back": self.roll_back,
            "frozen_init_timesteps": self.frozen_init_timesteps, "dpm_post_compress_ratio": self.dpm_post_ratio,
            "dpm_solver_order": self.dpm_order, "dpm_solver_type": self.dpm_solver_type,
            "sde_kind": self.sde_kind, "dpm_all": self.dpm_all, "dpm_algorithm": self.dpm_algorithm,
        }

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        _add_flags(parser)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "MixSettings":
        from fastvideo.grpo.loss import candidate_steps

        return settings_from_args(args, candidate_steps(args.sampling_steps, args.train_last_step))

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return resolved_flags(section)

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        notes = unused_flag_notes(args, defaults)
        if args.training_strategy == "part" or args.sde_steps:
            notes.append("--timestep_fraction does not apply to an SDE window: every window step is trained "
                         "(as MixGRPO)")
        return notes


def _dpm_mode(args) -> tuple[bool, bool]:
    """(a DPM-Solver is on, it is applied to all steps) from --dpm_algorithm_type / --dpm_apply_strategy."""
    on = args.dpm_algorithm_type != "null"
    return on, on and args.dpm_apply_strategy == "all"


def _check(args) -> None:
    dpm, dpm_all = _dpm_mode(args)
    if dpm_all and args.dpm_algorithm_type == "dpmsolver":
        raise ConfigError("--dpm_algorithm_type dpmsolver with --dpm_apply_strategy all: the noise-prediction solver "
                          "is singular at FLUX's first sigma, 1 (alpha = 0; its SDE variance is infinite there). Use "
                          "dpmsolver++ with all, or dpmsolver with post")
    if dpm_all and args.flow_grpo_sampling:
        raise ConfigError("--flow_grpo_sampling and --dpm_apply_strategy all both choose the SDE step (Flow-GRPO's, "
                          "or SDE-DPM-Solver's); give one (MixGRPO ignores --flow_grpo_sampling under all)")
    if dpm_all and getattr(args, "train_last_step", False):
        raise ConfigError("--train_last_step with --dpm_apply_strategy all: the SDE-DPM-Solver step to sigma 0 has "
                          "no noise, so the last transition cannot be trained; drop --train_last_step")
    if dpm and not dpm_all and not 0.0 < args.dpm_post_compress_ratio <= 1.0:
        raise ConfigError(f"--dpm_post_compress_ratio {args.dpm_post_compress_ratio} must be in (0, 1]")
    if args.sde_steps < 0:
        raise ConfigError(f"--sde_steps {args.sde_steps} must be >= 0 (0: off)")
    if args.sde_steps and args.training_strategy == "part":
        raise ConfigError("--sde_steps (Flow-GRPO-Fast) and --training_strategy part (MixGRPO) both place the SDE "
                          "window; give one")
    if dpm and not dpm_all and args.training_strategy == "all" and not args.sde_steps:
        raise ConfigError(f"--dpm_algorithm_type {args.dpm_algorithm_type} --dpm_apply_strategy post compresses the "
                          "ODE steps after an SDE window: it needs --training_strategy part or --sde_steps k (or "
                          "--dpm_apply_strategy all)")
    if args.training_strategy == "part":
        for name in ("group_size", "iters_per_group", "max_iters_per_group", "min_iters_per_group"):
            if getattr(args, name) < 1:
                raise ConfigError(f"--{name} must be at least 1")
        if args.prog_overlap_step < 0:  # 0 freezes the window at its start (MixGRPO-Flash*)
            raise ConfigError(f"--prog_overlap_step {args.prog_overlap_step} must be >= 0 (0: the window never moves)")
    if args.sde_start != "random":
        try:
            start = int(args.sde_start)
        except ValueError:
            start = -1
        if start < 0:
            raise ConfigError(f"--sde_start {args.sde_start!r}: give 'random' or a step index >= 0")


def settings_from_args(args: argparse.Namespace, candidates: int) -> MixSettings:
    """Validate the flags (ConfigError) and resolve them. candidates: transitions that may
    train (0 .. candidates-1)."""
    _check(args)
    dpm_on, dpm_all = _dpm_mode(args)
    sde_kind = "flow" if args.flow_grpo_sampling else "dance"
    if dpm_all:
        sde_kind = "sde-" + args.dpm_algorithm_type
    dpm = dict(dpm_post_ratio=args.dpm_post_compress_ratio if dpm_on and not dpm_all else None, dpm_all=dpm_all,
               dpm_algorithm=args.dpm_algorithm_type if dpm_on else "dpmsolver++",
               dpm_order=args.dpm_solver_order, dpm_solver_type=args.dpm_solver_type, sde_kind=sde_kind)
    if args.sde_steps:
        if args.sde_steps > candidates:
            raise ConfigError(f"--sde_steps {args.sde_steps} exceeds the {candidates} trainable transitions")
        fixed = args.sde_start != "random"
        if fixed and int(args.sde_start) + args.sde_steps > candidates:
            raise ConfigError(f"--sde_start {args.sde_start} with --sde_steps {args.sde_steps} runs past the last "
                              f"trainable transition {candidates - 1}")
        window_range = None if fixed else parse_window_range(args.sde_window_range, args.sde_steps, candidates)
        return MixSettings(mode="fast", window_size=args.sde_steps, start_strategy="fixed" if fixed else "random",
                           fixed_start=int(args.sde_start) if fixed else 0, window_range=window_range, **dpm)
    if args.training_strategy == "part":
        return MixSettings(
            mode="window", window_size=args.group_size, start_strategy=args.sample_strategy,
            iters_per_group=args.iters_per_group,
            move_step=args.prog_overlap_step if args.prog_overlap else args.group_size,
            max_iters_per_group=args.max_iters_per_group, min_iters_per_group=args.min_iters_per_group,
            roll_back=args.roll_back, **dpm,
        )
    if args.frozen_init_timesteps > candidates:
        raise ConfigError(f"--frozen_init_timesteps {args.frozen_init_timesteps} exceeds the {candidates} trainable "
                          "transitions")
    return MixSettings(frozen_init_timesteps=args.frozen_init_timesteps, **dpm)


def parse_window_range(text: str, window: int, candidates: int) -> tuple[int, int]:
    """``--sde_window_range LO,HI`` -> (LO, min(HI, candidates)), checked to hold a window of
    ``window`` steps (HI is clipped to the ``candidates`` trainable transitions: a window past them
    would train a step that is never trained)."""
    try:
        lo, hi = (int(v) for v in str(text).split(","))
    except ValueError:
        raise ConfigError(f"--sde_window_range {text!r}: give two integers LO,HI (Flow-GRPO's default 0,5)") from None
    hi = min(hi, candidates)
    if lo < 0 or hi - lo < window:
        raise ConfigError(f"--sde_window_range {text}: needs 0 <= LO and LO + --sde_steps ({window}) <= HI (HI at "
                          f"most {candidates}, the trainable transitions); widen the range or lower --sde_steps")
    return lo, hi


def _dpm_flags(s: dict) -> dict:
    flags = {"dpm_solver_order": s["dpm_order"], "dpm_solver_type": s["dpm_solver_type"],
             "flow_grpo_sampling": s["sde_kind"] == "flow"}
    if s["dpm_all"]:
        return {**flags, "dpm_algorithm_type": s["dpm_algorithm"], "dpm_apply_strategy": "all"}
    if s["dpm_post_ratio"] is not None:
        return {**flags, "dpm_algorithm_type": s["dpm_algorithm"], "dpm_apply_strategy": "post",
                "dpm_post_compress_ratio": s["dpm_post_ratio"]}
    return {**flags, "dpm_algorithm_type": "null"}


def resolved_flags(s: dict) -> dict:
    """The flags settings_from_args resolves into ``s`` (MixSettings as a dict)."""
    flags = _dpm_flags(s)
    if s["mode"] == "fast":
        start = "random" if s["start_strategy"] == "random" else str(s["fixed_start"])
        span = s.get("window_range")  # None: a fixed start, or a config.json from before the flag
        extra = {"sde_window_range": ",".join(str(v) for v in span)} if span else {}
        return {**flags, "sde_steps": s["window_size"], "sde_start": start, **extra}
    if s["mode"] == "window":
        moved = s["move_step"] != s["window_size"]
        return {**flags, "training_strategy": "part", "group_size": s["window_size"],
                "sample_strategy": s["start_strategy"], "iters_per_group": s["iters_per_group"],
                "prog_overlap": moved, "prog_overlap_step": s["move_step"] if moved else 1,
                "max_iters_per_group": s["max_iters_per_group"], "min_iters_per_group": s["min_iters_per_group"],
                "roll_back": s["roll_back"]}
    return {**flags, "frozen_init_timesteps": s["frozen_init_timesteps"]}


WINDOW_FLAGS = ("group_size", "iters_per_group", "sample_strategy", "prog_overlap", "prog_overlap_step",
                "max_iters_per_group", "min_iters_per_group", "roll_back")
DPM_FLAGS = ("dpm_apply_strategy", "dpm_post_compress_ratio", "dpm_solver_order", "dpm_solver_type")


def unused_flag_notes(args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
    """Start-up notes for mixed-sampling flags given a value but without effect in this mode."""
    notes = []
    if args.training_strategy != "part":
        changed = [f"--{n}" for n in WINDOW_FLAGS if getattr(args, n) != getattr(defaults, n)]
        if changed:
            notes.append(f"{', '.join(changed)} have no effect without --training_strategy part")
    if args.dpm_algorithm_type == "null":
        changed = [f"--{n}" for n in DPM_FLAGS if getattr(args, n) != getattr(defaults, n)]
        if changed:
            notes.append(f"{', '.join(changed)} have no effect with --dpm_algorithm_type null")
    if _dpm_mode(args)[1]:
        if args.dpm_post_compress_ratio != defaults.dpm_post_compress_ratio:
            notes.append("--dpm_post_compress_ratio has no effect with --dpm_apply_strategy all (full schedule)")
        if args.eta > 0:
            notes.append(f"--eta {args.eta:g} has no effect on the SDE-DPM-Solver steps of --dpm_apply_strategy all "
                         "(the solver fixes their noise, as MixGRPO)")
    if getattr(args, "no_share_ode_prefix", False) and not args.init_same_noise:
        notes.append("--no_share_ode_prefix has no effect without --init_same_noise (no two samples share a state)")
    if not args.sde_steps and args.sde_start != defaults.sde_start:
        notes.append("--sde_start has no effect without --sde_steps")
    if args.sde_window_range != defaults.sde_window_range and (not args.sde_steps or args.sde_start != "random"):
        notes.append("--sde_window_range has no effect without --sde_steps k --sde_start random")
    if args.frozen_init_timesteps != defaults.frozen_init_timesteps and (args.training_strategy == "part"
                                                                         or args.sde_steps):
        notes.append("--frozen_init_timesteps applies to --training_strategy all only")
    return notes


def _iters_at(mix: MixSettings, start: int, last_start: int) -> int:
    """Iterations the window stays at ``start`` (upstream's per-strategy rule)."""
    if mix.start_strategy == "decay":
        progress = start / max(last_start, 1)
        current = int(mix.max_iters_per_group * (1 - progress) + mix.min_iters_per_group * progress)
        return max(mix.min_iters_per_group, current)
    if mix.start_strategy == "exp_decay":
        return int(math.ceil(mix.iters_per_group * math.exp(-EXP_DECAY_K * max(0, start - EXP_DECAY_THRESHOLD))))
    return mix.iters_per_group


def scheduled_start(mix: MixSettings, iteration: int, last_start: int) -> int:
    """Window start of 1-based ``iteration`` for the progressive/decay strategies: upstream's state
    machine (advance after each iteration, move every N iterations, roll back or stop past
    ``last_start``) replayed from iteration 1, so the result depends on the iteration alone."""
    start, in_group = 0, 0
    for _ in range(iteration - 1):
        in_group += 1
        if in_group >= _iters_at(mix, start, last_start):
            in_group = 0
            start += mix.move_step
        if start > last_start:
            start, in_group = (0, 0) if mix.roll_back else (last_start, in_group)
    return start


def window_start(mix: MixSettings, iteration: int, candidates: int, randomness=None) -> int:
    """Where iteration's SDE window starts; random starts are drawn from ``randomness``."""
    if mix.start_strategy == "fixed":
        return mix.fixed_start
    if mix.start_strategy == "random":
        if randomness is None:
            raise ValueError("a random window start needs the run's RandomSource")
        if mix.window_range is not None:  # Flow-GRPO-Fast: start in LO .. HI-W
            lo, hi = mix.window_range
            return lo + randomness.window_start(iteration, max(hi - mix.window_size - lo + 1, 1))
        if iteration <= 1:  # MixGRPO: the window starts at 0 and is first drawn after iteration 1
            return 0
        # MixGRPO: 0 .. max_timesteps - W, max_timesteps = the last candidate (N - 2)
        return randomness.window_start(iteration, max(candidates - mix.window_size, 1))
    return scheduled_start(mix, iteration, candidates - 1)


def plan_for_iteration(mix: MixSettings, sampling_steps: int, shift: float, candidates: int,
                       num_trained: int, iteration: int, randomness=None) -> "SamplingPlan":
    """The SamplingPlan of 1-based ``iteration``. candidates / num_trained: DanceGRPO's trainable
    transitions and T (GRPOSettings.candidate_steps / trained_steps)."""
    from fastvideo.sampling.plan import full_sde_plan, window_plan

    dpm = dict(dpm_order=mix.dpm_order, dpm_solver_type=mix.dpm_solver_type, dpm_algorithm=mix.dpm_algorithm)
    if mix.mode == "full":
        t = mix.frozen_init_timesteps if mix.frozen_init_timesteps > 0 else num_trained
        return full_sde_plan(sampling_steps, shift, candidates, t, mix.sde_kind, **dpm)
    start = window_start(mix, iteration, candidates, randomness)
    return window_plan(
        sampling_steps, shift, start, mix.window_size, candidates=candidates, sde_kind=mix.sde_kind,
        dpm_post_ratio=mix.dpm_post_ratio, dpm_all=mix.dpm_all, **dpm,
    )
