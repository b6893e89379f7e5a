"""MixGRPO's reward flags on top of ours, and its two ways of mixing several rewards.

    --reward_model multi_reward --hps_weight 1 --image_reward_weight 1 --pick_score_weight 1
    --multi_reward_mix advantage_aggr|reward_aggr [--unified_reward_url http://host:port]

becomes a --rewards spec (:func:`mixgrpo_specs`) with MixGRPO's rewards and its weights divided
by their sum (as MixGRPO does), and advantages computed as MixGRPO does
(:func:`fastvideo.rewards.advantages.mix_advantages`),
with G the group size and std the unbiased sample std (torch's default, which MixGRPO uses):

- ``advantage_aggr``: A = sum_k w_k * (r_k - mean_g(r_k)) / (std_g(r_k) + 1e-8)
  (each reward's advantages per group, then their weighted sum; not normalised again);
- ``reward_aggr``:    R = sum_k w_k * r_k, A = (R - mean_g(R)) / (std_g(R) + 1e-8).

Both are then clipped to +-adv_clip_max by the trainer, as MixGRPO clips in its loss. Both need
--use_group (MixGRPO refuses advantage_aggr without it; reward_aggr without groups is not
provided here). A judge that fails raises (MixGRPO scored a failed sample 0 and went on).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rewards.combine imports torch: not needed to build the parser
    from fastvideo.rewards.combine import RewardSpec

# rewards.advantages.MIX_MODES (that module imports torch; tests/rewards check the two agree).
MIX_MODES = ("advantage_aggr", "reward_aggr")

# MixGRPO's --reward_model choices -> its reward names, in its order.
REWARD_MODELS = {
    "hpsv2": ("hpsv2",),
    "image_reward": ("image_reward",),
    "clip_score": ("clip_score",),
    "pick_score": ("pick_score",),
    "unified_reward": ("unified_reward",),
    "hpsv2_clip_score": ("hpsv2", "clip_score"),
    "multi_reward": ("hpsv2", "image_reward", "pick_score", "unified_reward"),
}
# MixGRPO reward -> (our reward name, its weight flag)
OURS = {
    "hpsv2": ("hpsv2", "hps_weight"),
    "image_reward": ("imagereward", "image_reward_weight"),
    "clip_score": ("clip", "clip_score_weight"),
    "pick_score": ("pickscore", "pick_score_weight"),
    "unified_reward": ("vlm", "unified_reward_weight"),
}


def add_mixgrpo_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("MixGRPO reward flags (mapped onto --rewards, see rewards/mix.py)")
    g.add_argument("--reward_model", type=str, default=None, choices=sorted(REWARD_MODELS),
                   help="MixGRPO's reward selection; instead of --rewards")
    g.add_argument("--multi_reward_mix", type=str, default=None, choices=MIX_MODES,
                   help="how to mix rewards into advantages (default with --reward_model: advantage_aggr)")
    for _, flag in OURS.values():
        g.add_argument(f"--{flag}", type=float, default=1.0, help="MixGRPO weight (weights are divided by their sum)")
    g.add_argument("--unified_reward_url", type=str, default=None,
                   help="UnifiedReward server root(s), comma-separated (rank r uses URL r mod n); served "
                        "as vlm:URL/v1?model=--unified_reward_model")
    g.add_argument("--unified_reward_model", type=str, default="UnifiedReward",
                   help="model name the UnifiedReward server expects (MixGRPO sends 'UnifiedReward')")


def mixgrpo_specs(args: argparse.Namespace) -> "list[RewardSpec]":
    """--reward_model and the weight flags -> RewardSpecs with normalised weights; [] without
    --reward_model. unified_reward is included when --unified_reward_url is given (required
    when it is the only reward). Several judge servers stay listed in the spec's url, comma-separated:
    which one a rank asks is chosen when the reward is built (training.builders.rank_reward_specs),
    so the configuration is the same on every rank."""
    from fastvideo.rewards.combine import RewardSpec

    if args.reward_model is None:
        if args.multi_reward_mix is not None:
            raise ValueError("--multi_reward_mix needs --reward_model (MixGRPO's reward selection)")
        return []
    names = list(REWARD_MODELS[args.reward_model])
    if "unified_reward" in names and not args.unified_reward_url:
        if args.reward_model == "unified_reward":
            raise ValueError("--reward_model unified_reward needs --unified_reward_url http://host:port")
        names.remove("unified_reward")
    weights = {n: getattr(args, OURS[n][1]) for n in names}
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"MixGRPO reward weights {weights} must have a positive sum")
    specs = []
    for n in names:
        ours, _ = OURS[n]
        if ours == "vlm":
            urls = [u.strip().rstrip("/") for u in args.unified_reward_url.split(",") if u.strip()]
            url = ",".join(f"{u}/v1?model={args.unified_reward_model}" for u in urls)
            specs.append(RewardSpec(f"vlm/{args.unified_reward_model}", weights[n] / total, "vlm", url))
        else:
            specs.append(RewardSpec(ours, weights[n] / total))
    return specs
