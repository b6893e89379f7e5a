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

from fastvideo.algorithms.awm.settings import ODEObjectiveSettings
from fastvideo.errors import ConfigError
from fastvideo.settings import flag_group

# (flag, type, default, help)
FLAGS = (
    ("dgpo_beta", float, 100.0, "beta of s_G = beta / |G| sum A_i (d_i - d_ref_i) (Flow-Factory's dpo_beta; its "
                                "SD3.5 recipe: 10)"),
    ("dgpo_clip_dsm", int, 1, "1: detach d_i where the old policy's ratio exp(d_old - d) left --clip_range on the "
                              "side A_i pushes (Flow-Factory's clip_dsm); the old policy is an EMA of the weights"),
    ("dgpo_switch_ema_ref", int, 200, "after this many optimizer steps the rollout samples with the old policy (EMA)"),
    ("dgpo_ema_max_decay", float, 0.3, "old policy <- decay old + (1 - decay) current after each iteration, decay = "
                                       "min(this, --dgpo_ema_ramp x optimizer steps so far)"),
    ("dgpo_ema_ramp", float, 0.001, "see --dgpo_ema_max_decay"),
)


@dataclass
class DGPOSettings(ODEObjectiveSettings):
    beta: float = 100.0
    clip_dsm: bool = True
    switch_ema_ref: int = 200
    ema_max_decay: float = 0.3
    ema_ramp: float = 0.001

    section = "dgpo"

    def needs_reference(self, cfg) -> bool:
        return True  # d_ref: the frozen base is DGPO's reference

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "DGPO (--algorithm dgpo)")
        for flag, kind, default, text in FLAGS:
            g.add_argument(f"--{flag}", type=kind, default=default, help=text,
                           **({"choices": [0, 1]} if flag == "dgpo_clip_dsm" else {}))

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
        super().check_across(sections)
        g, r, mb = sections["grpo"], sections["rollout"], sections["update"].train_micro_batch_size
        G, what = r.trained_per_prompt, "--bestofn" if r.bestofn else "--num_generations"
        if not g.use_group or mb % G:
            raise ConfigError(f"--algorithm dgpo sums each group's preference at one timestep: it needs --use_group and "
                              f"--train_micro_batch_size a multiple of {what} {G} (got {mb})")
