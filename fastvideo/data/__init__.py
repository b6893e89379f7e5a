"""Prompt files, the RL prompt-embedding dataset and the group-aware distributed sampler."""

from fastvideo.data.dataset import (
    EmbeddingDatasetError,
    EmbeddingShapeError,
    PromptEmbeddingDataset,
)
from fastvideo.data.prompts import PromptFileError, PromptList, load_prompts
from fastvideo.data.sampler import (
    GroupDistributedSampler,
    epoch_order_fn,
    repeat_first_epoch_order_fn,
    seeded_permutation,
)

__all__ = [
    "EmbeddingDatasetError",
    "EmbeddingShapeError",
    "GroupDistributedSampler",
    "PromptEmbeddingDataset",
    "PromptFileError",
    "PromptList",
    "epoch_order_fn",
    "load_prompts",
    "repeat_first_epoch_order_fn",
    "seeded_permutation",
]
