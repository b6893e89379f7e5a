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
        help='training objective: a registered name (grpo, nft: DiffusionNFT, docs/nft.md) or a plugin '
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


def objective_settings(algorithm: str, sections: dict) -> ObjectiveSettings:
    """The selected objective's own settings among the built ``sections`` (a plugin without flags:
    ObjectiveSettings' defaults)."""
    if algorithm in BUILTIN_OBJECTIVES:
        return sections[BUILTIN_OBJECTIVES[algorithm]]
    cls = objective_factory_settings(algorithm)
    own = sections.get(cls.section) if cls is not None else None
    return own if isinstance(own, ObjectiveSettings) else ObjectiveSettings()
