"""The RL prompt-embedding dataset: DanceGRPO's videos2caption.json and the tensors beside it.

Layout (written by fastvideo.data_preprocess.embeddings)::

    ROOT/videos2caption.json          [{"prompt_embed_path", "text_ids", "pooled_prompt_embeds_path", "caption"}]
    ROOT/prompt_embed/{name}          T5 sequence embedding [L, D]   (D = transformer joint_attention_dim)
    ROOT/pooled_prompt_embeds/{name}  CLIP pooled embedding [P]      (P = transformer pooled_projection_dim)
    ROOT/text_ids/{name}              zeros [L, 3]  (DanceGRPO's own files hold one [3] row: expanded to [L, 3])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from fastvideo.errors import UserError

JSON_KEYS = ("prompt_embed_path", "text_ids", "pooled_prompt_embeds_path", "caption")
# json key -> folder holding the file it names
FOLDERS = {
    "prompt_embed_path": "prompt_embed",
    "pooled_prompt_embeds_path": "pooled_prompt_embeds",
    "text_ids": "text_ids",
}
PREPROCESS_HINT = (
    "run the preprocessing first: bash scripts/preprocess/preprocess_flux_rl_embeddings.sh "
    "(it writes data/rl_embeddings/videos2caption.json)"
)
MODEL_HINT = (
    "the embeddings were made with another text encoder — re-run preprocessing with --model_path "
    "pointing at this model"
)


class EmbeddingDatasetError(UserError, ValueError):
    """The embedding index or one of its files is missing or malformed."""


class EmbeddingShapeError(EmbeddingDatasetError):
    """The embeddings do not fit the transformer (or each other)."""


@dataclass(frozen=True)
class ExpectedDims:
    """What a transformer needs from the embeddings; None means "do not check"."""

    joint_attention_dim: int | None = None  # T5 width D
    pooled_projection_dim: int | None = None  # CLIP width P
    max_sequence_length: int | None = None  # L

    @classmethod
    def from_transformer_config(cls, config: Any, max_sequence_length: int | None = None) -> "ExpectedDims":
        """From a FluxTransformer2DModel config (the object or a dict like transformer/config.json)."""

        def get(key):
            return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)

        return cls(get("joint_attention_dim"), get("pooled_projection_dim"), max_sequence_length)


def _read_index(json_path: Path) -> list[dict]:
    if not json_path.is_file():
        raise EmbeddingDatasetError(f"embedding index {str(json_path)!r} does not exist: {PREPROCESS_HINT}")
    try:
        entries = json.loads(json_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise EmbeddingDatasetError(
            f"embedding index {str(json_path)!r} is not valid JSON ({exc}): re-run the preprocessing"
        ) from None
    if not isinstance(entries, list) or not entries:
        raise EmbeddingDatasetError(
            f"embedding index {str(json_path)!r} holds no prompt (expected a non-empty list): "
            f"check the prompts file and {PREPROCESS_HINT}"
        )
    for i, entry in enumerate(entries):
        missing = [k for k in JSON_KEYS if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise EmbeddingDatasetError(
                f"entry {i} of {str(json_path)!r} lacks {', '.join(missing)}: this is not a "
                f"videos2caption.json written by the FLUX preprocessing; {PREPROCESS_HINT}"
            )
    return entries


class PromptEmbeddingDataset(torch.utils.data.Dataset):
    """Items: (prompt_embed [L, D], pooled_prompt_embeds [P], text_ids [L, 3], caption), tensors as
    stored (bf16 from accelerators, fp32 from CPU), loaded on CPU with weights_only=True.

    ``expected`` (ExpectedDims, or a transformer config) is checked against the first item at
    construction, so a mismatch fails before any rollout.
    """

    def __init__(self, json_path: str | Path, expected: ExpectedDims | Mapping | Any | None = None):
        self.json_path = Path(json_path)
        self.root = self.json_path.parent
        self.entries = _read_index(self.json_path)
        self._dims: tuple[int, int, int] | None = None  # (L, D, P) of item 0
        if expected is not None:
            self.check(expected)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def captions(self) -> list[str]:
        return [e["caption"] for e in self.entries]

    def _load(self, idx: int, key: str) -> torch.Tensor:
        path = self.root / FOLDERS[key] / self.entries[idx][key]
        if not path.is_file():
            raise EmbeddingDatasetError(
                f"prompt {idx}: {str(path)!r} is missing; re-run the preprocessing into {str(self.root)!r} "
                "(it resumes and rewrites the missing files)"
            )
        t = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(t, torch.Tensor):
            raise EmbeddingDatasetError(f"prompt {idx}: {str(path)!r} holds a {type(t).__name__}, not a tensor")
        return t

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
        embed = self._load(idx, "prompt_embed_path")
        pooled = self._load(idx, "pooled_prompt_embeds_path")
        ids = self._load(idx, "text_ids")
        if embed.ndim != 2 or pooled.ndim != 1:
            raise EmbeddingShapeError(
                f"prompt {idx}: prompt_embed {tuple(embed.shape)} / pooled {tuple(pooled.shape)} should be "
                "[L, D] / [P] (one prompt per file); re-run the preprocessing"
            )
        if ids.shape == (3,):  # DanceGRPO's layout: one row, repeated over the sequence at use
            ids = ids.unsqueeze(0).expand(embed.shape[0], 3).clone()
        dims = (embed.shape[0], embed.shape[1], pooled.shape[0])
        if self._dims is None:
            self._dims = dims
        elif dims != self._dims or ids.shape != (dims[0], 3):
            raise EmbeddingShapeError(
                f"prompt {idx} has (L, D, P) = {dims} and text_ids {tuple(ids.shape)} but prompt 0 has "
                f"{self._dims}: {str(self.root)!r} mixes two preprocessing runs — re-run it into an empty folder"
            )
        return embed, pooled, ids, self.entries[idx]["caption"]

    def dims(self) -> tuple[int, int, int]:
        """(L, D, P) read from the first prompt's files."""
        if self._dims is None:
            self[0]
        assert self._dims is not None
        return self._dims

    def check(self, expected: ExpectedDims | Mapping | Any) -> None:
        """Raise EmbeddingShapeError when the embeddings do not fit ``expected``."""
        if not isinstance(expected, ExpectedDims):
            expected = ExpectedDims.from_transformer_config(expected)
        seq_len, width, pooled = self.dims()
        if expected.joint_attention_dim is not None and width != expected.joint_attention_dim:
            raise EmbeddingShapeError(
                f"prompt embeddings have width {width} but the transformer expects joint_attention_dim "
                f"{expected.joint_attention_dim}: {MODEL_HINT}"
            )
        if expected.pooled_projection_dim is not None and pooled != expected.pooled_projection_dim:
            raise EmbeddingShapeError(
                f"pooled prompt embeddings have width {pooled} but the transformer expects "
                f"pooled_projection_dim {expected.pooled_projection_dim}: {MODEL_HINT}"
            )
        if expected.max_sequence_length is not None and seq_len != expected.max_sequence_length:
            raise EmbeddingShapeError(
                f"prompt embeddings have {seq_len} tokens but {expected.max_sequence_length} are expected: "
                f"re-run preprocessing with --max_sequence_length {expected.max_sequence_length}"
            )

    def check_against_transformer(
        self, transformer_config: Mapping | Any, max_sequence_length: int | None = None
    ) -> None:
        """Check against a FluxTransformer2DModel config (object or dict); see ``check``."""
        self.check(ExpectedDims.from_transformer_config(transformer_config, max_sequence_length))
