"""The objective registry: ``--algorithm NAME`` or a plugin ``--algorithm pkg.module:Name``.

The built-in objectives (grpo, nft, awm, dgpo, flash_grpo) are registered here, imported when first asked for. A plugin
module is imported and ``Name`` (a factory ``factory(context) -> Objective``, usually the Objective
class itself) is used; a module may also call ``register_objective`` on import. A name is
registered once: another factory under a taken name is refused (the same factory again is a no-op).
"""

from __future__ import annotations

import importlib

from fastvideo.algorithms.base import Objective, ObjectiveContext, ObjectiveFactory
from fastvideo.errors import ConfigError

_REGISTRY: dict[str, ObjectiveFactory] = {}


def _builtin() -> None:
    if "grpo" in _REGISTRY:
        return
    from fastvideo.algorithms.grpo import GRPOObjective
    from fastvideo.algorithms.nft import NFTObjective
    from fastvideo.algorithms.awm.objective import AWMObjective
    from fastvideo.algorithms.dgpo.objective import DGPOObjective
    from fastvideo.algorithms.flash_grpo.objective import FlashGRPOObjective

    _REGISTRY.setdefault("grpo", GRPOObjective)
    _REGISTRY.setdefault("nft", NFTObjective)
    _REGISTRY.setdefault("awm", AWMObjective)
    _REGISTRY.setdefault("dgpo", DGPOObjective)
    _REGISTRY.setdefault("flash_grpo", FlashGRPOObjective)


def register_objective(name: str, factory: ObjectiveFactory) -> None:
    """ValueError when ``name`` is taken by another factory."""
    _builtin()
    taken = _REGISTRY.get(name)
    if taken is not None and taken is not factory:
        raise ValueError(f"objective {name!r} is already registered (as {_label(taken)}); pick another name for "
                         f"{_label(factory)}")
    _REGISTRY[name] = factory


def _label(factory) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


def resolve_objective(name: str) -> ObjectiveFactory:
    """A registered name or "pkg.module:Name" (imported; Name is the factory or class)."""
    _builtin()
    if ":" in name and name not in _REGISTRY:
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
