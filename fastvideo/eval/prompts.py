"""The held-out evaluation prompts: read, encoded once, and checked against the training set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.data.prompts import EvalPromptError, check_no_overlap, eval_captions  # noqa: F401 (re-exported)
from fastvideo.models.base import Conditioning


@dataclass
class EvalPrompts:
    """P prompts with their model family's Conditioning (on the CPU, per-sample tensors float32
    when encoded here) and its dims (what the family's check_record gives one stored record)."""

    captions: list[str]
    cond: Conditioning
    dims: tuple

    def __len__(self) -> int:
        return len(self.captions)


def _from_embedding_json(path: Path, family) -> EvalPrompts:
    from fastvideo.data.dataset import PromptEmbeddingDataset

    ds = PromptEmbeddingDataset(path, family=family)
    cond, captions = ds.stack([ds[i] for i in range(len(ds))])
    return EvalPrompts(captions, cond, ds.dims())


def _encode_text_file(path: Path, model_dir: str, max_sequence_length: int, device, family) -> EvalPrompts:
    from fastvideo.data.prompts import load_prompts
    from fastvideo.data_preprocess.embeddings import encoding_dtype

    from fastvideo.data_preprocess.sources import add_sources, check_prompt_sources

    plist = load_prompts(path)
    captions, images = plist.prompts, plist.images
    check_prompt_sources(str(path), len(captions), family)  # an editing family: held-out source images
    device = torch.device(device)
    encoders = family.load_text_encoders(model_dir, device=device, dtype=encoding_dtype(device))
    records = []
    for start in range(0, len(captions), 8):
        cond = family.encode_prompts(encoders, captions[start:start + 8], max_sequence_length)
        cond = add_sources(family, encoders, cond, images, list(range(start, min(start + 8, len(captions)))))
        records += [{k: t.float().cpu() for k, t in cond.record(i).items()} for i in range(len(cond))]
    del encoders  # the text encoders are not needed again (T5-XXL alone is ~9 GB)
    from fastvideo import devices

    devices.empty_cache(device)
    return EvalPrompts(captions, family.cond_from_tensors(records), family.check_record(0, records[0])[1])


def load_eval_prompts(path: str | Path, model_dir: str, max_sequence_length: int,
                      device: torch.device | str = "cpu", *, family) -> EvalPrompts:
    """A .json file is a preprocessed videos2caption.json (used as is); anything else is a text
    file of prompts, encoded with the text encoders of the model folder ``model_dir``. family: the
    prompts' ModelFamily."""
    path = Path(path)
    if not path.is_file():
        raise EvalPromptError(f"--eval_prompts {str(path)!r} does not exist; pass a prompts .txt file "
                              "(e.g. assets/eval_prompts.txt) or a preprocessed videos2caption.json")
    if path.suffix == ".json":
        return _from_embedding_json(path, family)
    return _encode_text_file(path, model_dir, max_sequence_length, device, family)
