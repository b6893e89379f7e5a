"""Prompt files, the RL prompt-embedding dataset and the group-aware distributed sampler."""

from fastvideo.data.dataset import (
    EmbeddingDatasetError,
    EmbeddingShapeError,
    ExpectedDims,
    PromptBatch,
    PromptEmbeddingDataset,
    collate_prompt_embeddings,
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
    "ExpectedDims",
    "GroupDistributedSampler",
    "PromptBatch",
    "PromptEmbeddingDataset",
    "PromptFileError",
    "PromptList",
    "collate_prompt_embeddings",
    "epoch_order_fn",
    "load_prompts",
    "repeat_first_epoch_order_fn",
    "seeded_permutation",
]
