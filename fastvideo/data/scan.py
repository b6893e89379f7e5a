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
                                    "re-run the preprocessing into that folder (it resumes and writes the "
                                    "missing files)")
    try:
        t = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a truncated or foreign file: name it, whatever torch's reason
        raise EmbeddingDatasetError(f"prompt {idx}: {str(path)!r} is not a readable tensor file "
                                    f"({type(exc).__name__}); re-run the preprocessing") from None
    if not isinstance(t, torch.Tensor):
        raise EmbeddingDatasetError(f"prompt {idx}: {str(path)!r} holds a {type(t).__name__}, not a tensor")
    return t


def _check_prompt(dataset, idx: int, first_dims=None):
    """Prompt ``idx``'s files checked by its family (shapes; the same dims as prompt 0's
    ``first_dims``): (its dims, paths, tensors)."""
    family, root, entry = dataset.family, dataset.root, dataset.entries[idx]
    paths = {s.name: root / s.folder / entry[s.json_key] for s in family.storage}
    raw = {name: _header(path, idx) for name, path in paths.items()}
    try:
        return family.check_record(idx, raw, first_dims, str(root))[1], paths, raw
    except EmbeddingShapeError as exc:
        shapes = ", ".join(f"{p} {tuple(raw[n].shape)}" for n, p in paths.items())
        raise EmbeddingShapeError(f"{exc} (files: {shapes})") from None


def scan_embeddings(dataset, rank: int = 0, world_size: int = 1, threads: int = 8) -> ScanResult:
    """Check the files of prompts rank, rank + world_size, ... of a PromptEmbeddingDataset (each
    rank a share; the rank that finds a bad file fails the run) against the family's rules
    (``family.check_record``) and against prompt 0's dims; raise an EmbeddingDatasetError naming
    the first bad file. Header reads are I/O bound, so they run on ``threads`` threads."""
    from concurrent.futures import ThreadPoolExecutor

    start = time.perf_counter()
    first_dims = _check_prompt(dataset, 0)[0]
    mine = range(rank, len(dataset.entries), world_size)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for _ in pool.map(lambda i: _check_prompt(dataset, i, first_dims), mine):
            pass  # the first bad file raises here, in index order
    files = len(mine) * len(dataset.family.storage)
    return ScanResult(len(mine), files, time.perf_counter() - start, first_dims)
