"""The reward registry: ``--rewards NAME:WEIGHT`` for a registered reward, ``--rewards
pkg.module:Name:WEIGHT`` for a plugin (as ``--model_family`` and ``--algorithm`` take one).

The built-in rewards are registered here by module name and imported when first built, so that
``import fastvideo.rewards`` needs neither open_clip nor transformers. A reward module imports
``fastvideo.rewards.base`` and never this module: the registry and its implementations form no
import circle (tools/structure.py counts the module names written here as imports).

A plugin entry ``pkg.module:Name`` imports ``pkg.module`` first (it may call
:func:`register_reward` on import), then takes ``Name`` as a registered name or as a reward class
of the module. A registered name is taken once: registering another class under it is refused,
the same class again is a no-op. Its stored name (metrics, config.json) is the entry as written, so
every rank, a ``--config`` re-run and a resume import the same module.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from fastvideo.rewards.base import Reward, UnknownRewardError

RewardFactory = Callable[..., Reward]

# name -> "module:Class", imported on first use.
_BUILTIN: dict[str, str] = {
    "hpsv2": "fastvideo.rewards.hps:HPSv2Reward",
    "pickscore": "fastvideo.rewards.pickscore:PickScoreReward",
    "clip": "fastvideo.rewards.clip_score:ClipScoreReward",
    "compressibility": "fastvideo.rewards.compressibility:JpegCompressibilityReward",
    "detail": "fastvideo.rewards.image_stats:DetailReward",
    "saturation": "fastvideo.rewards.image_stats:SaturationReward",
    "aesthetic": "fastvideo.rewards.aesthetic:AestheticReward",
    "imagereward": "fastvideo.rewards.imagereward:ImageRewardReward",
    "clip_edit": "fastvideo.rewards.clip_edit:ClipEditReward",
    "videoalign": "fastvideo.rewards.videoalign:VideoAlignReward",
}
# name -> a class (or a function building a reward) registered by a plugin
_REGISTERED: dict[str, RewardFactory] = {}
# Arguments every reward of a run is offered (builders.reward_build_kwargs' common part); a plugin
# reward receives those its constructor takes.
COMMON_ARGS = ("device", "dtype", "batch_size")


def register_reward(name: str, factory: RewardFactory) -> None:
    """Make ``--rewards name:WEIGHT`` build ``factory(**kwargs)``. A name taken by a built-in
    reward or by another factory is refused (UnknownRewardError is not it: a ValueError naming
    both, raised at the plugin's import)."""
    taken = _REGISTERED.get(name)
    if name in _BUILTIN or (taken is not None and taken is not factory):
        owner = _BUILTIN.get(name) or _label(taken)
        raise ValueError(f"reward {name!r} is already registered (as {owner}); pick another name for {_label(factory)}")
    _REGISTERED[name] = factory


def _label(factory) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


def available_rewards() -> tuple[str, ...]:
    """Every registered name, built-in and plugin, sorted."""
    return tuple(sorted({*_BUILTIN, *_REGISTERED}))


def is_plugin_name(name: str) -> bool:
    """Whether ``name`` is a ``pkg.module:Name`` plugin entry (a registered name has no colon)."""
    return ":" in name


def check_reward_name(name: str) -> str:
    """``name`` when it names a registered reward or an importable plugin reward, else
    UnknownRewardError in one line (valid names and the plugin form)."""
    reward_class(name)
    return name


def reward_class(name: str) -> RewardFactory:
    """The class (or factory) of a registered name or of a ``pkg.module:Name`` plugin entry."""
    if is_plugin_name(name):
        return _plugin(name)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _BUILTIN:
        raise UnknownRewardError(f"unknown reward {name!r}; valid names: {', '.join(available_rewards())} "
                                 "(or a plugin as pkg.module:Name)")
    module, _, cls = _BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def _plugin(entry: str) -> RewardFactory:
    module_name, _, attr = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownRewardError(f"reward plugin {entry!r}: cannot import {module_name!r} ({exc}); put its folder on "
                                 f"PYTHONPATH; built-in rewards: {', '.join(sorted(_BUILTIN))}") from None
    factory = _REGISTERED.get(attr) or getattr(module, attr, None)
    if factory is None:
        raise UnknownRewardError(f"reward plugin {entry!r}: {module_name} has no {attr!r} and registers no reward of "
                                 f"that name (fastvideo.rewards.registry.register_reward)")
    if not callable(factory):
        raise UnknownRewardError(f"reward plugin {entry!r}: it is a {type(factory).__name__}, not a reward: name a "
                                 "class called as reward(images, prompts) -> FloatTensor[B] "
                                 "(e.g. a fastvideo.rewards.base.BatchedReward subclass)")
    return factory


def build_reward(name: str, **kwargs: Any) -> Reward:
    """Build a registered reward: ``build_reward("hpsv2", hps_ckpt_dir=..., device=...)``.

    Keyword arguments are checked against the reward's constructor first, so a typo fails with
    the list of accepted arguments instead of deep inside a model loader. A plugin reward is
    offered the common arguments (COMMON_ARGS) its constructor takes and must take the others."""
    cls = reward_class(name)
    params = inspect.signature(cls.__init__ if isinstance(cls, type) else cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = [p for p in params if p != "self"]
    if is_plugin_name(name) or name in _REGISTERED:
        kwargs = {k: v for k, v in kwargs.items() if k not in COMMON_ARGS or k in accepted or takes_any}
    unknown = [] if takes_any else sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"reward {name!r} does not take {unknown}; it accepts: {', '.join(accepted)}")
    reward = cls(**kwargs)
    if not callable(reward):
        raise UnknownRewardError(f"reward {name!r} built a {type(reward).__name__}, which cannot be called as "
                                 "reward(images, prompts)")
    return reward
