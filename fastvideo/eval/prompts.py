"""The held-out evaluation prompts: read, encoded once, and checked against the training set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


class EvalPromptError(ValueError):
    """The evaluation prompt set cannot be used as asked."""


@dataclass
class EvalPrompts:
    """P prompts with their FLUX text embeddings (on the CPU).

    embeds [P, Lt, D] T5 sequence embeddings; pooled [P, P'] CLIP pooled; text_ids [Lt, 3]."""

    captions: list[str]
    embeds: torch.Tensor
    pooled: torch.Tensor
    text_ids: torch.Tensor

    def __len__(self) -> int:
        return len(self.captions)

    @property
    def cond(self):
        """The prompts' Conditioning for the FLUX family (TensorConditioning of its tensors)."""
        from fastvideo.models.base import TensorConditioning

        return TensorConditioning({"prompt_embeds": self.embeds, "pooled": self.pooled}, {"text_ids": self.text_ids})


def _normalise(caption: str) -> str:
    return " ".join(caption.split()).casefold()


def check_no_overlap(eval_captions: list[str], train_captions: list[str]) -> None:
    """Refuse evaluation prompts that also appear in the training set (whitespace and case
    ignored): a held-out score measured on trained prompts says nothing about generalisation."""
    train = {_normalise(c) for c in train_captions}
    shared = [c for c in eval_captions if _normalise(c) in train]
    if shared:
        shown = "; ".join(repr(c) for c in shared[:3])
        raise EvalPromptError(
            f"{len(shared)} of {len(eval_captions)} evaluation prompts are also training prompts ({shown}"
            f"{' ...' if len(shared) > 3 else ''}); remove them from --eval_prompts (held-out prompts only)"
        )
    dupes = len(eval_captions) - len({_normalise(c) for c in eval_captions})
    if dupes:
        raise EvalPromptError(f"--eval_prompts holds {dupes} duplicate prompt(s); each prompt must appear once")


def _from_embedding_json(path: Path) -> EvalPrompts:
    from fastvideo.data.dataset import PromptEmbeddingDataset

    ds = PromptEmbeddingDataset(path)
    items = [ds[i] for i in range(len(ds))]
    return EvalPrompts([it[3] for it in items], torch.stack([it[0] for it in items]),
                       torch.stack([it[1] for it in items]), items[0][2])


def _encode_text_file(path: Path, model_dir: str, max_sequence_length: int, device) -> EvalPrompts:
    from fastvideo.data.prompts import load_prompts
    from fastvideo.data_preprocess.embeddings import encoding_dtype
    from fastvideo.models import flux

    captions = load_prompts(path).prompts
    device = torch.device(device)
    encoders = flux.load_text_encoders(model_dir, device=device, dtype=encoding_dtype(device))
    embeds, pooled, ids = [], [], None
    for start in range(0, len(captions), 8):
        e, p, ids = flux.encode_prompts(encoders, captions[start:start + 8], max_sequence_length)
        embeds.append(e.float().cpu())
        pooled.append(p.float().cpu())
    del encoders  # the text encoders are not needed again (T5-XXL alone is ~9 GB)
    from fastvideo import platform

    platform.empty_cache(device)
    return EvalPrompts(captions, torch.cat(embeds), torch.cat(pooled), ids.float().cpu())


def load_eval_prompts(path: str | Path, model_dir: str, max_sequence_length: int,
                      device: torch.device | str = "cpu") -> EvalPrompts:
    """A .json file is a preprocessed videos2caption.json (used as is); anything else is a text
    file of prompts, encoded with the text encoders of the FLUX folder ``model_dir``."""
    path = Path(path)
    if not path.is_file():
        raise EvalPromptError(f"--eval_prompts {str(path)!r} does not exist; pass a prompts .txt file "
                              "(e.g. assets/eval_prompts.txt) or a preprocessed videos2caption.json")
    if path.suffix == ".json":
        return _from_embedding_json(path)
    return _encode_text_file(path, model_dir, max_sequence_length, device)
