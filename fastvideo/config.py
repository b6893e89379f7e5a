"""Flags -> typed, validated configuration for GRPO training: the composition of the components.

Each component owns its flags and settings (the convention of fastvideo.settings); this module
builds one parser from COMPONENTS, lets fastvideo.compat translate DanceGRPO's and MixGRPO's flag
names, builds every component's settings into a TrainConfig, and checks the few rules that span two
components. Every accepted flag works, or fails with a message saying why (e.g. ``--sp_size 2``),
or is named in a start-up note (cfg.compat_notes) as having no effect. ``--config FILE`` gives flag
values from a file (fastvideo.config_file); ``--print_config`` prints the resolved configuration.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from fastvideo import compat, config_file
from fastvideo.algorithms.nft_settings import NFTSettings
from fastvideo.algorithms.settings import GRPOSettings
from fastvideo.component_settings.outputs import PROBE_KINDS  # re-exported for old imports
from fastvideo.compat.dancegrpo import COMPAT_ONLY_FLAGS  # re-exported for old imports
from fastvideo.component_settings.eval import EvalSettings
from fastvideo.component_settings.lora import LoraSettings
from fastvideo.component_settings.optim import OptimSettings
from fastvideo.component_settings.outputs import OutputSettings
from fastvideo.data.settings import DataSettings
from fastvideo.distributed.settings import ParallelSettings
from fastvideo.errors import ConfigError, UserError, one_line_errors
from fastvideo.models.settings import ModelConfig
from fastvideo.rewards.settings import RewardSettings
from fastvideo.sampling.mix import MixSettings
from fastvideo.sampling.settings import RolloutSettings
from fastvideo.settings import HelpFormatter, check_plugin_name, flag_group, move_to_group, parser_defaults

__all__ = ["COMPAT_ONLY_FLAGS", "COMPONENTS", "PROBE_KINDS", "ConfigError", "EvalSettings", "GRPOSettings",
           "LoraSettings", "MixSettings", "ModelConfig", "OptimSettings", "OutputSettings", "RewardSettings",
           "RolloutSettings", "TrainConfig", "build_parser", "parse_config", "resolved_flags", "validate_args"]

# (name, settings class), in the order their flags appear in --help and their settings are built.
COMPONENTS = (
    ("data", DataSettings), ("model", ModelConfig), ("reward", RewardSettings), ("rollout", RolloutSettings),
    ("grpo", GRPOSettings), ("nft", NFTSettings), ("mix", MixSettings), ("optim", OptimSettings), ("parallel", ParallelSettings),
    ("output", OutputSettings), ("eval", EvalSettings), ("lora", LoraSettings),
)
# The first help section: what most runs set.
ESSENTIALS = ("data_json_path", "pretrained_model_name_or_path", "output_dir", "rewards", "h", "w", "sampling_steps",
              "num_generations", "learning_rate", "max_train_steps", "seed", "algorithm", "model_family")
# Flags that say how to read or show the configuration rather than being part of it.
FILE_FLAGS = ("config", "print_config")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_grpo_flux", description="GRPO fine-tuning of FLUX (DanceGRPO-compatible flags).",
        usage="%(prog)s [--config FILE] --data_json_path FILE --pretrained_model_name_or_path DIR [flags]",
        formatter_class=HelpFormatter)
    g = flag_group(p, "essentials")
    g.add_argument("--config", type=str, default=None, metavar="FILE",
                   help="YAML or JSON file of flag values (flag names as keys, or a run's OUTPUT_DIR/config.json); "
                        "flags on the command line override it")
    g.add_argument("--print_config", nargs="?", const="yaml", default=None, choices=["yaml", "json"],
                   help="print the resolved configuration (a valid --config file) and exit")
    flag_group(p, "components").add_argument(
        "--algorithm", type=str, default="grpo",
        help='training objective: a registered name (grpo, nft: DiffusionNFT, docs/nft.md) or a plugin '
             '"pkg.module:Name"')
    for _, component in COMPONENTS:
        component.add_flags(p)
    compat.add_flags(p)
    move_to_group(p, "essentials", ESSENTIALS)
    return one_line_errors(p)


@functools.cache
def _defaults() -> argparse.Namespace:
    """Every flag's default, read once from the parser."""
    return parser_defaults(build_parser())


@dataclass
class TrainConfig:
    data_json_path: str
    dataloader_num_workers: int
    prompts_per_rank: int
    model: ModelConfig
    rollout: RolloutSettings
    reward: RewardSettings
    grpo: GRPOSettings
    optim: OptimSettings
    output: OutputSettings
    fsdp_strategy: str
    cpu_offload: bool
    compat_notes: list[str] = field(default_factory=list)
    eval: EvalSettings | None = None  # None when evaluation is off
    lora: LoraSettings = field(default_factory=lambda: LoraSettings(False, 128, 256.0, 0.0, (), None))
    mix: MixSettings = field(default_factory=MixSettings)  # SDE window / solver (sampling.mix)
    algorithm: str = "grpo"  # a registered objective or a "pkg.module:Name" plugin (--algorithm)
    fsdp_param_dtype: str = "fp32"  # --fsdp_param_dtype (distributed.settings)
    fsdp_forward_prefetch: bool = False  # --fsdp_forward_prefetch
    nft: NFTSettings = field(default_factory=NFTSettings)  # --algorithm nft's own flags

    def derived(self, world_size: int) -> dict:
        """Quantities users otherwise compute by hand; logged at start-up."""
        samples_per_rank = self.prompts_per_rank * self.rollout.num_generations
        micro = self.grpo.train_micro_batch_size
        micro_batches = math.ceil(samples_per_rank / micro)
        return {
            "world_size": world_size,
            "samples_per_iteration": samples_per_rank * world_size,
            "samples_per_rank": samples_per_rank,
            "trained_steps_per_sample": self._trained_steps_per_sample(),
            "micro_batches_per_rank": micro_batches,
            "optimizer_steps_per_iteration": math.ceil(micro_batches / self.grpo.gradient_accumulation_steps),
            "train_global_batch_size": micro * self.grpo.gradient_accumulation_steps * world_size,
        }

    def _trained_steps_per_sample(self) -> int:
        n = self.rollout.sampling_steps
        if self.nft.enabled:  # NFT: int(N * fraction) of all N sampling timesteps (algorithms/nft.py)
            return max(1, int(n * self.grpo.timestep_fraction))
        return self.mix.trained_steps(self.grpo.trained_steps(n), self.grpo.candidate_steps(n))

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> dict:
        """to_dict as JSON values, each reward as its --rewards entry: what OUTPUT_DIR/config.json
        holds (with "derived" and "device") and --config reads back."""
        from fastvideo.rewards.settings import spec_text

        d = json.loads(json.dumps(self.to_dict()))
        d["reward"]["spec"] = [spec_text(s) for s in self.reward.spec]
        return d


def resolved_flags(resolved: dict) -> dict:
    """The flags that rebuild a resolved configuration (TrainConfig.to_json), from each component."""
    config_file.check_resolved_keys(resolved, TrainConfig, dict(COMPONENTS))
    flags = {"algorithm": resolved["algorithm"]}
    for name, component in COMPONENTS:
        flags.update(component.flags_from_resolved(resolved.get(name, resolved)))
    return flags


def _check_across(s: dict) -> None:
    """The rules that span two components (each component checks its own flags)."""
    rollout, grpo, reward, mix = s["rollout"], s["grpo"], s["reward"], s["mix"]
    if s["parallel"].fsdp_param_dtype == "bf16" and s["model"].mixed_precision != "bf16":
        raise ConfigError("--fsdp_param_dtype bf16 computes with bf16 parameters: it needs --mixed_precision bf16 "
                          f"(autocast), not {s['model'].mixed_precision!r}")
    if grpo.use_group and rollout.num_generations < 2:
        raise ConfigError(f"--num_generations {rollout.num_generations}: a group needs at least 2 samples")
    if reward.group_norm and not grpo.use_group:
        raise ConfigError("--reward_group_norm normalises each reward within a prompt's group: it needs --use_group")
    if rollout.sampling_steps < 1 if grpo.train_last_step else rollout.sampling_steps < 2:
        raise ConfigError(f"--sampling_steps {rollout.sampling_steps} is too small")
    if grpo.kl_coef > 0 and mix.dpm_all:
        raise ConfigError("--kl_coef is the KL between DanceGRPO's or Flow-GRPO's SDE steps; it is not implemented "
                          "for the SDE-DPM-Solver steps of --dpm_apply_strategy all")
    if s["nft"].enabled and s["nft"].solver != "sde" and (mix.mode != "full" or mix.sde_kind != "dance"):
        raise ConfigError(f"--nft_solver {s['nft'].solver} samples every step deterministically; the SDE window / "
                          "solver flags (--training_strategy part, --sde_steps, --flow_grpo_sampling, "
                          "--dpm_apply_strategy) choose GRPO's SDE steps: drop them, or use --nft_solver sde")
    if s["nft"].enabled and s["nft"].solver != "sde" and rollout.init_same_noise:
        raise ConfigError(f"--init_same_noise with --nft_solver {s['nft'].solver}: a deterministic solver from the same "
                          "noise gives a group G identical samples (no advantage); drop --init_same_noise")


def _across_notes(args: argparse.Namespace) -> list[str]:
    if not args.use_group and args.num_generations != 1:
        return [f"--num_generations {args.num_generations} has no effect without --use_group: as upstream, each "
                "prompt gets one sample and advantages are normalised over the gathered batch"]
    return []


def validate_args(args: argparse.Namespace) -> TrainConfig:
    """Translate compatibility flags, build and check every component, check the rules across them.
    ``args`` is read, never written."""
    defaults = _defaults()
    check_plugin_name("algorithm", args.algorithm)
    ns, notes = compat.translate(args, defaults)
    s = {name: component.from_args(ns) for name, component in COMPONENTS}
    _check_across(s)
    notes += _across_notes(ns)
    for _, component in COMPONENTS:
        notes += component.notes(ns, defaults)
    rollout, data, parallel = s["rollout"], s["data"], s["parallel"]
    # Upstream without --use_group: one sample per prompt, advantages over the gathered batch.
    rollout = replace(rollout, num_generations=rollout.num_generations if s["grpo"].use_group else 1)
    return TrainConfig(
        data_json_path=data.data_json_path, dataloader_num_workers=data.dataloader_num_workers,
        prompts_per_rank=data.prompts_per_rank, model=s["model"], rollout=rollout, reward=s["reward"],
        grpo=s["grpo"], optim=s["optim"], output=s["output"], fsdp_strategy=parallel.fsdp_strategy,
        cpu_offload=parallel.cpu_offload, compat_notes=notes, eval=s["eval"], lora=s["lora"], mix=s["mix"],
        algorithm=args.algorithm, fsdp_param_dtype=parallel.fsdp_param_dtype,
        fsdp_forward_prefetch=parallel.fsdp_forward_prefetch, nft=s["nft"],
    )


def parse_config(argv: Sequence[str] | None = None, usage: bool = True) -> TrainConfig:
    """Flags (over --config FILE's values) -> TrainConfig; --print_config prints it and exits 0.
    A bad flag: argparse's usage text and exit 2, or with ``usage=False`` a ConfigError carrying
    the message alone (the entry point prints it once, on rank 0)."""
    parser = build_parser()
    if not usage:
        def refuse(message):
            raise ConfigError(message)

        parser.error = refuse
    try:
        config_file.apply_file(parser, argv, resolved_flags)
        args = parser.parse_args(argv)
        cfg = validate_args(args)
    except UserError as exc:  # ConfigError, and a reward spec's own errors (unknown name, bad weight)
        if not usage:
            raise
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
    if args.print_config:
        print(config_file.dump(cfg.to_json(), args.print_config), end="")
        raise SystemExit(0)
    return cfg
