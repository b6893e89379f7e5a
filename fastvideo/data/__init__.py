"""Prompt files, the RL prompt-embedding dataset and the group-aware distributed sampler."""

# Names are imported from their module on first use (PEP 562): fastvideo.data.settings (the
# trainer's flags) must not load torch for --help.
from fastvideo.utils import lazy_getattr

_LAZY = {
    "EmbeddingDatasetError": "fastvideo.data.dataset", "EmbeddingShapeError": "fastvideo.data.dataset",
    "PromptEmbeddingDataset": "fastvideo.data.dataset", "PromptFileError": "fastvideo.data.prompts",
    "PromptList": "fastvideo.data.prompts", "load_prompts": "fastvideo.data.prompts",
    "RecordCache": "fastvideo.data.cache", "GroupDistributedSampler": "fastvideo.data.sampler", "epoch_order_fn": "fastvideo.data.sampler",
    "repeat_first_epoch_order_fn": "fastvideo.data.sampler", "seeded_permutation": "fastvideo.data.sampler",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "EmbeddingDatasetError",
    "EmbeddingShapeError",
    "GroupDistributedSampler",
    "PromptEmbeddingDataset",
    "PromptFileError",
    "PromptList",
    "RecordCache",
    "epoch_order_fn",
    "load_prompts",
    "repeat_first_epoch_order_fn",
    "seeded_permutation",
]
