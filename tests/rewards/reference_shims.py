"""Import shims for reference packages written against transformers 4.x, on the current library line.

image-reward 1.5 (the ImageReward parity reference) imports three helpers from
``transformers.modeling_utils`` that transformers 5 moved to ``transformers.pytorch_utils``
(``apply_chunking_to_forward``, ``prune_linear_layer``) or removed (``find_pruneable_heads_and_indices``,
used only when pruning attention heads). Re-exporting them lets scripts/install_reward_parity.sh
check that the reference installed on either line. Its BERT also calls ModuleUtilsMixin methods that
transformers 5 removed (``get_extended_attention_mask``, ``invert_attention_mask``, ``get_head_mask``),
so the parity itself runs on the recipe line only (tests/rewards/test_reward_imagereward_parity.py
says so when it skips). On transformers 4.x this does nothing.
"""

from __future__ import annotations


def _no_head_pruning(*args, **kwargs):
    raise NotImplementedError("head pruning is not part of the ImageReward scoring path")


def apply_transformers5_shims() -> bool:
    """Re-export the moved helpers into transformers.modeling_utils. Returns True if anything was added."""
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils

    added = False
    for name in ("apply_chunking_to_forward", "prune_linear_layer"):
        if not hasattr(modeling_utils, name):
            setattr(modeling_utils, name, getattr(pytorch_utils, name))
            added = True
    if not hasattr(modeling_utils, "find_pruneable_heads_and_indices"):
        modeling_utils.find_pruneable_heads_and_indices = _no_head_pruning
        added = True
    return added
