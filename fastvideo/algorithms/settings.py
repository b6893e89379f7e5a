"""The GRPO objective's settings: grouping, advantages, which transitions train, clipping, KL
(how the update is cut into micro-batches is the update's: component_settings/update.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import ObjectiveSettings, flag_group

POLICY_LOSSES = ("clip", "grpo_guard")  # --policy_loss (fastvideo.algorithms.grpo.POLICY_LOSSES)


@dataclass
class GRPOSettings(ObjectiveSettings):
    use_group: bool
    adv_std: str  # sample | population
    train_last_step: bool
    timestep_fraction: float
    clip_range: float
    adv_clip_max: float
    loss_coef: float
    kl_coef: float = 0.0
    # MixGRPO's flags: its KL term 0.5 (logp - logp_rollout)^2 (--kl_coeff), the mean / std of each
    # group without its lowest rewards (--trimmed_ratio), the sample order of the update
    # (--advantage_rerange_strategy null | random | balance; window mode only, as MixGRPO).
    rollout_kl_coef: float = 0.0
    trimmed_ratio: float = 0.0
    advantage_rerange: str = "null"
    # Flow-GRPO's and DiffusionNFT's config.sample.global_std: each group's mean, the std of all
    # the iteration's rewards (every rank's), + 1e-4.
    global_std: bool = False
    # Flow-GRPO's train_sd3.py: samples whose advantage is 0 (a group of equal rewards) are dropped
    # before training, so their KL term trains nothing either.
    drop_zero_advantage: bool = False
    # The policy loss of a trained step: clip (DanceGRPO's clipped ratio) or grpo_guard (GRPO-Guard's
    # re-centred, normalised ratio, algorithms/grpo_guard/)
    policy_loss: str = "clip"

    section = "grpo"
    moved_keys = ("train_micro_batch_size", "gradient_accumulation_steps")  # the update's since 2026-12

    def candidate_steps(self, sampling_steps: int) -> int:
        """Transitions a sample may train on: 0 .. N-2 upstream (the last one never), N with --train_last_step."""
        from fastvideo.grpo.loss import candidate_steps  # imports torch: not at parser-building time

        return candidate_steps(sampling_steps, self.train_last_step)

    def trained_steps(self, sampling_steps: int) -> int:
        """T: how many of the candidate transitions each sample trains on."""
        from fastvideo.grpo.loss import num_trained_steps

        return num_trained_steps(sampling_steps, self.timestep_fraction, self.train_last_step)

    def trained_steps_per_sample(self, cfg) -> int:
        n = cfg.rollout.sampling_steps
        return cfg.mix.trained_steps(self.trained_steps(n), self.candidate_steps(n))

    def samples_per_prompt(self, sections: dict) -> int:
        """Upstream DanceGRPO draws one sample per prompt without --use_group (num_generations is
        read only under it) and normalises advantages over the gathered batch."""
        return sections["rollout"].num_generations if self.use_group else 1

    def needs_reference(self, cfg) -> bool:
        return self.kl_coef > 0

    def check_world(self, cfg, dp_size: int) -> None:
        samples = dp_size * cfg.prompts_per_rank
        if not self.use_group and samples < 2:
            raise ConfigError(
                f"without --use_group each prompt gets one sample and advantages are normalised over the "
                f"{samples} sample(s) of all ranks; that needs at least 2: raise --train_batch_size or add "
                "--use_group --num_generations G"
            )

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "GRPO")
        g.add_argument("--use_group", action="store_true",
                       help="expand each prompt into --num_generations samples and normalise advantages within "
                            "each group; without it (upstream) every prompt gets one sample and advantages are "
                            "normalised over the gathered batch")
        g.add_argument("--adv_std", type=str, default="sample", choices=["sample", "population"],
                       help="std used to normalise advantages: sample (torch.std, upstream DanceGRPO) or "
                            "population (Flow-GRPO)")
        g.add_argument("--global_std", action="store_true",
                       help="with --use_group: divide each group's centred rewards by the std of ALL the "
                            "iteration's rewards (gathered over ranks) + 1e-4, as Flow-GRPO's and DiffusionNFT's "
                            "config.sample.global_std (their SD3.5 default); --adv_std picks the estimator")
        g.add_argument("--train_last_step", action="store_true",
                       help="also train the last sampling transition (upstream never trains it)")
        g.add_argument("--timestep_fraction", type=float, default=0.6,
                       help="fraction of the candidate transitions each sample trains on")
        g.add_argument("--clip_range", type=float, default=1e-4, help="PPO clipping range of the importance ratio")
        g.add_argument("--adv_clip_max", type=float, default=5.0, help="advantages are clipped to +-this")
        g.add_argument("--loss_coef", type=float, default=1.0, help="multiplies the loss")
        g.add_argument("--kl_coef", type=float, default=0.0,
                       help="beta of a KL penalty to the frozen base policy (closed-form KL of each trained SDE "
                            "step; LoRA: the adapters switched off; full fine-tuning: a frozen copy of the initial "
                            "weights, sharded like the model). 0: off. MixGRPO's --kl_coeff is a different term")
        g.add_argument("--drop_zero_advantage", action="store_true",
                       help="leave samples whose advantage is exactly 0 out of the update, their KL terms too "
                            "(Flow-GRPO's train_sd3.py; matters for binary rewards, where whole groups tie)")
        g.add_argument("--policy_loss", type=str, default="clip", choices=list(POLICY_LOSSES),
                       help="clip: the clipped importance ratio (DanceGRPO, Flow-GRPO); grpo_guard: GRPO-Guard's "
                            "ratio, re-centred by the step means' drift and normalised by the step's std, the loss "
                            "scaled by 1/(sigma - sigma_next) (verl-omni loss_mode=grpo_guard; needs --eta > 0)")
        g.add_argument("--kl_coeff", type=float, default=0.0,
                       help="MixGRPO's KL term: adds kl_coeff * 0.5 (logp - logp_rollout)^2 per trained step (to "
                            "the rollout policy, no reference model; MixGRPO's parser default is 0.01, its scripts "
                            "pass 0.0)")
        g.add_argument("--trimmed_ratio", type=float, default=0.0,
                       help="MixGRPO: each group's advantage mean and std leave out its lowest "
                            "int(G x ratio) rewards (needs --use_group)")
        g.add_argument("--advantage_rerange_strategy", type=str, default="null", choices=["null", "random", "balance"],
                       help="MixGRPO (--training_strategy part only): the order the update visits the rank's "
                            "samples; random: shuffled; balance: positive and negative advantages alternate "
                            "(zero advantages dropped, as MixGRPO)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "GRPOSettings":
        return cls(
            use_group=args.use_group, adv_std=args.adv_std, train_last_step=args.train_last_step,
            timestep_fraction=args.timestep_fraction, clip_range=args.clip_range,
            adv_clip_max=args.adv_clip_max, loss_coef=args.loss_coef, kl_coef=args.kl_coef,
            rollout_kl_coef=args.kl_coeff, trimmed_ratio=args.trimmed_ratio,
            advantage_rerange=_rerange(args), global_std=args.global_std,
            drop_zero_advantage=args.drop_zero_advantage, policy_loss=args.policy_loss,
        ).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        flags = {k: v for k, v in section.items() if k not in cls.moved_keys}  # the update's (UpdateSettings)
        # every other field is the flag of the same name
        flags["kl_coeff"] = flags.pop("rollout_kl_coef", 0.0)
        flags["advantage_rerange_strategy"] = flags.pop("advantage_rerange", "null")
        flags.setdefault("trimmed_ratio", 0.0)
        flags.setdefault("global_std", False)  # configs written before the flag
        flags.setdefault("drop_zero_advantage", False)
        flags.setdefault("policy_loss", "clip")
        return flags

    def check(self) -> None:
        if not 0.0 < self.timestep_fraction <= 1.0:
            raise ConfigError(f"--timestep_fraction {self.timestep_fraction} must be in (0, 1]")
        if self.kl_coef < 0:
            raise ConfigError(f"--kl_coef {self.kl_coef} must be >= 0 (0 turns the KL penalty off)")
        if self.rollout_kl_coef < 0:
            raise ConfigError(f"--kl_coeff {self.rollout_kl_coef} must be >= 0 (0 turns MixGRPO's KL term off)")
        if not 0.0 <= self.trimmed_ratio < 1.0:
            raise ConfigError(f"--trimmed_ratio {self.trimmed_ratio} must be in [0, 1)")
        if self.trimmed_ratio > 0 and not self.use_group:
            raise ConfigError("--trimmed_ratio trims within groups (MixGRPO): it needs --use_group")
        if self.global_std and not self.use_group:
            raise ConfigError("--global_std scales per-group advantages: it needs --use_group (without it the "
                              "advantages are already normalised over the whole gathered batch)")
        if self.global_std and self.trimmed_ratio > 0:
            raise ConfigError("--global_std and --trimmed_ratio are two different statistics (Flow-GRPO's and "
                              "MixGRPO's): pick one")
        if self.clip_range <= 0 or self.adv_clip_max <= 0:
            raise ConfigError("--clip_range and --adv_clip_max must be positive")

    def check_across(self, sections: dict) -> None:
        """GRPO's flags against the rollout's (its num_generations: the samples per prompt), the
        rewards' and the sampling plan's; checked when GRPO or an objective sharing its section
        (NFT: the grouping, the advantages, --kl_coef) is selected."""
        rollout = sections["rollout"]
        if self.use_group and rollout.num_generations < 2:
            raise ConfigError(f"--num_generations {rollout.num_generations}: a group needs at least 2 samples")
        if sections["reward"].group_norm and rollout.num_generations < 2:  # the samples per prompt
            raise ConfigError("--reward_group_norm normalises each reward within a prompt's group: it needs "
                              "--use_group")
        if rollout.sampling_steps < 1 if self.train_last_step else rollout.sampling_steps < 2:
            raise ConfigError(f"--sampling_steps {rollout.sampling_steps} is too small")
        if self.policy_loss == "grpo_guard" and sections["mix"].dpm_all:
            raise ConfigError("--policy_loss grpo_guard re-centres the ratio by the step means of DanceGRPO's or "
                              "Flow-GRPO's SDE; the SDE-DPM-Solver steps of --dpm_apply_strategy all have none here: "
                              "drop one of them")
        if self.kl_coef > 0 and sections["mix"].dpm_all:
            raise ConfigError("--kl_coef is the KL between DanceGRPO's or Flow-GRPO's SDE steps; it is not implemented "
                              "for the SDE-DPM-Solver steps of --dpm_apply_strategy all")

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        if not args.use_group and args.num_generations != 1:
            return [f"--num_generations {args.num_generations} has no effect without --use_group: as upstream, each "
                    "prompt gets one sample and advantages are normalised over the gathered batch"]
        return []


def _rerange(args: argparse.Namespace) -> str:
    """MixGRPO reorders the samples only under --training_strategy part; elsewhere the flag would do nothing."""
    strategy = args.advantage_rerange_strategy
    if strategy != "null" and getattr(args, "training_strategy", "all") != "part":
        raise ConfigError(f"--advantage_rerange_strategy {strategy} applies to MixGRPO's window "
                          "(--training_strategy part) only, as upstream; drop it or add --training_strategy part")
    return strategy
