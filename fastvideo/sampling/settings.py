"""The rollout's settings: image size, sampling schedule and noise, group size, batching. The one
type for them: the sampler reads it too (fastvideo.sampling.rollout.RolloutConfig is this class).

The SDE window / solver choices (MixGRPO, Flow-GRPO-Fast) are fastvideo.sampling.mix.MixSettings."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, at_least_one, check_number, flag_group


DECODE_FROM = ("x0_prediction", "final_sample")
SAME_NOISE_SCOPES = ("rank", "prompt")
# sampling.sde.grid_sigmas's grids (not imported from there: --help must not import torch)
SIGMA_GRIDS = ("shifted_linspace", "diffusers")


@dataclass(frozen=True, kw_only=True)
class RolloutSettings(Settings):
    """How to sample. The model's forward settings (FLUX's guidance embedding, SD3's classifier-free
    guidance, whether the transformer sees floor(1000 sigma) / 1000) are the model family's: it is
    constructed with them (guidance_scale, quantize_timestep); the SDE step always uses the exact
    sigma. Built from the flags (from_args, whose check() adds the training run's rules) or directly
    (tests, benchmarks: eta 0 is the deterministic ODE sampler)."""

    height: int
    width: int
    sampling_steps: int
    eta: float
    shift: float
    guidance_scale: float = 3.5
    quantize_timestep: bool = True
    num_generations: int  # samples per prompt (the objective's: ObjectiveSettings.samples_per_prompt)
    rollout_batch_size: int
    init_same_noise: bool
    share_ode_prefix: bool = True  # with init_same_noise, a plan's leading ODE steps once per group
    # What init_same_noise shares: "rank" (upstream DanceGRPO: one noise for every sample of the
    # rollout call, i.e. of a rank's train_batch_size x G samples) or "prompt" (one per group).
    same_noise_scope: str = "rank"
    sigma_grid: str = "shifted_linspace"
    # What Trajectory.x0 (decoded, rewarded, NFT's clean sample) is: the last step's x0 prediction
    # (DanceGRPO) or the last transition's sample (Flow-GRPO's and DiffusionNFT's pipelines).
    decode_from: str = "x0_prediction"
    # Best-of-n group sampling (--bestofn K, 0: off): the update trains the K / 2 lowest- and K / 2
    # highest-advantage samples of each group (fastvideo.grpo.bestofn; DanceGRPO's HunyuanVideo trainer)
    bestofn: int = 0

    @property
    def trained_per_prompt(self) -> int:
        """Samples of a prompt's group that the update trains: K under --bestofn K, else all G."""
        return self.bestofn or self.num_generations

    def __post_init__(self):
        """What any rollout needs (ConfigError, a ValueError, naming the field and its flag)."""
        problems = []
        h, w = self.height, self.width
        if h < 1 or w < 1 or h % 16 or w % 16:
            problems.append(f"height and width (--h {h} --w {w}) must be positive multiples of 16")
        for name in ("sampling_steps", "num_generations", "rollout_batch_size"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} (--{name}) must be >= 1 (got {getattr(self, name)})")
        if self.eta < 0:
            problems.append(f"eta must be >= 0 (got {self.eta}); 0 gives the deterministic ODE sampler")
        if self.shift <= 0:
            problems.append(f"shift must be > 0 (got {self.shift})")
        if self.decode_from not in DECODE_FROM:
            problems.append(f"decode_from must be one of {DECODE_FROM} (got {self.decode_from!r})")
        if self.same_noise_scope not in SAME_NOISE_SCOPES:
            problems.append(f"same_noise_scope must be one of {SAME_NOISE_SCOPES} (got {self.same_noise_scope!r})")
        if problems:
            raise ConfigError("invalid rollout configuration: " + "; ".join(problems))

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        flag_group(parser, "data").add_argument("--num_latent_t", type=int, default=1,
                                                help="latent frames; must be 1 for images")
        g = flag_group(parser, "GRPO")
        g.add_argument("--h", type=int, default=720, help="image height (multiple of 16)")
        g.add_argument("--w", type=int, default=720, help="image width (multiple of 16)")
        g.add_argument("--t", type=int, default=1, help="frames; must be 1 for images")
        g.add_argument("--sampling_steps", type=int, default=16, help="denoising steps of a rollout")
        g.add_argument("--eta", type=float, default=0.3, help="noise level of the SDE sampler (must be > 0)")
        g.add_argument("--shift", type=float, default=3.0, help="timestep shift of the sigma schedule")
        g.add_argument("--pipeline_shift", action="store_true",
                       help="instead of --shift, the shift the model family's stock pipeline computes for this "
                            "image size and step count (a family whose schedule depends on them; others refuse it)")
        g.add_argument("--sigma_grid", choices=SIGMA_GRIDS, default="shifted_linspace",
                       help="the rollout's noise levels: shifted_linspace = linspace(1, 0) shifted (DanceGRPO); "
                            "diffusers = FlowMatchEulerDiscreteScheduler's set_timesteps grid (Flow-GRPO, "
                            "DiffusionNFT: 1 .. shift(shift(1/1000)), then 0)")
        g.add_argument("--decode_from", choices=DECODE_FROM, default="x0_prediction",
                       help="what is decoded and rewarded: x0_prediction = the last step's x0 prediction "
                            "(DanceGRPO); final_sample = the last transition's sample (Flow-GRPO, DiffusionNFT)")
        g.add_argument("--guidance_scale", type=float, default=3.5,
                       help="FLUX.1-dev: its guidance embedding's value; SD3 (--model_family sd3): the classifier-free "
                            "guidance scale, on above 1, in rollout and update (Flow-GRPO: 4.5)")
        g.add_argument("--no_quantize_timestep", action="store_true",
                       help="pass the exact sigma to the transformer (diffusers' FluxPipeline) instead of "
                            "upstream's floor(1000*sigma)/1000")
        g.add_argument("--num_generations", type=int, default=12, help="samples per prompt (group size)")
        g.add_argument("--bestofn", type=int, default=0,
                       help="best-of-n group sampling: roll out and score all --num_generations G samples of a "
                            "prompt, compute advantages over the whole group, then train only the K/2 lowest- and "
                            "K/2 highest-advantage ones (DanceGRPO's HunyuanVideo --bestofn; K even, 2..G; 0: off)")
        g.add_argument("--init_same_noise", action="store_true",
                       help="share the initial noise (see --same_noise_scope)")
        g.add_argument("--same_noise_scope", choices=("rank", "prompt"), default="rank",
                       help="with --init_same_noise: rank = one noise for all train_batch_size x G samples of a "
                            "rank (upstream DanceGRPO); prompt = one noise per group, so a rank's groups start "
                            "apart")
        g.add_argument("--no_share_ode_prefix", action="store_true",
                       help="with --init_same_noise, still compute a window plan's leading ODE steps for every "
                            "sample (by default once per group: the G samples pass through the same states there)")
        g.add_argument("--rollout_batch_size", type=int, default=1, help="samples per transformer call in the rollout")
        g.add_argument("--cfg", type=float, default=0.0,
                       help="DanceGRPO's classifier-free guidance flag; must be 0 (FLUX.1-dev is guidance-distilled; "
                            "SD3's classifier-free guidance is --guidance_scale)")
        g.add_argument("--precondition_outputs", action="store_true", help="not supported for FLUX")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RolloutSettings":
        """Refuses the video and classifier-free-guidance flags (accepted only with their neutral values)."""
        if args.t != 1 or args.num_latent_t != 1:
            raise ConfigError("--t and --num_latent_t must be 1: this trainer is for images")
        if args.cfg != 0.0:
            raise ConfigError(f"--cfg {args.cfg}: classifier-free guidance is not supported through --cfg; FLUX.1-dev "
                              "uses its guidance embedding (--guidance_scale), and --model_family sd3 takes its "
                              "classifier-free guidance scale as --guidance_scale")
        if args.precondition_outputs:
            raise ConfigError("--precondition_outputs is not supported for FLUX (velocity prediction)")
        at_least_one(args, "rollout_batch_size")
        return cls(
            height=args.h, width=args.w, sampling_steps=args.sampling_steps, eta=args.eta,
            shift=pipeline_shift(args) if args.pipeline_shift else args.shift, guidance_scale=args.guidance_scale,
            quantize_timestep=not args.no_quantize_timestep, num_generations=args.num_generations,
            rollout_batch_size=args.rollout_batch_size, init_same_noise=args.init_same_noise,
            share_ode_prefix=not args.no_share_ode_prefix, same_noise_scope=args.same_noise_scope,
            sigma_grid=args.sigma_grid, decode_from=args.decode_from, bestofn=args.bestofn,
        ).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        names = ("sampling_steps", "eta", "shift", "guidance_scale", "num_generations", "rollout_batch_size",
                 "init_same_noise")
        return {**{n: section[n] for n in names}, "h": section["height"], "w": section["width"],
                "no_quantize_timestep": not section["quantize_timestep"],
                "no_share_ode_prefix": not section["share_ode_prefix"],
                # a config.json written before the flag existed ran with one noise per prompt
                "same_noise_scope": section.get("same_noise_scope", "prompt"),
                # a config.json written before these flags existed ran with their defaults
                "sigma_grid": section.get("sigma_grid", "shifted_linspace"),
                "decode_from": section.get("decode_from", "x0_prediction"),
                "bestofn": section.get("bestofn", 0)}

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        if args.pipeline_shift and args.shift != defaults.shift:
            return [f"--shift {args.shift} has no effect with --pipeline_shift (the family's own shift is used)"]
        if args.same_noise_scope != defaults.same_noise_scope and not args.init_same_noise:
            return [f"--same_noise_scope {args.same_noise_scope} has no effect without --init_same_noise"]
        return []

    def check_across(self, sections: dict) -> None:
        G, K = self.num_generations, self.bestofn
        if K and (K % 2 or not 2 <= K <= G):
            raise ConfigError(f"--bestofn {K}: it keeps K/2 lowest and K/2 highest of each prompt's {G} sample(s); "
                              f"give an even K from 2 to --num_generations {G} (groups need --use_group), or 0 (off)")
        mix = sections["mix"]
        if self.sigma_grid != "shifted_linspace" and mix.dpm_post_ratio is not None:
            raise ConfigError(f"--sigma_grid {self.sigma_grid} replaces the full schedule; --dpm_apply_strategy post "
                              "compresses its tail on the shifted_linspace grid: use --sigma_grid shifted_linspace "
                              "or another --dpm_apply_strategy")

    def check(self) -> None:
        h, w = self.height, self.width
        if h <= 0 or w <= 0 or h % 16 or w % 16:
            raise ConfigError(f"--h {h} --w {w}: both must be positive multiples of 16")
        check_number("eta", self.eta)
        check_number("shift", self.shift, above=0.0)  # sigma' = shift*s / (1 + (shift-1)*s): 0 collapses it
        check_number("guidance_scale", self.guidance_scale)
        if self.eta <= 0:
            raise ConfigError(f"--eta {self.eta}: GRPO needs a stochastic sampler (eta > 0) to have "
                              "log-probabilities")


def pipeline_shift(args: argparse.Namespace) -> float:
    """--pipeline_shift: the model family's stock-pipeline shift for --h x --w and --sampling_steps
    (ModelFamily.schedule_shift); a ConfigError for a family whose schedule does not depend on them."""
    from fastvideo.models.registry import DEFAULT_FAMILY, get_model_family

    name = getattr(args, "model_family", DEFAULT_FAMILY)
    shift = get_model_family(name).schedule_shift(args.h, args.w, args.sampling_steps)
    if shift is None:
        raise ConfigError(f"--pipeline_shift: model family {name!r} has no size-dependent schedule of its own; "
                          "give the schedule's shift as --shift")
    return float(shift)
