"""PromptEmbeddingDataset with its record cache (cache_bytes; the trainer's --embedding_cache_mb):
files read once, items bit-identical to the uncached dataset's, bounded by the budget."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from fastvideo.data.dataset import PromptEmbeddingDataset
from fastvideo.models.flux.family import FluxFamily
from test_embedding_dataset import L, D, P, make_embeddings

FLUX = FluxFamily()
CAPTIONS = [f"prompt {i}" for i in range(5)]
RECORD_BYTES = (L * D + P + L * 3) * 2  # one bf16 record as the dataset holds it (text_ids [L, 3])


@pytest.fixture
def loads(monkeypatch):
    """The number of torch.load calls (each stored tensor of a prompt is one file)."""
    calls = []
    real = torch.load

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", counting)
    return calls


def two_passes(ds, loads) -> tuple[list[int], list[list[tuple]]]:
    counts, items = [], []
    for _ in range(2):
        before = len(loads)
        items.append([ds[i] for i in range(len(ds))])
        counts.append(len(loads) - before)
    return counts, items


def same(a: tuple, b: tuple) -> bool:
    return a[-1] == b[-1] and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a[:-1], b[:-1]))


def test_second_pass_reads_no_file_and_items_are_identical(tmp_path, loads):
    json_path, _ = make_embeddings(tmp_path, CAPTIONS, dtype=torch.bfloat16)
    plain = PromptEmbeddingDataset(json_path, family=FLUX)  # cache_bytes=0: off, as before
    cached = PromptEmbeddingDataset(json_path, family=FLUX, cache_bytes=2**20)
    plain_counts, plain_items = two_passes(plain, loads)
    cached_counts, cached_items = two_passes(cached, loads)
    assert plain_counts == [15, 15]  # 5 prompts x 3 files, every pass
    assert cached_counts == [15, 0]
    assert cached.cache.nbytes == 5 * RECORD_BYTES and len(cached.cache) == 5
    for pass_items in (*plain_items, *cached_items):
        assert all(same(a, b) for a, b in zip(plain_items[0], pass_items))
    cond_plain, caps = plain.stack(plain_items[1][1:4])
    cond_cached, caps_cached = cached.stack(cached_items[1][1:4])
    assert caps == caps_cached
    for k, t in cond_plain.to_tensors().items():
        assert torch.equal(t, cond_cached[k]) and t.dtype == cond_cached[k].dtype


def test_the_budget_bounds_what_is_kept(tmp_path, loads):
    json_path, _ = make_embeddings(tmp_path, CAPTIONS)  # fp32: 2 x RECORD_BYTES a record
    ds = PromptEmbeddingDataset(json_path, family=FLUX, cache_bytes=2 * 2 * RECORD_BYTES)  # two records
    counts, items = two_passes(ds, loads)
    # in order, with room for two of five: the first two admitted stay (an LRU cache would have
    # evicted every prompt before its second read: 15 loads again)
    assert counts == [15, 9] and len(ds.cache) == 2 and ds.cache.keys() == [0, 1]
    assert ds.cache.nbytes == 2 * 2 * RECORD_BYTES
    before = len(loads)
    ds[1], ds[0], ds[1]
    assert len(loads) == before  # the two admitted are held
    plain = PromptEmbeddingDataset(json_path, family=FLUX)
    assert all(same(plain[i], items[1][i]) for i in range(5))


def test_a_budget_under_one_record_reads_every_time(tmp_path, loads):
    json_path, _ = make_embeddings(tmp_path, CAPTIONS[:2], dtype=torch.bfloat16)
    ds = PromptEmbeddingDataset(json_path, family=FLUX, cache_bytes=RECORD_BYTES - 1)
    assert two_passes(ds, loads)[0] == [6, 6] and len(ds.cache) == 0


def test_dancegrpo_text_ids_are_cached_as_read(tmp_path, loads):
    """DanceGRPO's one-row text_ids [3] are expanded to [L, 3] by the family's check: the cache
    keeps the checked record, so a cached read equals a fresh one."""
    json_path, _ = make_embeddings(tmp_path, CAPTIONS[:2])
    for i in range(2):
        torch.save(torch.zeros(3), tmp_path / "text_ids" / f"{i}.pt")
    cached = PromptEmbeddingDataset(json_path, family=FLUX, cache_bytes=2**20)
    counts, items = two_passes(cached, loads)
    assert counts == [6, 0] and items[1][0][2].shape == (L, 3)
    plain = PromptEmbeddingDataset(json_path, family=FLUX)
    assert all(same(plain[i], items[1][i]) for i in range(2))


def test_threads_read_the_same_items(tmp_path, loads):
    """The trainer loads a batch on --dataloader_num_workers threads sharing the dataset's cache."""
    json_path, _ = make_embeddings(tmp_path, CAPTIONS, dtype=torch.bfloat16)
    cached = PromptEmbeddingDataset(json_path, family=FLUX, cache_bytes=2**20)
    plain = PromptEmbeddingDataset(json_path, family=FLUX)
    order = [i % 5 for i in range(40)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        items = list(pool.map(cached.__getitem__, order))
    assert all(same(plain[i], item) for i, item in zip(order, items))
    assert len(cached.cache) == 5 and cached.cache.nbytes == 5 * RECORD_BYTES
    assert cached.cache.hits + cached.cache.misses == 40 and cached.cache.misses >= 5

