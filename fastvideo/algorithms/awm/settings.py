"""AWM's settings (--algorithm awm): the matching loss's weighting. Defaults are Flow-Factory's FLUX.1
recipe (X-GenGroup/Flow-Factory at a0b2bc5, examples/awm/lora/flux1/default.yaml: awm_weighting
ghuber, ghuber_power 0.25, scheduler dynamics_type ODE). AWM also reads GRPO's shared flags:
--use_group / --adv_std / --global_std and --adv_clip_max (advantages), --timestep_fraction (the
share of the N sampling timesteps each sample trains), --clip_range (the ratio's), --kl_coef
(Flow-Factory's kl_beta: a velocity MSE to the frozen base).

Its section is built as a registered objective's own (components.plugin_sections), so its flags
exist when --algorithm awm is selected."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import ObjectiveSettings, flag_group

WEIGHTINGS = ("uniform", "t", "t2", "huber", "ghuber")  # awm.loss.WEIGHTINGS (this module imports no torch)


class ODEObjectiveSettings(ObjectiveSettings):
    """What AWM and DGPO share: GRPO's grouping and advantages, int(N x --timestep_fraction) trained
    timesteps of an ODE rollout, GRPO's flags that do nothing there (a start-up note)."""

    shares = ("grpo",)
    section = ""

    def samples_per_prompt(self, sections: dict) -> int:
        return sections["grpo"].samples_per_prompt(sections)

    def trained_steps_per_sample(self, cfg) -> int:
        return max(1, int(cfg.rollout.sampling_steps * cfg.grpo.timestep_fraction))

    def check_world(self, cfg, dp_size: int) -> None:
        cfg.grpo.check_world(cfg, dp_size)

    def check_across(self, sections: dict) -> None:
        check_ode_rollout(sections, self.section)

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        unused = [f"--{k}" for k in ("kl_coeff", "train_last_step", "eta", "policy_loss")
                  if getattr(args, k) != getattr(defaults, k)]
        return [f"{', '.join(unused)}: no effect with --algorithm {cls.section} (an ODE rollout without "
                "log-probabilities; it trains int(N x --timestep_fraction) of all N timesteps)"] if unused else []


@dataclass
class AWMSettings(ODEObjectiveSettings):
    weighting: str = "ghuber"
    ghuber_power: float = 0.25

    section = "awm"

    def needs_reference(self, cfg) -> bool:
        return cfg.grpo.kl_coef > 0

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "AWM (--algorithm awm)")
        g.add_argument("--awm_weighting", type=str, default="ghuber", choices=list(WEIGHTINGS),
                       help="the matching error l's weighting w(l, t): uniform l, t l, t2 t^2 l, huber "
                            "sqrt(l) t, ghuber l^p t / p (Flow-Factory's FLUX.1 recipe: ghuber)")
        g.add_argument("--awm_ghuber_power", type=float, default=0.25, help="p of --awm_weighting ghuber")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "AWMSettings":
        return cls(weighting=args.awm_weighting, ghuber_power=args.awm_ghuber_power).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"awm_weighting": section["weighting"], "awm_ghuber_power": section["ghuber_power"]}

    def check(self) -> None:
        if self.ghuber_power <= 0:
            raise ConfigError(f"--awm_ghuber_power {self.ghuber_power} must be > 0 (the loss divides by it)")



def check_ode_rollout(sections: dict, name: str) -> None:
    """An objective that samples every step with the Euler ODE (AWM, DGPO): the SDE plan's flags and
    --init_same_noise are refused."""
    mix = sections["mix"]
    if mix.mode != "full" or mix.sde_kind != "dance" or mix.dpm_post_ratio is not None or mix.dpm_all:
        raise ConfigError(f"--algorithm {name} samples every step with the Euler ODE (Flow-Factory's dynamics_type "
                          "ODE); drop the SDE window / solver flags (--training_strategy part, --sde_steps, "
                          "--flow_grpo_sampling, --dpm_algorithm_type)")
    if sections["rollout"].init_same_noise:
        raise ConfigError(f"--init_same_noise with --algorithm {name}: the ODE from the same noise gives a group G "
                          "identical samples (no advantage); drop --init_same_noise")
