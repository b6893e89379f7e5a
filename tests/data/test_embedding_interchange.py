"""Embedding folders are interchangeable with upstream DanceGRPO's, both ways.

Upstream's writer and reader (fastvideo/data_preprocess/preprocess_flux_embedding.py and
fastvideo/dataset/latent_flux_rl_datasets.py at 15cc71d) are re-implemented minimally from their
behaviour: the writer encodes a batch with diffusers' FluxPipeline.encode_prompt and saves, per
prompt i of the batch, prompt_embeds[i] [L, D], pooled_prompt_embeds[i] [P] and text_ids[i] — one
[3] row of the [L, 3] zeros encode_prompt returns — as str(index).pt, indexed by
videos2caption.json; the reader torch.loads the three files, the collate stacks them (text_ids
[B, 3]) and the trainer passes text_ids[b].repeat(L, 1) as the transformer's txt_ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fastvideo.data.dataset import PromptEmbeddingDataset
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)


def _upstream_read(json_path: Path) -> list[tuple]:
    root = json_path.parent
    items = []
    for e in json.loads(json_path.read_text()):
        load = lambda sub, name: torch.load(root / sub / name, map_location="cpu", weights_only=True)  # noqa: E731
        items.append((load("prompt_embed", e["prompt_embed_path"]),
                      load("pooled_prompt_embeds", e["pooled_prompt_embeds_path"]),
                      load("text_ids", e["text_ids"]), e["caption"]))
    return items


def _upstream_txt_ids(items: list[tuple]) -> list[torch.Tensor]:
    """The trainer's txt_ids of each sample of one collated batch."""
    text_ids = torch.stack([it[2] for it in items])  # latent_collate_function
    return [text_ids[b].repeat(items[b][0].shape[0], 1) for b in range(len(items))]


def _upstream_write(pipe, captions: list[str], out: Path, max_sequence_length: int) -> Path:
    for sub in ("prompt_embed", "pooled_prompt_embeds", "text_ids"):
        (out / sub).mkdir(parents=True)
    with torch.no_grad():
        embeds, pooled, text_ids = pipe.encode_prompt(prompt=captions, prompt_2=captions,
                                                      max_sequence_length=max_sequence_length)
    entries = []
    for i, caption in enumerate(captions):
        torch.save(embeds[i], out / "prompt_embed" / f"{i}.pt")
        torch.save(pooled[i], out / "pooled_prompt_embeds" / f"{i}.pt")
        torch.save(text_ids[i], out / "text_ids" / f"{i}.pt")
        entries.append({"prompt_embed_path": f"{i}.pt", "text_ids": f"{i}.pt",
                        "pooled_prompt_embeds_path": f"{i}.pt", "caption": caption})
    (out / "videos2caption.json").write_text(json.dumps(entries, indent=4))
    return out / "videos2caption.json"


def test_upstream_reads_what_the_preprocessing_writes(tiny_embeddings):
    ours = PromptEmbeddingDataset(tiny_embeddings, family=FLUX)
    theirs = _upstream_read(Path(tiny_embeddings))
    assert len(theirs) == len(ours)
    assert all(it[2].shape == (3,) for it in theirs)  # one row per prompt, as upstream writes
    for i, txt_ids in enumerate(_upstream_txt_ids(theirs[:2])):
        embed, pooled, ids, caption = ours[i]
        assert txt_ids.shape == ids.shape == (embed.shape[0], 3) and torch.equal(txt_ids, ids)
        assert torch.equal(theirs[i][0], embed) and torch.equal(theirs[i][1], pooled) and theirs[i][3] == caption
    # Why: the [L, 3] files written before would reach upstream's transformer as [L * L, 3].
    old = torch.zeros(embed.shape[0], 3)
    assert old.repeat(embed.shape[0], 1).shape != (embed.shape[0], 3)


def test_the_dataset_reads_what_upstream_writes(tiny_flux_dir, tiny_embeddings, tmp_path):
    from diffusers import FluxPipeline

    ours = PromptEmbeddingDataset(tiny_embeddings, family=FLUX)
    pipe = FluxPipeline.from_pretrained(tiny_flux_dir)
    json_path = _upstream_write(pipe, ours.captions[:3], tmp_path / "upstream", ours.dims()[0])
    theirs = PromptEmbeddingDataset(json_path, expected=pipe.transformer.config, family=FLUX)
    assert theirs.dims() == ours.dims() and theirs.captions == ours.captions[:3]
    cond, captions = theirs.stack([theirs[i] for i in range(3)])
    reference, _ = ours.stack([ours[i] for i in range(3)])
    assert cond["text_ids"].shape == reference["text_ids"].shape and torch.equal(cond["text_ids"],
                                                                                reference["text_ids"])
    # the same text encoders on the same captions (diffusers' encode_prompt vs this project's path)
    torch.testing.assert_close(cond["prompt_embeds"], reference["prompt_embeds"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cond["pooled"], reference["pooled"], rtol=1e-5, atol=1e-5)
