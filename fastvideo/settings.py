"""The one convention for a component's settings, and the helpers its flags share.

Each component (model, rollout, rewards, objective, optimiser, outputs, evaluation, LoRA,
parallelism, data) owns ONE settings dataclass, next to its code where that package does not
itself read the training config (see the layering note below), built the same way::

    class RolloutSettings(Settings):
        @classmethod
        def add_flags(cls, parser): ...          # declare its flags (argparse groups)
        @classmethod
        def from_args(cls, args): ...            # read the parsed flags (never write them), refuse
                                                 # unsupported values, return cls(...).checked()
        def check(self): ...                     # invariants of the built values
        @classmethod
        def notes(cls, args, defaults): ...      # start-up notes for flags given without effect
        @classmethod
        def flags_from_resolved(cls, section): ...  # the inverse of from_args: {flag: value} that
                                                 # rebuild this component from its part of
                                                 # OUTPUT_DIR/config.json (used by --config)
        def check_across(self, sections): ...    # rules with other components' built settings

An objective's settings are an ``ObjectiveSettings``: besides its flags they say what the run needs
to know of the objective before it is built (its trained steps per sample, its samples per
prompt, what it needs built and kept: ObjectiveNeeds). A plugin objective or model family brings
its own settings class as its ``settings`` attribute, with a ``section`` name: its flags join the
parser when it is selected and its values are TrainConfig.plugins[section] (fastvideo.components).

Every error is a ``ConfigError`` (fastvideo.errors) raised directly, with a message naming the flag
and the fix. ``fastvideo.config`` composes the components (one parser, one TrainConfig) and checks
the few rules that span two of them; ``fastvideo.compat`` translates DanceGRPO's and MixGRPO's flag
names before any component reads them.

Layering: ``fastvideo.config`` must not import a package that imports it (training/, eval/), so the
settings of the optimiser, outputs, LoRA and evaluation live in ``fastvideo.component_settings``.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from fastvideo.errors import ConfigError

__all__ = ["ConfigError", "HelpFormatter", "ObjectiveNeeds", "ObjectiveSettings", "Settings", "at_least_one", "check_number",
           "check_plugin_name", "flag_group", "move_to_group", "parser_defaults"]


class Settings:
    """Base of every component's settings dataclass (adds no fields, so asdict is unchanged)."""

    # The name of its section in TrainConfig and config.json (a plugin's: its key in TrainConfig.plugins).
    section = ""
    # Keys an older config.json holds in this section that another component now reads (accepted,
    # then left to that component's flags_from_resolved).
    moved_keys: tuple[str, ...] = ()
    # Its fields sit at the top level of config.json (the data and parallel sections, as the file
    # has always had them) and read as TrainConfig attributes (cfg.fsdp_strategy).
    top_level = False

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        raise NotImplementedError(f"{cls.__name__}.add_flags")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Settings":
        raise NotImplementedError(f"{cls.__name__}.from_args")

    def check(self) -> None:
        """Raise ConfigError if the values cannot work together; nothing to check by default."""

    def checked(self):
        self.check()
        return self

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        """Start-up notes for this component's flags that were given but have no effect."""
        return []

    @classmethod
    def flags_from_resolved(cls, section) -> dict:
        """{flag name: value} that from_args turns back into ``section`` (this component's part of
        the resolved config, as TrainConfig.to_json writes it)."""
        raise NotImplementedError(f"{cls.__name__}.flags_from_resolved")

    def check_across(self, sections: dict) -> None:
        """Raise ConfigError for rules this component has with others (``sections``: every built
        component's settings by name); nothing by default."""


@dataclass(frozen=True)
class ObjectiveNeeds:
    """What a run builds and keeps for its objective (ObjectiveSettings.needs): asked by the
    trainer's builders, the communication-lean options (training.lean), the pre-flight memory
    check and the start-up notes, instead of comparing objective names."""

    old_policy: bool = False  # a float32 copy of the trainable weights (training.ema.WeightCopy; NFT)
    reference: bool = False  # a frozen reference policy (a KL term; built only then)
    log_probs: bool = True  # the rollout's SDE log-probabilities of every transition (GRPO's ratio)
    replay: bool = True  # per-timestep replay: every step's latents kept (Trajectory.latents)
    # a float32 copy of the trainable weights read only in the update, for one more no-grad forward per
    # trained step (AWM's EMA with --awm_ema_kl_beta > 0: ObjectiveSettings.needs of its settings)
    update_copy: bool = False


class ObjectiveSettings(Settings):
    """The settings of an objective (--algorithm). A plugin objective without flags of its own
    gets this class's defaults."""

    # The sections of other objectives whose flags this one reads (NFT: GRPO's advantages, KL,
    # timestep fraction); any other objective's flags given get one start-up note.
    shares: tuple[str, ...] = ()

    def samples_per_prompt(self, sections: dict) -> int:
        """Samples the rollout draws per prompt (``sections``: every built section by name):
        --num_generations, whatever the objective; how its advantages use the groups is its own."""
        return sections["rollout"].num_generations

    def needs(self, cfg, objective) -> ObjectiveNeeds:
        """What the run builds for this objective: the objective class's (or factory's)
        declarations (needs_old_policy, needs_log_probs, needs_trajectory) and needs_reference."""
        return ObjectiveNeeds(old_policy=getattr(objective, "needs_old_policy", False),
                              reference=self.needs_reference(cfg),
                              log_probs=getattr(objective, "needs_log_probs", True),
                              replay=getattr(objective, "needs_trajectory", True))

    def trained_steps_per_sample(self, cfg) -> int:
        """Forward/backward passes per sample in an update (logged in cfg.derived); 1 by default."""
        return 1

    def needs_reference(self, cfg) -> bool:
        """Whether the update reads a frozen reference policy (a KL term); built only then."""
        return False

    def check_world(self, cfg, dp_size: int) -> None:
        """Raise ConfigError for rules on the data-parallel world (checked at start-up, before any
        model loads); none by default."""

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        pass

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ObjectiveSettings":
        return cls().checked()

    @classmethod
    def flags_from_resolved(cls, section) -> dict:
        return {}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's default after its help, except where the help already says it or the flag is
    required."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or "(default:" in text:
            return text
        return super()._get_help_string(action)


def flag_group(parser: argparse.ArgumentParser, title: str):
    """The parser's argument group called ``title`` (created on first use), so that components
    sharing a help section (e.g. "data") add to the same one."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def move_to_group(parser: argparse.ArgumentParser, title: str, dests: tuple[str, ...]) -> None:
    """Show the flags ``dests`` (in that order) in the help section ``title`` instead of their own."""
    target = flag_group(parser, title)
    for dest in dests:
        action = next(a for a in parser._actions if a.dest == dest and a.option_strings[0] == f"--{dest}")
        for group in parser._action_groups:
            if action in group._group_actions:
                group._group_actions.remove(action)
        target._group_actions.append(action)


def parser_defaults(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Every flag's default, read from the parser once (no second parse, no required flags)."""
    return argparse.Namespace(**{a.dest: parser.get_default(a.dest) for a in parser._actions
                                 if a.dest != argparse.SUPPRESS})


def check_number(flag: str, value: float, *, above: float | None = None, at_least: float | None = None,
                 allow_inf: bool = False) -> None:
    """Refuse a NaN (and, unless ``allow_inf``, an infinite) flag value, and one at or below
    ``above`` / below ``at_least``: such values reach the optimiser or the sampler and fail hours
    later, or silently poison the run. ``flag`` is the flag's name without dashes."""
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ConfigError(f"--{flag} {value} must be a finite number")
    if above is not None and not value > above:
        raise ConfigError(f"--{flag} {value} must be greater than {above:g}")
    if at_least is not None and not value >= at_least:
        raise ConfigError(f"--{flag} {value} must be at least {at_least:g}")


def at_least_one(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1")


_REGISTERED = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_PLUGIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def check_plugin_name(flag: str, value: str, examples: str) -> None:
    """A registered name (``examples`` of the flag's: "flux, sd3") or a plugin path
    ("pkg.module:Name"); whether it resolves is checked where the component is built."""
    if not (_PLUGIN.match(value) or (":" not in value and _REGISTERED.match(value))):
        raise ConfigError(f"--{flag} {value!r}: give a registered name (e.g. {examples}) or a plugin "
                          "path pkg.module:Name")
