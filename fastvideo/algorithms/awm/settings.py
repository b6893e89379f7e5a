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
from dataclasses import dataclass, replace

from fastvideo.errors import ConfigError
from fastvideo.settings import ObjectiveNeeds, ObjectiveSettings, flag_group

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


# The EMA-KL of Flow-Factory's AWM (a0b2bc5, trainers/awm.py L524-537: ema_kl_beta * mean((v - v_ema)^2), the
# EMA of the trainable weights updated after each epoch by ema/ema.py EMAModuleWrapper.step with its
# ema_utils.linear_warmup_decay): (flag, type, default, help); the defaults are its FLUX.1 recipe's
# (examples/awm/lora/flux1/default.yaml: ema_kl_beta 0.1 is recommended there, 0 here: off unless asked).
EMA_FLAGS = (
    ("awm_ema_kl_beta", float, 0.0, "beta of the KL to an EMA of the weights, beta * mean((v - v_ema)^2) "
                                    "(Flow-Factory's ema_kl_beta; its FLUX.1 recipe: 0.1); 0: off"),
    ("awm_ema_decay", float, 0.3, "the EMA's decay after --awm_ema_warmup iterations (recipe's ema_decay)"),
    ("awm_ema_warmup", int, 300, "iterations over which the decay ramps linearly from 0 (recipe's warmup_steps, "
                                 "ema_decay_schedule linear)"),
    ("awm_ema_interval", int, 1, "update the EMA every this many iterations (recipe's ema_update_interval)"),
)


@dataclass
class AWMSettings(ODEObjectiveSettings):
    weighting: str = "ghuber"
    ghuber_power: float = 0.25
    ema_kl_beta: float = 0.0
    ema_decay: float = 0.3
    ema_warmup: int = 300
    ema_interval: int = 1

    section = "awm"

    def ema_decay_at(self, iteration: int) -> float:
        """The EMA's decay in the update after iteration ``iteration`` (1-based; Flow-Factory's epoch
        iteration - 1): linear_warmup_decay(decay, 0, warmup)(epoch) = decay x min(epoch / warmup, 1)."""
        return self.ema_decay * min((iteration - 1) / self.ema_warmup, 1.0)

    def ema_updates_after(self, iteration: int) -> bool:
        """EMAModuleWrapper.step's (epoch + 1) % update_step_interval == 0."""
        return iteration % self.ema_interval == 0

    def needs_reference(self, cfg) -> bool:
        return cfg.grpo.kl_coef > 0

    def needs(self, cfg, objective) -> ObjectiveNeeds:
        """With --awm_ema_kl_beta > 0 the EMA of the trainable weights (a float32 WeightCopy) and its no-grad
        forward per trained step: the memory model and the cost model count them."""
        return replace(super().needs(cfg, objective), update_copy=self.ema_kl_beta > 0)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "AWM (--algorithm awm)")
        g.add_argument("--awm_weighting", type=str, default="ghuber", choices=list(WEIGHTINGS),
                       help="the matching error l's weighting w(l, t): uniform l, t l, t2 t^2 l, huber "
                            "sqrt(l) t, ghuber l^p t / p (Flow-Factory's FLUX.1 recipe: ghuber)")
        g.add_argument("--awm_ghuber_power", type=float, default=0.25, help="p of --awm_weighting ghuber")
        for flag, kind, default, text in EMA_FLAGS:
            g.add_argument(f"--{flag}", type=kind, default=default, help=text)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "AWMSettings":
        return cls(weighting=args.awm_weighting, ghuber_power=args.awm_ghuber_power,
                   **{flag[len("awm_"):]: getattr(args, flag) for flag, *_ in EMA_FLAGS}).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"awm_weighting": section["weighting"], "awm_ghuber_power": section["ghuber_power"],
                **{flag: section[flag[len("awm_"):]] for flag, *_ in EMA_FLAGS if flag[len("awm_"):] in section}}

    def check(self) -> None:
        if self.ghuber_power <= 0:
            raise ConfigError(f"--awm_ghuber_power {self.ghuber_power} must be > 0 (the loss divides by it)")
        if self.ema_kl_beta < 0 or not 0 <= self.ema_decay < 1 or self.ema_warmup < 1 or self.ema_interval < 1:
            raise ConfigError(f"--awm_ema_kl_beta {self.ema_kl_beta} must be >= 0, --awm_ema_decay {self.ema_decay} "
                              f"in [0, 1), --awm_ema_warmup {self.ema_warmup} and --awm_ema_interval "
                              f"{self.ema_interval} >= 1")

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        notes = super().notes(args, defaults)
        if args.awm_ema_kl_beta > 0:
            return notes + [f"AWM's EMA-KL: + {args.awm_ema_kl_beta:g} x mean((v - v_ema)^2) against an EMA of the "
                            "trainable weights (a float32 copy, checkpointed as awm_ema.safetensors; one more no-grad "
                            f"forward per trained step), decay {args.awm_ema_decay:g} x min((iteration - 1) / "
                            f"{args.awm_ema_warmup}, 1) every {args.awm_ema_interval} iteration(s)"]
        given = [f"--{f}" for f, *_ in EMA_FLAGS[1:] if getattr(args, f) != getattr(defaults, f)]
        return notes + ([f"{', '.join(given)}: no effect without --awm_ema_kl_beta > 0"] if given else [])



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
