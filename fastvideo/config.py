"""Flags -> typed, validated configuration for GRPO training: the composition of the components.

Each component owns its flags and settings (the convention of fastvideo.settings); this module
builds one parser from COMPONENTS, lets fastvideo.compat translate DanceGRPO's and MixGRPO's flag
names, builds every component's settings into a TrainConfig, and checks the few rules that span two
components. Every accepted flag works, or fails with a message saying why (e.g. ``--sp_size 2``),
or is named in a start-up note (cfg.compat_notes) as having no effect.
"""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from fastvideo import compat
from fastvideo.algorithms.settings import GRPOSettings
from fastvideo.component_settings.outputs import PROBE_KINDS  # re-exported for old imports
from fastvideo.compat.dancegrpo import COMPAT_ONLY_FLAGS  # re-exported for old imports
from fastvideo.component_settings.eval import EvalSettings
from fastvideo.component_settings.lora import LoraSettings
from fastvideo.component_settings.optim import OptimSettings
from fastvideo.component_settings.outputs import OutputSettings
from fastvideo.data.settings import DataSettings
from fastvideo.distributed.settings import ParallelSettings
from fastvideo.errors import ConfigError, UserError
from fastvideo.models.settings import ModelConfig
from fastvideo.rewards.settings import RewardSettings
from fastvideo.sampling.mix import MixSettings
from fastvideo.sampling.settings import RolloutSettings
from fastvideo.settings import check_plugin_name, flag_group, parser_defaults

__all__ = ["COMPAT_ONLY_FLAGS", "COMPONENTS", "PROBE_KINDS", "ConfigError", "EvalSettings", "GRPOSettings",
           "LoraSettings", "MixSettings", "ModelConfig", "OptimSettings", "OutputSettings", "RewardSettings",
           "RolloutSettings", "TrainConfig", "build_parser", "parse_config", "validate_args"]

# (name, settings class), in the order their flags appear in --help and their settings are built.
COMPONENTS = (
    ("data", DataSettings), ("model", ModelConfig), ("reward", RewardSettings), ("rollout", RolloutSettings),
    ("grpo", GRPOSettings), ("mix", MixSettings), ("optim", OptimSettings), ("parallel", ParallelSettings),
    ("output", OutputSettings), ("eval", EvalSettings), ("lora", LoraSettings),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_grpo_flux",
        description="GRPO fine-tuning of FLUX (DanceGRPO-compatible flags).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    flag_group(p, "components").add_argument(
        "--algorithm", type=str, default="grpo",
        help='training objective: a registered name (grpo) or a plugin "pkg.module:Name"')
    for _, component in COMPONENTS:
        component.add_flags(p)
    compat.add_flags(p)
    return p


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

    def derived(self, world_size: int) -> dict:
        """Quantities users otherwise compute by hand; logged at start-up."""
        samples_per_rank = self.prompts_per_rank * self.rollout.num_generations
        micro = self.grpo.train_micro_batch_size
        micro_batches = math.ceil(samples_per_rank / micro)
        return {
            "world_size": world_size,
            "samples_per_iteration": samples_per_rank * world_size,
            "samples_per_rank": samples_per_rank,
            "trained_steps_per_sample": self.mix.trained_steps(self.grpo.trained_steps(self.rollout.sampling_steps),
                                                               self.grpo.candidate_steps(self.rollout.sampling_steps)),
            "micro_batches_per_rank": micro_batches,
            "optimizer_steps_per_iteration": math.ceil(micro_batches / self.grpo.gradient_accumulation_steps),
            "train_global_batch_size": micro * self.grpo.gradient_accumulation_steps * world_size,
        }

    def to_dict(self) -> dict:
        return asdict(self)


def _check_across(s: dict) -> None:
    """The rules that span two components (each component checks its own flags)."""
    rollout, grpo, reward, mix = s["rollout"], s["grpo"], s["reward"], s["mix"]
    if grpo.use_group and rollout.num_generations < 2:
        raise ConfigError(f"--num_generations {rollout.num_generations}: a group needs at least 2 samples")
    if reward.group_norm and not grpo.use_group:
        raise ConfigError("--reward_group_norm normalises each reward within a prompt's group: it needs --use_group")
    if rollout.sampling_steps < 1 if grpo.train_last_step else rollout.sampling_steps < 2:
        raise ConfigError(f"--sampling_steps {rollout.sampling_steps} is too small")
    if grpo.kl_coef > 0 and mix.sde_kind == "flow":
        raise ConfigError("--kl_coef is the KL between DanceGRPO's SDE steps; it is not implemented for "
                          "--flow_grpo_sampling")
    if grpo.kl_coef > 0 and mix.dpm_all:
        raise ConfigError("--kl_coef is the KL between DanceGRPO's SDE steps; it is not implemented for the "
                          "SDE-DPM-Solver steps of --dpm_apply_strategy all")


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
        algorithm=args.algorithm,
    )


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return validate_args(args)
    except UserError as exc:  # ConfigError, and a reward spec's own errors (unknown name, bad weight)
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
