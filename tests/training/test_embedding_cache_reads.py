"""The trainer's prompt embeddings are read from disk once (--embedding_cache_mb; fastvideo.data.cache),
and training does not write into the cached tensors (the dataset hands them out without a copy)."""

from __future__ import annotations

import pytest
import torch

from helpers import single_process_trainer, train_args
from fastvideo.data.dataset import PromptEmbeddingDataset


@pytest.fixture
def loads(monkeypatch):
    calls = []
    real = torch.load

    def counting(*args, **kwargs):
        if not kwargs.get("mmap"):  # the start-up scan memory-maps each file: its data is not read
            calls.append(str(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", counting)
    return calls


def _run(tiny_flux_dir, tiny_embeddings, out, loads, monkeypatch, **flags):
    """(trainer, torch.load calls of the embedding files in its set-up and each of 2 iterations):
    8 prompts of the tiny demo set per iteration, on 2 loader threads."""
    root = str(tiny_embeddings.parent)
    trainer = single_process_trainer(train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=2,
                                                save_images_every=0, train_batch_size=8, rollout_batch_size=4,
                                                train_micro_batch_size=4, dataloader_num_workers=2, **flags),
                                     monkeypatch)
    per_iteration = [sum(p.startswith(root) for p in loads)]
    for _ in range(2):
        before = len(loads)
        trainer.run_iteration()
        per_iteration.append(sum(p.startswith(root) for p in loads[before:]))
    return trainer, per_iteration


def test_embedding_files_are_read_once(tiny_flux_dir, tiny_embeddings, tmp_path, loads, monkeypatch):
    trainer, reads = _run(tiny_flux_dir, tiny_embeddings, tmp_path / "cached", loads, monkeypatch)
    cache = trainer.dataset.cache
    assert cache.budget_bytes == 1024 * 2**20  # the default --embedding_cache_mb
    # the set-up reads prompt 0 (the shape check against the transformer; the start-up scan only
    # memory-maps the files), the first iteration the other 7 (3 files each),
    # the second iteration none
    assert reads == [3, 21, 0]
    assert len(cache) == 8 and cache.misses == 8 and cache.hits == 1 + 8
    # two iterations of rollout, rewards and update left every cached tensor as the files hold it
    plain = PromptEmbeddingDataset(tiny_embeddings, family=trainer.family)
    for i in range(8):
        held, fresh = cache.get(i), plain.record(i)
        assert held.keys() == fresh.keys()
        assert all(held[k].dtype == fresh[k].dtype and torch.equal(held[k], fresh[k]) for k in fresh)
    # what the trainer sees (its Conditioning of a batch) is bit-identical to the uncached reads
    cond, captions = trainer.load_prompts([5, 0, 3])
    ref, ref_captions = plain.stack([plain[i] for i in (5, 0, 3)])
    assert captions == ref_captions
    for k, t in ref.to_tensors().items():
        assert cond[k].dtype == t.dtype and torch.equal(cond[k], t)


def test_cache_off_reads_every_iteration(tiny_flux_dir, tiny_embeddings, tmp_path, loads, monkeypatch):
    trainer, reads = _run(tiny_flux_dir, tiny_embeddings, tmp_path / "plain", loads, monkeypatch,
                          embedding_cache_mb=0)
    assert reads == [3, 24, 24] and not trainer.dataset.cache.enabled and len(trainer.dataset.cache) == 0


def test_sd3_with_guidance_leaves_the_cached_tensors_as_read(tiny_sd3_dir, sd3_sp_embeddings, tmp_path,
                                                            loads, monkeypatch):
    """SD3.5 with classifier-free guidance: the negative prompt's embeddings are shared tensors of
    the Conditioning (one prompt's, by reference); two iterations leave the cached ones as read."""
    trainer, reads = _run(tiny_sd3_dir, sd3_sp_embeddings, tmp_path / "sd3", loads, monkeypatch, model_family="sd3",
                          guidance_scale=4.5, flow_grpo_sampling=True, eta=0.7, fsdp_sharding_strategy="none")
    files = len(trainer.family.storage)  # 4 a prompt: with the negative prompt's embeddings and pooled
    assert files == 4 and reads == [files, 7 * files, 0]
    plain = PromptEmbeddingDataset(sd3_sp_embeddings, family=trainer.family)
    for i in range(8):
        held, fresh = trainer.dataset.cache.get(i), plain.record(i)
        assert held.keys() == fresh.keys() and {"neg_prompt_embeds", "neg_pooled"} <= set(held)
        assert all(held[k].dtype == fresh[k].dtype and torch.equal(held[k], fresh[k]) for k in fresh)
