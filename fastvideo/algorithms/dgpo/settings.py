"""DGPO's settings (--algorithm dgpo). Names and defaults are Flow-Factory's DGPOTrainingArguments
(X-GenGroup/Flow-Factory at a0b2bc5, src/flow_factory/hparams/training_args.py L725-770: dpo_beta
100, clip_dsm True, switch_ema_ref 200, ema_ref_max_decay 0.3, ema_ref_ramp_rate 0.001); its
SD3.5 recipe (examples/dgpo/lora/sd3_5/default.yaml) passes dpo_beta 10, clip_range 5e-2, kl_beta
1e-3. DGPO also reads GRPO's flags: --use_group / --adv_std / --global_std / --adv_clip_max
(advantages), --timestep_fraction (T of the N sampling timesteps, shared by the whole batch),
--clip_range (the DSM clip's), --kl_coef (kl_beta: a velocity MSE to the frozen base).

Its section is built as a registered objective's own (components.plugin_sections)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.algorithms.awm.settings import check_ode_rollout
from fastvideo.errors import ConfigError
from fastvideo.settings import ObjectiveSettings, flag_group


@dataclass
class DGPOSettings(ObjectiveSettings):
    beta: float = 100.0
    clip_dsm: bool = True
    switch_ema_ref: int = 200
    ema_max_decay: float = 0.3
    ema_ramp: float = 0.001

    section = "dgpo"
    shares = ("grpo",)

    def samples_per_prompt(self, sections: dict) -> int:
        return sections["grpo"].samples_per_prompt(sections)

    def trained_steps_per_sample(self, cfg) -> int:
        return max(1, int(cfg.rollout.sampling_steps * cfg.grpo.timestep_fraction))

    def needs_reference(self, cfg) -> bool:
        return True  # d_ref: the frozen base is DGPO's reference

    def check_world(self, cfg, dp_size: int) -> None:
        cfg.grpo.check_world(cfg, dp_size)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "DGPO (--algorithm dgpo)")
        g.add_argument("--dgpo_beta", type=float, default=100.0,
                       help="beta of s_G = beta / |G| sum A_i (d_i - d_ref_i) (Flow-Factory's dpo_beta; its SD3.5 "
                            "recipe: 10)")
        g.add_argument("--dgpo_clip_dsm", type=int, default=1, choices=[0, 1],
                       help="1: detach d_i where the old policy's ratio exp(d_old - d) left --clip_range on the side "
                            "A_i pushes (Flow-Factory's clip_dsm); the old policy is an EMA of the weights")
        g.add_argument("--dgpo_switch_ema_ref", type=int, default=200,
                       help="after this many optimizer steps the rollout samples with the old policy (EMA)")
        g.add_argument("--dgpo_ema_max_decay", type=float, default=0.3,
                       help="old policy <- decay old + (1 - decay) current after each iteration, decay = "
                            "min(this, --dgpo_ema_ramp x optimizer steps so far)")
        g.add_argument("--dgpo_ema_ramp", type=float, default=0.001, help="see --dgpo_ema_max_decay")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "DGPOSettings":
        return cls(beta=args.dgpo_beta, clip_dsm=bool(args.dgpo_clip_dsm), switch_ema_ref=args.dgpo_switch_ema_ref,
                   ema_max_decay=args.dgpo_ema_max_decay, ema_ramp=args.dgpo_ema_ramp).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"dgpo_beta": section["beta"], "dgpo_clip_dsm": int(section["clip_dsm"]),
                "dgpo_switch_ema_ref": section["switch_ema_ref"], "dgpo_ema_max_decay": section["ema_max_decay"],
                "dgpo_ema_ramp": section["ema_ramp"]}

    def check(self) -> None:
        if self.beta <= 0 or not 0.0 <= self.ema_max_decay < 1.0 or self.ema_ramp < 0:
            raise ConfigError(f"--dgpo_beta {self.beta} must be > 0, --dgpo_ema_max_decay {self.ema_max_decay} in "
                              f"[0, 1), --dgpo_ema_ramp {self.ema_ramp} >= 0")

    def check_across(self, sections: dict) -> None:
        """An ODE rollout; whole groups in every micro-batch (s_G sums over the group at one t)."""
        check_ode_rollout(sections, "dgpo")
        g, G, mb = sections["grpo"], sections["rollout"].num_generations, sections["update"].train_micro_batch_size
        if not g.use_group or mb % G:
            raise ConfigError(f"--algorithm dgpo sums each group's preference at one timestep: it needs --use_group and "
                              f"--train_micro_batch_size a multiple of --num_generations {G} (got {mb})")

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        unused = [f"--{k}" for k in ("kl_coeff", "train_last_step", "eta", "policy_loss")
                  if getattr(args, k) != getattr(defaults, k)]
        return [f"{', '.join(unused)}: no effect with --algorithm dgpo (an ODE rollout without log-probabilities; "
                "it trains int(N x --timestep_fraction) of all N timesteps)"] if unused else []
