"""DiffusionNFT's settings (--algorithm nft): the guidance strength beta, the old policy's decay
schedule, how advantages become optimality, and the rollout's solver.

Names and defaults are the reference's (NVlabs/DiffusionNFT config/nft.py): ``config.beta`` ->
--nft_beta 1.0, ``config.decay_type`` -> --nft_decay_type 1, ``config.train.adv_mode`` ->
--adv_mode all, ``config.sample.solver`` dpm2 (deterministic) -> --nft_solver dpm. The objective
also reads GRPO's shared flags: --adv_clip_max (5, as the reference), --timestep_fraction (which
share of the N sampling timesteps each sample trains), --use_group / --adv_std (advantages), and
--kl_coef (the reference's ``config.train.beta``: a velocity MSE to the frozen base); and the
update's --train_micro_batch_size and --gradient_accumulation_steps.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import ObjectiveSettings, flag_group

ADV_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")
DECAY_TYPES = (0, 1, 2)
SOLVERS = ("dpm", "ode", "sde")


@dataclass
class NFTSettings(ObjectiveSettings):
    beta: float = 1.0
    decay_type: int = 1
    adv_mode: str = "all"
    solver: str = "dpm"
    enabled: bool = False  # --algorithm nft

    section = "nft"
    shares = ("grpo",)  # its advantages, grouping, timestep fraction and KL are GRPO's flags

    def samples_per_prompt(self, sections: dict) -> int:
        return sections["grpo"].samples_per_prompt(sections)  # GRPO's grouping (--use_group)

    def trained_steps_per_sample(self, cfg) -> int:
        """int(N x --timestep_fraction) of all N sampling timesteps, at least 1 (algorithms/nft.py)."""
        return max(1, int(cfg.rollout.sampling_steps * cfg.grpo.timestep_fraction))

    def needs_reference(self, cfg) -> bool:
        return cfg.grpo.kl_coef > 0

    def check_world(self, cfg, dp_size: int) -> None:
        cfg.grpo.check_world(cfg, dp_size)  # NFT's advantages are GRPO's

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "NFT (--algorithm nft)")
        g.add_argument("--nft_beta", type=float, default=1.0,
                       help="DiffusionNFT's beta: v+ = beta v + (1 - beta) v_old, v- = (1 + beta) v_old - beta v "
                            "(reference config.beta; its OCR and multi-reward runs use 0.1)")
        g.add_argument("--nft_decay_type", type=int, default=1, choices=list(DECAY_TYPES),
                       help="old policy <- decay * old + (1 - decay) * current after each iteration, decay(step) of "
                            "the optimizer steps so far: 0 flat (0: old = current), 1 min(0.001 step, 0.5), "
                            "2 0 for 75 steps then min(0.0075 (step - 75), 0.999)")
        g.add_argument("--adv_mode", type=str, default="all", choices=list(ADV_MODES),
                       help="which clipped advantages NFT uses: all, positive_only / negative_only (the other sign "
                            "set to 0), one_only (1 where > 0 else 0), binary (the sign)")
        g.add_argument("--nft_solver", type=str, default="dpm", choices=list(SOLVERS),
                       help="NFT's rollout: dpm (DPM-Solver++ 2M on the shifted schedule, the reference's dpm2), "
                            "ode (Euler), sde (the SDE plan of the sampling flags, --eta)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "NFTSettings":
        return cls(beta=args.nft_beta, decay_type=args.nft_decay_type, adv_mode=args.adv_mode,
                   solver=args.nft_solver, enabled=args.algorithm == "nft").checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        # A config.json written before NFT existed has no "nft" section: the defaults.
        if "beta" not in section:
            return {}
        return {"nft_beta": section["beta"], "nft_decay_type": section["decay_type"],
                "adv_mode": section["adv_mode"], "nft_solver": section["solver"]}

    def check(self) -> None:
        if self.beta <= 0:
            raise ConfigError(f"--nft_beta {self.beta} must be > 0 (the loss divides by it)")

    def check_across(self, sections: dict) -> None:
        """A deterministic rollout (--nft_solver dpm / ode) against the SDE plan's flags and the noise."""
        if not self.enabled or self.solver == "sde":
            return
        mix = sections["mix"]
        if mix.mode != "full" or mix.sde_kind != "dance":
            raise ConfigError(f"--nft_solver {self.solver} samples every step deterministically; the SDE window / "
                              "solver flags (--training_strategy part, --sde_steps, --flow_grpo_sampling, "
                              "--dpm_apply_strategy) choose GRPO's SDE steps: drop them, or use --nft_solver sde")
        if sections["rollout"].init_same_noise:
            raise ConfigError(f"--init_same_noise with --nft_solver {self.solver}: a deterministic solver from the "
                              "same noise gives a group G identical samples (no advantage); drop --init_same_noise")

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        """Called when NFT is selected (another objective's run names NFT's flags given: components)."""
        # NFT has no importance ratio (--clip_range) and no rollout log-probabilities (MixGRPO's
        # --kl_coeff), and trains int(N x --timestep_fraction) of all N timesteps (--train_last_step)
        unused = [f"--{k}" for k in ("clip_range", "kl_coeff", "train_last_step", "policy_loss")
                  if getattr(args, k) != getattr(defaults, k)]
        if args.nft_solver != "sde" and args.eta != defaults.eta:
            unused.append("--eta")
        notes = [f"{', '.join(unused)}: no effect with --algorithm nft (no importance ratio or rollout "
                 "log-probabilities; it trains int(N x --timestep_fraction) of all N timesteps; the rollout is "
                 f"--nft_solver {args.nft_solver})"] if unused else []
        return notes + _split_group_note(args) + _guidance_note(args)


def _guidance_note(args: argparse.Namespace) -> list[str]:
    """SD3's --guidance_scale is classifier-free guidance (the default 3.5 is FLUX.1-dev's embedding
    value): under NFT it guides the rollout, v, v_old and v_ref, two transformer passes each.
    DiffusionNFT trains SD3.5 at guidance 1.0 (config/nft.py L64), i.e. without CFG."""
    if getattr(args, "model_family", None) != "sd3" or not args.guidance_scale > 1.0:
        return []
    return [f"--algorithm nft with --model_family sd3: --guidance_scale {args.guidance_scale:g} runs classifier-free "
            "guidance in the rollout and in v, v_old and v_ref (2 passes each); DiffusionNFT trains SD3.5 at "
            "guidance 1.0 (no CFG): pass --guidance_scale 1 for the reference's setting (docs/nft.md)"]


def _split_group_note(args: argparse.Namespace) -> list[str]:
    """A note when an optimizer step covers part of a prompt group. Its advantages then do not sum to
    zero, so the step also regresses toward (or away from) its samples as such, whatever their
    rewards: on the tiny demo task at lr 1e-2, 2 steps of half a group each gained 0.03-0.08 in 30
    iterations, one step over the group 0.52-0.74 (docs/nft.md). The reference takes one step over
    all groups."""
    G = args.num_generations
    step = min(args.train_micro_batch_size * args.gradient_accumulation_steps, args.train_batch_size * G)
    if not args.use_group or G < 2 or step % G == 0:
        return []
    return [f"--algorithm nft: an optimizer step covers {step} samples "
            f"(--train_micro_batch_size x --gradient_accumulation_steps), not whole groups of "
            f"--num_generations {G}: NFT's loss then also fits those samples regardless of their rewards; "
            f"make it a multiple of {G} (the reference takes one step per iteration: --gradient_accumulation_steps "
            f"{-(-args.train_batch_size * G // args.train_micro_batch_size)})"]
