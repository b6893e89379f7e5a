"""The objective registry: ``--algorithm NAME`` or a plugin ``--algorithm pkg.module:Name``.

A plugin module is imported and ``Name`` (a factory ``factory(context) -> Objective``, usually
the Objective class itself) is used; a module may also call ``register_objective`` on import.
"""

from __future__ import annotations

import importlib

from fastvideo.algorithms.base import Objective, ObjectiveContext, ObjectiveFactory
from fastvideo.algorithms.grpo import GRPOObjective
from fastvideo.errors import ConfigError



def _nft(context: ObjectiveContext) -> Objective:
    from fastvideo.algorithms.nft import NFTObjective  # imported when chosen

    return NFTObjective(context)


_REGISTRY: dict[str, ObjectiveFactory] = {"grpo": GRPOObjective, "nft": _nft}


def register_objective(name: str, factory: ObjectiveFactory) -> None:
    _REGISTRY[name] = factory


def resolve_objective(name: str) -> ObjectiveFactory:
    """A registered name or "pkg.module:Name" (imported; Name is the factory or class)."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"--algorithm {name!r}: cannot load {attr!r} from module {module!r} ({exc})") from exc
        register_objective(name, factory)
    if name not in _REGISTRY:
        raise ConfigError(f"--algorithm {name!r} is unknown; registered: {', '.join(sorted(_REGISTRY))} "
                          "(or give a plugin as pkg.module:Name)")
    return _REGISTRY[name]


def build_objective(name: str, context: ObjectiveContext) -> Objective:
    return resolve_objective(name)(context)
