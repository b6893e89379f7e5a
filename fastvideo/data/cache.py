"""A bounded least-recently-used cache of loaded records (name -> tensor), by bytes.

The trainer asks the prompt dataset for the same prompts again and again (every epoch of the
sampler); without a cache each ask re-reads every stored tensor of the prompt from disk
(``torch.load``). ``RecordCache`` keeps the loaded, checked records of one process up to a byte
budget (``--embedding_cache_mb``): a record's size is the bytes of the distinct storages its
tensors hold; the least recently used records are evicted until a new one fits; a record larger
than the whole budget is not cached; a budget of 0 turns the cache off (nothing is kept).

Thread-safe: the trainer loads a batch's prompts on ``--dataloader_num_workers`` threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
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
    """key -> record, at most ``budget_bytes`` of them in all (least recently used evicted first)."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self._items: OrderedDict[Hashable, tuple[dict[str, torch.Tensor], int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0  # bytes of the records held now
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def keys(self) -> list:
        """The keys held, least recently used first."""
        with self._lock:
            return list(self._items)

    def get(self, key: Hashable) -> dict[str, torch.Tensor] | None:
        """The record held under ``key`` (now the most recently used; a new dict of the held
        tensors, so replacing an entry of it does not change the cache), or None."""
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return dict(entry[0])

    def put(self, key: Hashable, record: Mapping[str, torch.Tensor]) -> bool:
        """Hold ``record`` under ``key``, evicting the least recently used records until it fits.
        False (nothing held, nothing evicted) when the cache is off or the record alone exceeds
        the budget."""
        size = record_nbytes(record)
        if size > self.budget_bytes or not self.enabled:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            while self._items and self.nbytes + size > self.budget_bytes:
                _, (_, evicted) = self._items.popitem(last=False)
                self.nbytes -= evicted
                self.evictions += 1
            self._items[key] = (dict(record), size)
            self.nbytes += size
        return True

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "records": len(self),
                "bytes": self.nbytes, "budget_bytes": self.budget_bytes}
