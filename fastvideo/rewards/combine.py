"""Weighted combination of several rewards: ``--rewards "hpsv2:1.0,pickscore:0.5"``.

total = sum_k w_k * f(r_k), where f is the identity, or -- with per-group normalisation -- the
within-group standardisation (r - mean) / (std + eps) over groups of ``num_generations``
consecutive samples (the G samples of one prompt). Normalising first puts rewards of very
different scales (HPS ~0.3, PickScore ~20, compressibility ~-100) on one footing, so the weights
mean what they say. The raw per-reward scores are returned too, for logging.

A sample any reward scored NaN or infinity is dropped: :meth:`MultiReward.combine` logs the
reward and the samples, normalises each group over its kept samples and gives the dropped ones a
NaN total, from which the objective's advantages (0 for them, grpo.advantages) and the metrics
(``rewards/nonfinite_dropped``, training.metrics.reward_metrics) know them.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from fastvideo.errors import UserError
from fastvideo.rewards.advantages import finite_samples, group_normalize, mix_advantages
from fastvideo.rewards.base import ImageBatch, Reward, takes_sources
from fastvideo.rewards.registry import available_rewards, build_reward, check_reward_name


class RewardSpecError(UserError, ValueError):
    """A --rewards string that cannot be parsed."""


@dataclass(frozen=True)
class RewardSpec:
    """One --rewards entry. ``url`` is set for rewards scored elsewhere (kind remote or vlm,
    see rewards/remote.py); their name is the served reward's (``vlm/<model>`` for judges)."""

    name: str
    weight: float = 1.0
    kind: str = "local"  # local | remote | vlm
    url: str | None = None


def _parse_endpoint(item: str, spec: str) -> RewardSpec:
    from fastvideo.rewards.remote import split_endpoint_item

    try:
        endpoint, weight = split_endpoint_item(item)
    except ValueError as exc:
        raise RewardSpecError(f"{exc} (in --rewards {spec!r})") from None
    weight = 1.0 if weight is None else weight
    if not math.isfinite(weight):
        raise RewardSpecError(f"weight of reward {endpoint.name!r} must be finite; got {weight}")
    return RewardSpec(endpoint.name, weight, endpoint.kind, endpoint.url)


def _split_entry(item: str, spec: str) -> tuple[str, str | None]:
    """One local --rewards entry -> (name, weight text or None): ``name``, ``name:W``, a plugin
    ``pkg.module:Name`` or ``pkg.module:Name:W`` (two parts are a plugin when the first is no
    registered name and the second no number)."""
    parts = [p.strip() for p in item.split(":")]
    plugin = len(parts) in (2, 3) and parts[0] not in available_rewards() and not _is_number(parts[1])
    if plugin:
        parts = [f"{parts[0]}:{parts[1]}", *parts[2:]]
    if not parts[0] or len(parts) > 2 or (plugin and not all(parts[0].split(":"))):
        raise RewardSpecError(f"bad entry {item!r} in --rewards {spec!r}; use name:weight or pkg.module:Name:weight")
    return parts[0], (parts[1] if len(parts) == 2 else None)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _weight(name: str, text: str) -> float:
    if not _is_number(text):
        raise RewardSpecError(f"weight {text!r} of reward {name!r} is not a number")
    weight = float(text)
    if not math.isfinite(weight):
        raise RewardSpecError(f"weight of reward {name!r} must be finite; got {weight}")
    return weight


def parse_reward_spec(spec: str) -> list[RewardSpec]:
    """``"hpsv2:1.0,pickscore:0.5"`` -> [RewardSpec("hpsv2", 1.0), RewardSpec("pickscore", 0.5)].

    A bare name means weight 1.0. Names must be registered (or be an importable plugin,
    ``pkg.module:Name``: rewards.registry), appear once, and weights must be finite numbers, not
    all zero.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise RewardSpecError(
            f"--rewards must be a non-empty string like 'hpsv2:1.0,pickscore:0.5'; got {spec!r}"
        )
    specs: list[RewardSpec] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise RewardSpecError(f"empty entry in --rewards {spec!r} (stray comma?)")
        if item.partition(":")[0].strip() in ("remote", "vlm"):
            specs.append(_parse_endpoint(item, spec))
            if sum(s.name == specs[-1].name for s in specs) > 1:
                raise RewardSpecError(f"reward {specs[-1].name!r} appears twice in --rewards {spec!r}")
            continue
        name, weight_text = _split_entry(item, spec)
        check_reward_name(name)
        weight = 1.0 if weight_text is None else _weight(name, weight_text)
        if any(s.name == name for s in specs):
            raise RewardSpecError(f"reward {name!r} appears twice in --rewards {spec!r}")
        specs.append(RewardSpec(name, weight))
    if all(s.weight == 0.0 for s in specs):
        raise RewardSpecError(f"all reward weights are zero in {spec!r}: no training signal")
    return specs


def format_reward_spec(specs: Sequence[RewardSpec]) -> str:
    return ",".join(f"{s.kind + ':' + s.url if s.url else s.name}:{s.weight:g}" for s in specs)


def legacy_reward_spec(use_hpsv2: bool = False, use_pickscore: bool = False) -> list[RewardSpec]:
    """DanceGRPO's --use_hpsv2 / --use_pickscore flags as a spec (weight 1.0 each); [] if none."""
    specs = []
    if use_hpsv2:
        specs.append(RewardSpec("hpsv2", 1.0))
    if use_pickscore:
        specs.append(RewardSpec("pickscore", 1.0))
    return specs


def resolve_reward_specs(
    rewards: str | None, use_hpsv2: bool = False, use_pickscore: bool = False
) -> list[RewardSpec]:
    """--rewards wins; the legacy flags are accepted when they agree with it (or alone)."""
    legacy = legacy_reward_spec(use_hpsv2, use_pickscore)
    if rewards is None or not rewards.strip():
        return legacy
    specs = parse_reward_spec(rewards)
    names = {s.name for s in specs}
    conflicting = [s.name for s in legacy if s.name not in names]
    if conflicting:
        raise RewardSpecError(
            f"--use_{conflicting[0]} is set but --rewards {rewards!r} does not include "
            f"{conflicting[0]!r}; drop the legacy flag or add it to --rewards"
        )
    return specs


@dataclass
class MultiRewardOutput:
    total: torch.Tensor  # [B] float32: the weighted sum used for advantages
    raw: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B] unnormalised


class MultiReward:
    """Computes every component reward and their weighted (optionally normalised) sum.

    Args:
        components: (name, weight, reward) triples, in spec order.
        normalize: standardise each reward within its group before weighting.
        num_generations: group size G; required when normalize is True. Groups are consecutive
            samples, so a call must hold whole groups.
    """

    def __init__(
        self,
        components: Sequence[tuple[str, float, Reward]],
        normalize: bool = False,
        num_generations: int | None = None,
        eps: float = 1e-8,
        mix: str | None = None,
        frames=None,
    ) -> None:
        if not components:
            raise ValueError("MultiReward needs at least one reward")
        if normalize and (num_generations is None or num_generations < 2):
            raise ValueError(
                f"per-group normalisation needs num_generations >= 2; got {num_generations}"
            )
        if mix is not None and (num_generations is None or num_generations < 2):
            raise ValueError(f"--multi_reward_mix {mix} needs groups: num_generations >= 2")
        self.components = list(components)
        self.mix = mix  # MixGRPO's advantage_aggr / reward_aggr (--reward_mix, rewards/advantages.py), or None
        self.normalize = normalize
        self.num_generations = num_generations
        self.eps = eps
        # Which frames of a clip [B, F, 3, H, W] the image rewards score (rewards.video.FrameSelection,
        # --video_reward_frames; None: all); image batches [B, 3, H, W] never read it.
        self.frames = frames

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.components]

    def __call__(self, images: ImageBatch, prompts: Sequence[str], sources=None) -> MultiRewardOutput:
        return self.combine(self.score_raw(images, prompts, sources))

    def score_raw(self, images: ImageBatch, prompts: Sequence[str], sources=None) -> dict[str, torch.Tensor]:
        """name -> [B] float32 raw scores. Per sample, so it may be called on any slice of a
        batch (e.g. one rollout chunk) and the slices concatenated before :meth:`combine`.
        sources: the samples' source images [B, 3, H, W] (editing) or None, given to the rewards
        that take them (base.takes_sources) and to no other. Clips [B, F, 3, H, W] (a video family's)
        and clip rewards go through rewards.video.score (frames selected for image rewards, averaged)."""
        if (isinstance(images, torch.Tensor) and images.ndim == 5) or any(
                getattr(r, "takes_clips", False) for _, _, r in self.components):
            from fastvideo.rewards.frames import FrameSelection
            from fastvideo.rewards.video import score

            frames = self.frames or FrameSelection()
            return {name: score(reward, images, prompts, frames, sources).float() for name, _, reward in self.components}
        return {name: (reward(images, prompts, sources=sources) if takes_sources(reward) else
                       reward(images, prompts)).float() for name, _, reward in self.components}

    def mixed_advantages(self, raw: Mapping[str, torch.Tensor], trim_ratio: float = 0.0) -> torch.Tensor:
        """[B] advantages the MixGRPO way (self.mix), from raw scores of whole groups
        (trim_ratio: MixGRPO's --trimmed_ratio, rewards.advantages.group_normalize)."""
        weights = {name: weight for name, weight, _ in self.components}
        return mix_advantages(raw, weights, self.num_generations, self.mix, trim_ratio)

    def combine(self, raw: Mapping[str, torch.Tensor]) -> MultiRewardOutput:
        """Weighted (optionally group-normalised) sum of raw scores [B]; B must hold whole groups
        when normalising."""
        valid = finite_samples({name: raw[name] for name in self.names})
        dropping = not bool(valid.all())
        if dropping:
            warn_nonfinite(raw, self.names)
        total = None
        for name, weight, _ in self.components:
            scores = raw[name]
            if self.normalize:
                scores = group_normalize(scores, self.num_generations, self.eps, valid=valid if dropping else None)
            term = weight * scores
            total = term if total is None else total + term
        if dropping:  # NaN marks the dropped samples for the advantages and the metrics
            total = torch.where(valid, total, float("nan"))
        return MultiRewardOutput(total=total, raw=dict(raw))


def warn_nonfinite(raw: Mapping[str, torch.Tensor], names: Sequence[str]) -> None:
    """One line per reward that scored some samples NaN or inf, naming it and the samples (this
    rank's indices), on every rank (a rank's bad samples are its own)."""
    rank = os.environ.get("RANK", "0")
    for name in names:
        bad = (~torch.isfinite(raw[name])).nonzero().flatten().tolist()
        if bad:
            values = [float(raw[name][i]) for i in bad[:4]]
            print(f"[warning] [rank {rank}] reward {name!r} returned non-finite scores {values} for "
                  f"{len(bad)} of {raw[name].numel()} samples (indices {bad[:8]}): dropped from their "
                  "groups (advantage 0); see rewards/nonfinite_dropped in metrics.jsonl",
                  file=sys.stderr, flush=True)


def _endpoint_reward(spec: RewardSpec, kwargs: Mapping[str, Any], common: Mapping[str, Any]) -> Reward:
    """The client of a remote:/vlm: entry; of the common kwargs only batch_size applies."""
    kwargs = dict(kwargs)
    if "batch_size" in common:
        kwargs.setdefault("batch_size", common["batch_size"])
    if spec.kind == "remote":
        from fastvideo.rewards.remote import RemoteReward

        return RemoteReward(spec.url, **kwargs)
    from fastvideo.rewards.vlm import VLMJudgeReward

    return VLMJudgeReward(spec.url, **kwargs)


def build_multi_reward(
    spec: str | Sequence[RewardSpec],
    reward_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    common_kwargs: Mapping[str, Any] | None = None,
    normalize: bool = False,
    num_generations: int | None = None,
    mix: str | None = None,
    frames=None,
) -> MultiReward:
    """Build each reward of a spec with ``{**common_kwargs, **reward_kwargs[name]}``.

    common_kwargs is for what every reward takes (device, dtype, batch_size); reward_kwargs
    holds per-reward arguments (e.g. {"hpsv2": {"hps_ckpt_dir": ...}}); entries for rewards that
    are not in the spec are ignored.
    """
    specs = parse_reward_spec(spec) if isinstance(spec, str) else list(spec)
    reward_kwargs = reward_kwargs or {}
    components = []
    for s in specs:
        if s.url is not None:
            reward = _endpoint_reward(s, reward_kwargs.get(s.kind, {}), common_kwargs or {})
        else:
            kwargs = {**(common_kwargs or {}), **reward_kwargs.get(s.name, {})}
            reward = build_reward(s.name, **kwargs)
        components.append((s.name, s.weight, reward))
    return MultiReward(components, normalize=normalize, num_generations=num_generations, mix=mix, frames=frames)
