"""Reward models: ``reward(images, prompts) -> FloatTensor[B]``.

Build one with ``build_reward(name, **kwargs)`` (names: clip, compressibility, detail, hpsv2, pickscore, saturation)
or several with ``build_multi_reward("hpsv2:1.0,pickscore:0.5", ...)``. Model classes live in
their modules (hps, pickscore, clip_score, compressibility) and are imported on first use.
"""

from fastvideo.rewards.advantages import group_normalize
from fastvideo.rewards.base import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    BatchedReward,
    CheckpointError,
    ImageBatch,
    Reward,
    RewardInputError,
    UnknownRewardError,
    as_pils,
    as_tensor_list,
    available_rewards,
    build_reward,
    check_inputs,
    load_weights_only,
    pil_to_tensor,
    pils_to_tensor,
    reward_class,
    tensor_to_pils,
)
from fastvideo.rewards.combine import (
    MultiReward,
    MultiRewardOutput,
    RewardSpec,
    RewardSpecError,
    build_multi_reward,
    format_reward_spec,
    legacy_reward_spec,
    parse_reward_spec,
    resolve_reward_specs,
)

__all__ = [
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "BatchedReward",
    "CheckpointError",
    "ImageBatch",
    "MultiReward",
    "MultiRewardOutput",
    "Reward",
    "RewardInputError",
    "RewardSpec",
    "RewardSpecError",
    "UnknownRewardError",
    "as_pils",
    "as_tensor_list",
    "available_rewards",
    "build_multi_reward",
    "build_reward",
    "check_inputs",
    "format_reward_spec",
    "group_normalize",
    "legacy_reward_spec",
    "load_weights_only",
    "parse_reward_spec",
    "pil_to_tensor",
    "pils_to_tensor",
    "resolve_reward_specs",
    "reward_class",
    "tensor_to_pils",
]
