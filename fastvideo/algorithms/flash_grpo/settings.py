"""Flash-GRPO's settings (--algorithm flash_grpo). Defaults are the authors' Wan2.1 recipe
(Shredded-Pork/Flash-GRPO at 4211013): the SDE step drawn from the first 10 of the 20 sampling
steps (scripts/train_wanx2_1_flash.py L697 ``weights``; config/dgx.py wan2_1_flash: num_steps 20,
clip_range 1e-3, beta 0, global_std True, learning_rate 1e-4), so --flash_candidate_fraction 0.5;
its SDE has no eta (--eta 1 reproduces it). Flash-GRPO also reads GRPO's flags: --use_group /
--adv_std / --global_std / --adv_clip_max (advantages), --clip_range, --kl_coef, --kl_coeff,
--drop_zero_advantage (upstream drops zero-advantage samples).

Its section is built as a registered objective's own (components.plugin_sections)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import ObjectiveSettings, flag_group

CANDIDATES_HELP = ("each iteration's one SDE step is drawn uniformly from the first int(N x this) of the N sampling "
                   "transitions (the authors' Wan2.1 recipe: 10 of 20); the rest are ODE")


@dataclass
class FlashGRPOSettings(ObjectiveSettings):
    candidate_fraction: float = 0.5

    section = "flash_grpo"
    shares = ("grpo",)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        flag_group(parser, "Flash-GRPO (--algorithm flash_grpo)").add_argument(
            "--flash_candidate_fraction", type=float, default=0.5, help=CANDIDATES_HELP)

    def check(self) -> None:
        if not 0.0 < self.candidate_fraction <= 1.0:
            raise ConfigError(f"--flash_candidate_fraction {self.candidate_fraction} must be in (0, 1]")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "FlashGRPOSettings":
        return cls(candidate_fraction=args.flash_candidate_fraction).checked()

    def candidates(self, sampling_steps: int) -> int:
        """C: the SDE step is one of transitions 0 .. C-1 (upstream: 10 of 20)."""
        return max(1, int(sampling_steps * self.candidate_fraction))

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"flash_candidate_fraction": section["candidate_fraction"]}

    def samples_per_prompt(self, sections: dict) -> int:
        return sections["grpo"].samples_per_prompt(sections)

    def trained_steps_per_sample(self, cfg) -> int:
        return 1

    def needs_reference(self, cfg) -> bool:
        return cfg.grpo.kl_coef > 0

    def check_world(self, cfg, dp_size: int) -> None:
        cfg.grpo.check_world(cfg, dp_size)

    def check_across(self, sections: dict) -> None:
        """Its own plan (one Flash SDE step, ODE elsewhere): the SDE plan's flags are refused, and so
        is GRPO-Guard's policy loss (--eta 0 is refused as for every objective with log-probabilities)."""
        mix, rollout, g = sections["mix"], sections["rollout"], sections["grpo"]
        if mix.mode != "full" or mix.sde_kind != "dance" or mix.dpm_post_ratio is not None or mix.dpm_all:
            raise ConfigError("--algorithm flash_grpo samples one Flash-GRPO SDE step per iteration and the Euler ODE "
                              "elsewhere; drop the SDE window / solver flags (--training_strategy part, --sde_steps, "
                              "--flow_grpo_sampling, --dpm_algorithm_type)")
        if g.policy_loss != "clip":
            raise ConfigError(f"--policy_loss {g.policy_loss} with --algorithm flash_grpo: its rectified loss is the "
                              "clipped ratio's; drop --policy_loss")
        if rollout.sampling_steps < 2:
            raise ConfigError(f"--sampling_steps {rollout.sampling_steps} is too small (Flash-GRPO needs 2)")

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        unused = [f"--{k}" for k in ("timestep_fraction", "train_last_step")
                  if getattr(args, k) != getattr(defaults, k)]
        return [f"{', '.join(unused)}: no effect with --algorithm flash_grpo (it trains the one SDE step of each "
                "iteration, drawn by --flash_candidate_fraction)"] if unused else []
