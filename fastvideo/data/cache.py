"""A byte-bounded cache of loaded records (name -> tensor) that keeps what it admitted.

The trainer asks the prompt dataset for the same prompts again and again (every epoch of the
sampler); without a cache each ask re-reads every stored tensor of the prompt from disk
(``torch.load``). ``RecordCache`` keeps the loaded, checked records of one process up to a byte
budget (``--embedding_cache_mb``): a record's size is the bytes of the distinct storages its
tensors hold; records are admitted while they fit and then kept, none evicted; a record that does
not fit the room left is simply not kept; a budget of 0 turns the cache off.

Why no eviction (least-recently-used or otherwise): the sampler hands a rank a fresh random share
of the prompts every epoch, so the chance that a prompt is asked for again here does not depend on
when it was last asked for. Any fixed set of C records of N then hits C / N of the reads, while LRU
keeps the prompts of the latest iterations, the ones the next epoch's permutation is least likely
to repeat soon, and under a repeating order (DanceGRPO's repeated first-epoch shuffle) larger than
the budget LRU hits nothing at all. Simulated with the trainer's sampler over epochs 9-12
(bench/embedding_cache_hits.py, bench/results/embedding_cache_hits.json): room for 255 of 1,000
prompts on 1 rank, 25.5% of reads hit instead of LRU's 3.8%; DanceGRPO's repeated order, 8,000
prompts on 16 ranks (500 a rank), room 255, 51.0% instead of 0%; 2,000 prompts on 16 ranks, room
255, 11.8% instead of 10.4%. When every prompt of a rank fits both hit 100%.

Thread-safe: the trainer loads a batch's prompts on ``--dataloader_num_workers`` threads.
"""

from __future__ import annotations

import threading
from typing import Hashable, Mapping

import torch

__all__ = ["RecordCache", "record_nbytes"]


def record_nbytes(record: Mapping[str, torch.Tensor]) -> int:
    """Host bytes a record holds: each distinct storage of its tensors once (a view of a larger
    tensor keeps the whole storage alive, so the storage is what counts)."""
    seen: dict[int, int] = {}
    for t in record.values():
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values())


class RecordCache:
    """key -> record, at most ``budget_bytes`` of them in all; admitted while they fit, then kept."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self._items: dict[Hashable, tuple[dict[str, torch.Tensor], int]] = {}
        self._lock = threading.Lock()
        self.nbytes = 0  # bytes of the records held now
        self.hits = 0
        self.misses = 0
        self.refused = 0  # records not kept: the room left was too small

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def keys(self) -> list:
        """The keys held, in the order they were admitted."""
        with self._lock:
            return list(self._items)

    def get(self, key: Hashable) -> dict[str, torch.Tensor] | None:
        """The record held under ``key`` (a new dict of the held tensors, so replacing an entry of
        it does not change the cache), or None."""
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            return dict(entry[0])

    def put(self, key: Hashable, record: Mapping[str, torch.Tensor]) -> bool:
        """Hold ``record`` under ``key`` if it fits the room left (a record already held under
        ``key`` gives its room back first). False, nothing changed, when the cache is off or the
        record does not fit: what is held stays held."""
        if not self.enabled:
            return False
        size = record_nbytes(record)
        with self._lock:
            old = self._items.get(key)
            room = self.budget_bytes - self.nbytes + (old[1] if old is not None else 0)
            if size > room:
                self.refused += 1
                return False
            if old is not None:
                self.nbytes -= old[1]
            self._items[key] = (dict(record), size)
            self.nbytes += size
        return True

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "refused": self.refused, "records": len(self),
                "bytes": self.nbytes, "budget_bytes": self.budget_bytes}
