"""Reward models: ``reward(images, prompts) -> FloatTensor[B]``.

Build one with ``build_reward(name, **kwargs)`` (fastvideo.rewards.registry: the built-in names, and
plugins as ``pkg.module:Name`` or registered with ``register_reward``)
or several with ``build_multi_reward("hpsv2:1.0,pickscore:0.5", ...)``. Model classes live in
their modules (hps, pickscore, clip_score, compressibility) and are imported on first use.
"""

# Names are imported from their module on first use (PEP 562), so that importing a sub-module
# (rewards.settings, rewards.flags: the trainer's flags) does not load torch for --help.
from fastvideo.utils import lazy_getattr

_LAZY = {
    "group_normalize": "fastvideo.rewards.advantages",
    "OPENAI_CLIP_MEAN": "fastvideo.rewards.base",
    "OPENAI_CLIP_STD": "fastvideo.rewards.base",
    "BatchedReward": "fastvideo.rewards.base",
    "CheckpointError": "fastvideo.rewards.base",
    "ImageBatch": "fastvideo.rewards.base",
    "Reward": "fastvideo.rewards.base",
    "RewardInputError": "fastvideo.rewards.base",
    "UnknownRewardError": "fastvideo.rewards.base",
    "as_pils": "fastvideo.rewards.base",
    "as_tensor_list": "fastvideo.rewards.base",
    "available_rewards": "fastvideo.rewards.registry",
    "build_reward": "fastvideo.rewards.registry",
    "check_inputs": "fastvideo.rewards.base",
    "check_reward_name": "fastvideo.rewards.registry",
    "register_reward": "fastvideo.rewards.registry",
    "load_weights_only": "fastvideo.rewards.base",
    "pil_to_tensor": "fastvideo.rewards.base",
    "pils_to_tensor": "fastvideo.rewards.base",
    "reward_class": "fastvideo.rewards.registry",
    "tensor_to_pils": "fastvideo.rewards.base",
    "MultiReward": "fastvideo.rewards.combine",
    "MultiRewardOutput": "fastvideo.rewards.combine",
    "RewardSpec": "fastvideo.rewards.combine",
    "RewardSpecError": "fastvideo.rewards.combine",
    "build_multi_reward": "fastvideo.rewards.combine",
    "format_reward_spec": "fastvideo.rewards.combine",
    "legacy_reward_spec": "fastvideo.rewards.combine",
    "parse_reward_spec": "fastvideo.rewards.combine",
    "resolve_reward_specs": "fastvideo.rewards.combine",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


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
    "check_reward_name",
    "format_reward_spec",
    "group_normalize",
    "legacy_reward_spec",
    "load_weights_only",
    "parse_reward_spec",
    "pil_to_tensor",
    "pils_to_tensor",
    "register_reward",
    "resolve_reward_specs",
    "reward_class",
    "tensor_to_pils",
]
