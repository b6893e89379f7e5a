"""Flags -> typed, validated configuration for training: the composition of the components.

Each component owns its flags and settings (fastvideo.settings; the list: fastvideo.components,
with a selected plugin's own). This module builds one parser, lets fastvideo.compat translate
DanceGRPO's and MixGRPO's names, builds every component into a TrainConfig and runs their
cross-component checks. Every accepted flag works, fails saying why, or is named in a start-up note
(cfg.compat_notes). ``--config FILE`` / ``--print_config``: fastvideo.config_file.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from fastvideo import compat, config_file, flag_check
from fastvideo.algorithms.nft_settings import NFTSettings
from fastvideo.algorithms.settings import GRPOSettings  # noqa: F401  (re-exported for old imports)
from fastvideo.component_settings.eval import EvalSettings
from fastvideo.component_settings.lora import LoraSettings
from fastvideo.component_settings.optim import OptimSettings
from fastvideo.component_settings.outputs import PROBE_KINDS, OutputSettings  # noqa: F401  (PROBE_KINDS: old imports)
from fastvideo.component_settings.update import UpdateSettings
from fastvideo.compat.dancegrpo import COMPAT_ONLY_FLAGS  # noqa: F401  (re-exported for old imports)
from fastvideo.components import (COMPONENTS, add_component_flags, add_top_level_views, flat_layout, nested_layout,
                                  objective_sections, objective_settings, plugin_sections, unselected_note)
from fastvideo.data.settings import DataSettings
from fastvideo.distributed.settings import ParallelSettings
from fastvideo.errors import ConfigError, UserError, one_line_errors
from fastvideo.models.settings import ModelConfig
from fastvideo.rewards.settings import RewardSettings
from fastvideo.sampling.mix import MixSettings
from fastvideo.sampling.settings import RolloutSettings
from fastvideo.settings import HelpFormatter, ObjectiveNeeds, check_plugin_name, move_to_group, parser_defaults

__all__ = ["COMPONENTS", "ConfigError", "TrainConfig", "build_parser", "parse_config", "resolved_flags",
           "validate_args"]

# The first help section: what most runs set.
ESSENTIALS = ("data_json_path", "pretrained_model_name_or_path", "output_dir", "rewards", "h", "w", "sampling_steps",
              "num_generations", "learning_rate", "max_train_steps", "seed", "algorithm", "model_family")
# Flags that say how to read or show the configuration rather than being part of it.
FILE_FLAGS = ("config", "print_config")


def build_parser(argv: Sequence[str] = (), plugins: tuple | None = None) -> argparse.ArgumentParser:
    """Every flag: the components', and those of the ``plugins`` sections (default: of the plugin
    objective or family that ``argv``, or its --config file, selects)."""
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="train_grpo_flux", description="GRPO fine-tuning of FLUX (DanceGRPO-compatible flags).",
        usage="%(prog)s [--config FILE] --data_json_path FILE --pretrained_model_name_or_path DIR [flags]",
        formatter_class=HelpFormatter)
    config_file.add_flags(p)
    add_component_flags(p, plugin_sections(*config_file.selected(argv)) if plugins is None else plugins)
    compat.add_flags(p)
    move_to_group(p, "essentials", ESSENTIALS)
    return one_line_errors(p)


@functools.cache
def _defaults(algorithm: str = "grpo", family: str = "flux") -> argparse.Namespace:
    """Every flag's default (a selected plugin's too), read once from the parser."""
    return parser_defaults(build_parser(plugins=plugin_sections(algorithm, family, strict=False)))


@dataclass
class TrainConfig:
    """One section per component (components.COMPONENTS, in its order), each built by its component
    from the flags; config.json keeps the data and parallel sections at its top level (Settings.top_level)."""

    data: DataSettings
    model: ModelConfig
    reward: RewardSettings
    rollout: RolloutSettings  # num_generations: the samples per prompt the objective draws
    grpo: GRPOSettings
    nft: NFTSettings  # --algorithm nft's own flags
    mix: MixSettings  # SDE window / solver (sampling.mix)
    optim: OptimSettings
    update: UpdateSettings  # micro-batches and accumulation
    parallel: ParallelSettings
    output: OutputSettings
    eval: EvalSettings | None  # None when evaluation is off
    lora: LoraSettings
    algorithm: str = "grpo"  # a registered objective or a "pkg.module:Name" plugin (--algorithm)
    compat_notes: list[str] = field(default_factory=list)
    plugins: dict = field(default_factory=dict)  # a plugin objective's or family's own section, by name

    def objective_settings(self):
        """The selected objective's own settings (fastvideo.settings.ObjectiveSettings)."""
        return objective_settings(self.algorithm, {**vars(self), **self.plugins})

    def derived(self, world_size: int) -> dict:
        """Quantities users otherwise compute by hand; logged at start-up."""
        samples_per_rank = self.prompts_per_rank * self.rollout.num_generations
        micro, accumulation = self.update.train_micro_batch_size, self.update.gradient_accumulation_steps
        micro_batches = math.ceil(self.prompts_per_rank * self.rollout.trained_per_prompt / micro)  # --bestofn K: K
        return {
            "world_size": world_size,
            "samples_per_iteration": samples_per_rank * world_size,
            "samples_per_rank": samples_per_rank,
            "trained_steps_per_sample": self.objective_settings().trained_steps_per_sample(self),
            "micro_batches_per_rank": micro_batches,
            "optimizer_steps_per_iteration": math.ceil(micro_batches / accumulation),
            "train_global_batch_size": micro * accumulation * world_size,
        }

    def objective_needs(self) -> ObjectiveNeeds:
        """What the run builds and keeps for the selected objective (fastvideo.settings.ObjectiveNeeds)."""
        from fastvideo.algorithms.registry import resolve_objective

        return self.objective_settings().needs(self, resolve_objective(self.algorithm))

    def to_dict(self) -> dict:
        """asdict, the top-level sections' fields at the top (config.json's layout)."""
        return flat_layout(asdict(self))

    def to_json(self) -> dict:
        """to_dict as JSON values, each reward as its --rewards entry: what OUTPUT_DIR/config.json
        holds (with "derived" and "device") and --config reads back."""
        from fastvideo.rewards.settings import spec_text

        d = json.loads(json.dumps(self.to_dict()))
        d["reward"]["spec"] = [spec_text(s) for s in self.reward.spec]
        return d


add_top_level_views(TrainConfig)  # cfg.data_json_path, cfg.fsdp_strategy, ...: read-only


def resolved_flags(resolved: dict) -> dict:
    """The flags that rebuild a resolved configuration (TrainConfig.to_json), from each component."""
    plugins = plugin_sections(resolved.get("algorithm", "grpo"), (resolved.get("model") or {}).get("family", "flux"))
    resolved = nested_layout(resolved)
    config_file.check_resolved_keys(resolved, TrainConfig, dict(COMPONENTS + plugins))
    flags = {"algorithm": resolved["algorithm"]}
    for name, component in COMPONENTS:
        flags.update(component.flags_from_resolved(resolved.get(name, resolved)))
    for name, component in plugins:
        flags.update(component.flags_from_resolved((resolved.get("plugins") or {}).get(name, {})))
    return flags


def _build(ns: argparse.Namespace, defaults: argparse.Namespace) -> tuple[dict, dict, list[str]]:
    """(components' settings, plugins' settings, their start-up notes), every rule checked. The
    rollout's num_generations becomes the samples per prompt the selected objective draws."""
    plugins = plugin_sections(ns.algorithm, ns.model_family, strict=False)
    s = {name: component.from_args(ns) for name, component in COMPONENTS}
    try:
        own = {name: component.from_args(ns) for name, component in plugins}
    except AttributeError as exc:  # parsed by a parser that did not know the selected plugin
        raise ConfigError(f"a plugin's flag is missing ({exc}): parse with build_parser(argv)") from None
    objective = objective_settings(ns.algorithm, {**s, **own}, strict=False)
    s["rollout"] = replace(s["rollout"], num_generations=objective.samples_per_prompt({**s, **own}))
    _, others = objective_sections(ns.algorithm, objective)
    for name, built in {**s, **own}.items():  # eval is None when evaluation is off
        if built is not None and name not in others:
            built.check_across({**s, **own})
    notes = [note for name, component in COMPONENTS + plugins for note in (
        unselected_note(component, others[name], ns, defaults) if name in others else component.notes(ns, defaults))]
    return s, own, notes


def validate_args(args: argparse.Namespace) -> TrainConfig:
    """Translate compatibility flags, build and check every component, check the rules across them.
    ``args`` is read, never written."""
    check_plugin_name("algorithm", args.algorithm, "grpo, nft")
    defaults = _defaults(args.algorithm, args.model_family)
    ns, notes = compat.translate(args, defaults)
    s, plugins, more = _build(ns, defaults)
    return TrainConfig(**s, algorithm=args.algorithm, compat_notes=notes + more, plugins=plugins)


def parse_config(argv: Sequence[str] | None = None, usage: bool = True, input_check=None) -> TrainConfig:
    """Flags (over --config FILE's values) -> TrainConfig; --print_config prints it and exits 0.
    The launcher's parse check (fastvideo.flag_check): EVERY problem -- unknown flags with the
    nearest name, bad values, each bad key of the file, the rules -- as ``PROG: error:`` lines and
    exit 2, or with ``usage=False`` one ConfigError carrying them. ``input_check(args, cfg)`` ->
    problems (the entry point: fastvideo.preflight.file_problems) runs with --print_config; its
    problems are warnings, as a configuration is often written where its data is not."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, problems = flag_check.parse_all(argv, build_parser, resolved_flags)
    try:
        cfg = validate_args(args) if args is not None else None
    except UserError as exc:  # ConfigError, and a reward spec's own errors (unknown name, bad weight)
        problems.append(flag_check.one_line(exc))
    if problems:
        flag_check.refuse(problems, usage)
    if args.print_config:
        for problem in input_check(args, cfg) if input_check else ():
            sys.stderr.write(f"train_grpo_flux: warning: {problem}\n")
        print(config_file.dump(cfg.to_json(), args.print_config), end="")
        raise SystemExit(0)
    return cfg
