"""Which settings sections a run has: the built-in components, and the own section of a plugin
objective (--algorithm pkg.module:Name) or model family (--model_family pkg.module:Name).

A plugin names its settings class as its ``settings`` attribute (a fastvideo.settings.Settings
dataclass with a ``section`` name; an objective's is an ObjectiveSettings). Its flags join the
parser when it is selected, its values become TrainConfig.plugins[section], and config.json keeps
them there, so --config and a resume read them back. The built-in objectives' and families' names
are known here without importing them (so --help and flag errors stay fast, without torch);
anything else is resolved through its registry, which imports the plugin.
"""

from __future__ import annotations

from dataclasses import fields

from fastvideo.algorithms.nft_settings import NFTSettings
from fastvideo.algorithms.settings import GRPOSettings
from fastvideo.component_settings.eval import EvalSettings
from fastvideo.component_settings.lora import LoraSettings
from fastvideo.component_settings.optim import OptimSettings
from fastvideo.component_settings.outputs import OutputSettings
from fastvideo.component_settings.update import UpdateSettings
from fastvideo.data.settings import DataSettings
from fastvideo.distributed.settings import ParallelSettings
from fastvideo.errors import ConfigError, UserError
from fastvideo.models.settings import ModelConfig
from fastvideo.rewards.settings import RewardSettings
from fastvideo.sampling.mix import MixSettings
from fastvideo.sampling.settings import RolloutSettings
from fastvideo.settings import ObjectiveSettings, Settings

# (name, settings class), in the order their flags appear in --help and their settings are built.
COMPONENTS = (
    ("data", DataSettings), ("model", ModelConfig), ("reward", RewardSettings), ("rollout", RolloutSettings),
    ("grpo", GRPOSettings), ("nft", NFTSettings), ("mix", MixSettings), ("optim", OptimSettings),
    ("update", UpdateSettings), ("parallel", ParallelSettings), ("output", OutputSettings), ("eval", EvalSettings),
    ("lora", LoraSettings),
)
# The built-in objectives' own sections (their settings are components: always built).
BUILTIN_OBJECTIVES = {"grpo": "grpo", "nft": "nft"}
BUILTIN_FAMILIES = ("flux", "sd3")  # no section of their own


def add_component_flags(parser, plugins: tuple[tuple[str, type[Settings]], ...] = ()) -> None:
    """--algorithm, then every component's flags and the selected plugins' (``plugins``)."""
    from fastvideo.settings import flag_group

    flag_group(parser, "components").add_argument(
        "--algorithm", type=str, default="grpo",
        help='training objective: a registered name (grpo, nft: DiffusionNFT, docs/nft.md; awm: Advantage '
             'Weighted Matching; dgpo: DGPO; flash_grpo: Flash-GRPO, docs/objectives.md) or a plugin '
             '"pkg.module:Name"')
    for _, component in COMPONENTS + plugins:
        component.add_flags(parser)


def objective_factory_settings(algorithm: str) -> type[Settings] | None:
    """The settings class a non-built-in objective declares (None: it has no flags)."""
    from fastvideo.algorithms.registry import resolve_objective

    return getattr(resolve_objective(algorithm), "settings", None)


def family_factory_settings(family: str) -> type[Settings] | None:
    from fastvideo.models.registry import family_factory

    return getattr(family_factory(family), "settings", None)


def plugin_sections(algorithm: str, family: str, strict: bool = True) -> tuple[tuple[str, type[Settings]], ...]:
    """(section, settings class) of the selected plugin objective and family, in that order. A name
    that does not resolve raises its UserError, or with ``strict=False`` has no section (validating
    an already parsed configuration; building the run names the problem)."""
    found = []
    for name, builtin, lookup in ((algorithm, BUILTIN_OBJECTIVES, objective_factory_settings),
                                  (family, BUILTIN_FAMILIES, family_factory_settings)):
        if name in builtin:
            continue
        try:
            found.append(lookup(name))
        except UserError:
            if strict:
                raise
    out = []
    for cls in filter(None, found):
        name = cls.section
        if not name or name in dict(COMPONENTS) or name in dict(out):
            raise ConfigError(f"plugin settings {cls.__name__}: its section {name!r} must be a name of its own "
                              f"(not one of {', '.join(n for n, _ in COMPONENTS)})")
        out.append((name, cls))
    return tuple(out)


def objective_sections(algorithm: str, objective: ObjectiveSettings) -> tuple[set[str], dict[str, str]]:
    """(the built-in objective sections the selected objective reads: its own and those it shares,
    {every other built-in objective section: its objective's name})."""
    read = {BUILTIN_OBJECTIVES.get(algorithm, ""), *objective.shares}
    return read, {section: name for name, section in BUILTIN_OBJECTIVES.items() if section not in read}


def own_flags(cls: type[Settings]) -> list[str]:
    """The flags (dests) a settings class declares, in its order."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    cls.add_flags(parser)
    return [a.dest for a in parser._actions]


def unselected_note(cls: type[Settings], owner: str, args, defaults) -> list[str]:
    """One start-up note naming the flags of objective ``owner``'s section given to a run of another."""
    given = [f"--{d}" for d in own_flags(cls) if getattr(args, d) != getattr(defaults, d)]
    return [f"{', '.join(given)}: no effect without --algorithm {owner}"] if given else []


def objective_settings(algorithm: str, sections: dict, strict: bool = True) -> ObjectiveSettings:
    """The selected objective's own settings among the built ``sections`` (a plugin without flags:
    ObjectiveSettings' defaults; one that does not resolve: its UserError, or with ``strict=False``
    the defaults, building the run names the problem)."""
    if algorithm in BUILTIN_OBJECTIVES:
        return sections[BUILTIN_OBJECTIVES[algorithm]]
    try:
        cls = objective_factory_settings(algorithm)
    except UserError:
        if strict:
            raise
        return ObjectiveSettings()
    own = sections.get(cls.section) if cls is not None else None
    return own if isinstance(own, ObjectiveSettings) else ObjectiveSettings()


# ------------------------------------------------------------------ the file's layout
def add_top_level_views(cls: type) -> None:
    """Read-only attributes of ``cls`` (TrainConfig) for the fields of the sections config.json keeps at
    its top level (Settings.top_level): cfg.fsdp_strategy is cfg.parallel.fsdp_strategy."""
    for name, component in COMPONENTS:
        for f in fields(component) if component.top_level else ():
            setattr(cls, f.name, property(lambda self, s=name, k=f.name: getattr(getattr(self, s), k),
                                          doc=f"cfg.{name}.{f.name}"))


def flat_layout(tree: dict) -> dict:
    """TrainConfig's asdict in config.json's layout: the top-level sections' fields at the top."""
    out = dict(tree)
    for name, component in COMPONENTS:
        if component.top_level:
            out.update(out.pop(name))
    return out


def nested_layout(resolved: dict) -> dict:
    """config.json's layout back into one section per component (the inverse of flat_layout)."""
    out = dict(resolved)
    for name, component in COMPONENTS:
        if component.top_level and not isinstance(out.get(name), dict):
            keys = {f.name for f in fields(component)}
            out[name] = {k: out.pop(k) for k in list(out) if k in keys}
    return out
