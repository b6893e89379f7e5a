"""The RL prompt-embedding dataset: DanceGRPO's videos2caption.json and the tensors beside it.

Layout (written by fastvideo.data_preprocess.embeddings; names from the model family's
``storage``)::

    ROOT/videos2caption.json     [{<json key of each stored tensor>: file name, ..., "caption"}]
    ROOT/<folder>/{name}         one stored tensor of one prompt

FLUX: prompt_embed/ (T5 sequence embedding [L, D]), pooled_prompt_embeds/ (CLIP pooled [P]),
text_ids/ (zeros: one [3] row as upstream DanceGRPO writes it, or [L, 3] as this project's folders
before held; both are read as [L, 3]).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from fastvideo.data.cache import RecordCache
from fastvideo.models.base import Conditioning, EmbeddingDatasetError, EmbeddingShapeError, ModelFamily

__all__ = ["EmbeddingDatasetError", "EmbeddingShapeError", "PromptEmbeddingDataset"]


def preprocess_hint(family: str) -> str:
    """How to make ``family``'s embeddings: its launcher in scripts/preprocess/ (one per built-in
    family, each writing data/rl_embeddings[_FAMILY]/ by default), or the preprocessing module for a
    plugin family."""
    from fastvideo.models.catalog import names, wiring

    if family in names():  # the built-in families (a plugin may register another name: it has no launcher)
        folder = f"data/rl_embeddings{wiring(family).suffix}"
        return (f"run the preprocessing first: bash scripts/preprocess/preprocess_{family}_rl_embeddings.sh "
                f"(it writes {folder}/videos2caption.json)")
    return ("run the preprocessing first: torchrun --nproc_per_node N -m fastvideo.data_preprocess.preprocess_embeddings "
            "--model_family pkg.module:Name --model_path DIR --prompt_dir PROMPTS --output_dir DIR")


def _check_family(json_path: Path, entry, family_name: str, json_keys: Sequence[str]) -> None:
    """Refuse an index whose keys are exactly another registered family's (embeddings made for
    another model family: their tensors would not fit this one, or fit silently wrong)."""
    from fastvideo.models.registry import family_for_json_keys

    if not isinstance(entry, dict) or set(entry) == set(json_keys):
        return
    other = family_for_json_keys(entry)
    if other is not None and other != family_name:
        raise EmbeddingDatasetError(
            f"embedding index {str(json_path)!r} was written for model family {other!r} (its keys: "
            f"{', '.join(entry)}), not {family_name!r}: re-run the preprocessing with --model_family {family_name} "
            f"into another folder, or train with --model_family {other}")


def _read_index(json_path: Path, json_keys: Sequence[str], family_name: str = "") -> list[dict]:
    hint = preprocess_hint(family_name)
    if not json_path.is_file():
        raise EmbeddingDatasetError(f"embedding index {str(json_path)!r} does not exist: {hint}")
    try:
        entries = json.loads(json_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise EmbeddingDatasetError(
            f"embedding index {str(json_path)!r} is not valid JSON ({exc}): re-run the preprocessing"
        ) from None
    if not isinstance(entries, list) or not entries:
        raise EmbeddingDatasetError(
            f"embedding index {str(json_path)!r} holds no prompt (expected a non-empty list): "
            f"check the prompts file and {hint}"
        )
    _check_family(json_path, entries[0], family_name, json_keys)
    for i, entry in enumerate(entries):
        missing = [k for k in json_keys if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise EmbeddingDatasetError(
                f"entry {i} of {str(json_path)!r} lacks {', '.join(missing)}: this is not a "
                f"videos2caption.json written by the preprocessing; {hint}"
            )
        # Every value is a file name or the caption: a number or a list would fail later as a TypeError.
        wrong = [f"{k}={entry[k]!r:.40}" for k in json_keys if not isinstance(entry[k], str)]
        if wrong:
            raise EmbeddingDatasetError(
                f"entry {i} of {str(json_path)!r} has {', '.join(wrong)} where a string (a file name, the "
                f"caption) belongs; {hint}")
    return entries


class PromptEmbeddingDataset(torch.utils.data.Dataset):
    """Items: (the family's stored tensors in ``family.storage`` order, caption) — FLUX:
    (prompt_embed [L, D], pooled_prompt_embeds [P], text_ids [L, 3], caption) — tensors as stored
    (bf16 from accelerators, fp32 from CPU), loaded on CPU with weights_only=True.

    ``expected`` (a transformer config, or what the family's check_dims takes) is checked against
    the first item at construction, so a mismatch fails before any rollout. family: the
    ModelFamily whose records these are. cache_bytes: keep up to this many bytes of loaded, checked
    records in this process (fastvideo.data.cache; the trainer's --embedding_cache_mb), so a prompt
    asked for again is not read from disk again; 0 (the default): read every time.

    Cached records are handed out as they are, without a copy per read: the one caller that reads
    many times, the trainer (load_prompts -> stack), passes them to the family's cond_from_tensors,
    which torch.stack's (copies) the per-prompt tensors and keeps one prompt's shared tensors (FLUX's
    text_ids, the negative prompt's embeddings) by reference; nothing on the rollout and update path
    writes into a conditioning tensor in place (tests/training/test_embedding_cache_reads.py checks
    the cached tensors are unchanged after training iterations). A caller that edits an item in
    place must clone it first.
    """

    def __init__(self, json_path: str | Path, expected: Mapping | Any | None = None, *, family: ModelFamily,
                 cache_bytes: int = 0):
        self.family = family
        self.cache = RecordCache(cache_bytes)
        self.json_path = Path(json_path)
        self.root = self.json_path.parent
        self.entries = _read_index(self.json_path, self.family.json_keys, self.family.name)
        self._dims: tuple | None = None  # the family's dims of item 0 (FLUX: (L, D, P))
        if expected is not None:
            self.check(expected)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def captions(self) -> list[str]:
        return [e["caption"] for e in self.entries]

    def _load(self, idx: int, json_key: str, folder: str) -> torch.Tensor:
        path = self.root / folder / self.entries[idx][json_key]
        if not path.is_file():
            raise EmbeddingDatasetError(
                f"prompt {idx}: {str(path)!r} is missing; re-run the preprocessing into {str(self.root)!r} "
                "(it resumes and rewrites the missing files)"
            )
        t = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(t, torch.Tensor):
            raise EmbeddingDatasetError(f"prompt {idx}: {str(path)!r} holds a {type(t).__name__}, not a tensor")
        return t

    def record(self, idx: int) -> dict[str, torch.Tensor]:
        """Prompt ``idx``'s stored tensors by Conditioning name, checked by the family (from the
        cache when it holds them; they are not to be modified in place)."""
        cached = self.cache.get(idx)  # None when off or not held
        if cached is not None:
            return cached
        raw = {s.name: self._load(idx, s.json_key, s.folder) for s in self.family.storage}
        rec, dims = self.family.check_record(idx, raw, self._dims, str(self.root))
        if self._dims is None:
            self._dims = dims
        self.cache.put(idx, rec)  # kept only while the budget has room (nothing when off)
        return rec

    def __getitem__(self, idx: int) -> tuple:
        rec = self.record(idx)
        return (*(rec[s.name] for s in self.family.storage), self.entries[idx]["caption"])

    def stack(self, items: Sequence[tuple]) -> tuple[Conditioning, list[str]]:
        """Items (as __getitem__ returns them) -> (the family's Conditioning of them, captions)."""
        names = [s.name for s in self.family.storage]
        records = [dict(zip(names, it[:-1])) for it in items]
        return self.family.cond_from_tensors(records), [it[-1] for it in items]

    def dims(self) -> tuple:
        """The family's dims read from the first prompt's files (FLUX: (L, D, P))."""
        if self._dims is None:
            self[0]
        assert self._dims is not None
        return self._dims

    def check(self, expected: Mapping | Any) -> None:
        """Raise EmbeddingShapeError when the embeddings do not fit ``expected`` (a transformer
        config, or the family's expected-dims record)."""
        self.family.check_dims(self.dims(), expected)

    def check_against_transformer(
        self, transformer_config: Mapping | Any, max_sequence_length: int | None = None
    ) -> None:
        """Check against a transformer config (object or dict); see ``check``."""
        self.family.check_dims(self.dims(), transformer_config, max_sequence_length)
