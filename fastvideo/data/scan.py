"""The start-up data scan: every file the embedding index names exists, is a tensor, and has the
shapes the model family expects (one L, D, P for all prompts), before any model loads.

A missing or wrong-shaped ``prompt_embed/N.pt`` would otherwise be found only when the sampler
draws it, hours into a run. The files are opened with ``torch.load(mmap=True, weights_only=True)``:
only the archive's index is read, not the tensor data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from fastvideo.models.base import EmbeddingDatasetError, EmbeddingShapeError


@dataclass(frozen=True)
class ScanResult:
    prompts: int
    files: int
    seconds: float
    dims: tuple  # the family's dims of prompt 0 (FLUX: (L, D, P))


def _header(path, idx: int) -> torch.Tensor:
    """The tensor of one stored file, memory-mapped (its data is not read)."""
    if not path.is_file():
        raise EmbeddingDatasetError(f"prompt {idx}: {str(path)!r} (named by the embedding index) is missing; "
                                    "re-run the preprocessing into that folder (it resumes and writes the missing files)")
    try:
        t = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a truncated or foreign file: name it, whatever torch's reason
        raise EmbeddingDatasetError(f"prompt {idx}: {str(path)!r} is not a readable tensor file "
                                    f"({type(exc).__name__}); re-run the preprocessing") from None
    if not isinstance(t, torch.Tensor):
        raise EmbeddingDatasetError(f"prompt {idx}: {str(path)!r} holds a {type(t).__name__}, not a tensor")
    return t


def scan_embeddings(dataset) -> ScanResult:
    """Check every prompt's files of a PromptEmbeddingDataset (its family's storage and shape
    rules, ``family.check_record``); raise an EmbeddingDatasetError naming the first bad file."""
    start = time.perf_counter()
    family, root = dataset.family, dataset.root
    first_dims = None
    for idx, entry in enumerate(dataset.entries):
        paths = {s.name: root / s.folder / entry[s.json_key] for s in family.storage}
        raw = {name: _header(path, idx) for name, path in paths.items()}
        try:
            _, dims = family.check_record(idx, raw, first_dims, str(root))
        except EmbeddingShapeError as exc:
            shapes = ", ".join(f"{p} {tuple(raw[n].shape)}" for n, p in paths.items())
            raise EmbeddingShapeError(f"{exc} (files: {shapes})") from None
        first_dims = first_dims or dims
    n = len(dataset.entries)
    return ScanResult(n, n * len(family.storage), time.perf_counter() - start, first_dims)
