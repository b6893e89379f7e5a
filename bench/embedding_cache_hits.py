"""How many embedding reads a rank's record cache answers, by cache policy, with the trainer's sampler.

    python bench/embedding_cache_hits.py [--epochs 13] [--measure_from 9] [--json P]

Each scenario: N prompts, W ranks, P prompts per rank per iteration, room for C records per rank
(--embedding_cache_mb / 4.2 MB for FLUX at 512 tokens), the default per-epoch reshuffle or DanceGRPO's
repeated first-epoch order (fastvideo.data.sampler). Rank 0's reads (every rank is alike) go through
fastvideo.data.cache.RecordCache (admit while there is room, keep: the trainer's policy) and through a
least-recently-used cache of the same room (the alternative it was chosen over); the share of reads
that hit is counted over epochs --measure_from .. --epochs - 1 (the caches warm up before).
A benchmark, not a test: its figures are quoted in fastvideo/data/cache.py and docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict

import torch

from fastvideo.data.cache import RecordCache
from fastvideo.data.sampler import GroupDistributedSampler, repeat_first_epoch_order_fn

# (name, prompts, ranks, prompts per rank, room in records, repeat the first epoch's order)
SCENARIOS = [
    ("tiny demo set, all fit", 8, 1, 8, 8, False),
    ("repeated order, 2000 prompts, 16 ranks, room 255", 2000, 16, 1, 255, True),
    ("repeated order, 8000 prompts, 16 ranks, room 255", 8000, 16, 1, 255, True),
    ("4000 prompts, 16 ranks, room for all", 4000, 16, 1, 4000, False),
    ("2000 prompts, 16 ranks, room 255", 2000, 16, 1, 255, False),
    ("1000 prompts, 1 rank, room 255", 1000, 1, 1, 255, False),
]


class LRU:
    """A least-recently-used cache of ``room`` records (the policy RecordCache was chosen over)."""

    def __init__(self, room: int):
        self.room, self.items = room, OrderedDict()

    def read(self, key) -> bool:
        if key in self.items:
            self.items.move_to_end(key)
            return True
        self.items[key] = None
        if len(self.items) > self.room:
            self.items.popitem(last=False)
        return False


def hit_rates(prompts, ranks, per_rank, room, repeat, epochs, measure_from) -> dict[str, float]:
    sampler = GroupDistributedSampler(prompts, 0, ranks, per_rank, sampler_seed=0,
                                      order_fn=repeat_first_epoch_order_fn(0) if repeat else None)
    record = {"x": torch.zeros(1, dtype=torch.uint8)}  # one byte a record: room C is C bytes
    kept, lru = RecordCache(room), LRU(room)
    reads = {"kept": 0, "lru": 0, "all": 0}
    for epoch in range(epochs):
        for position in range(sampler.iterations_per_epoch):
            for idx in sampler.batch_at(epoch, position):
                hit_kept = kept.get(idx) is not None
                if not hit_kept:
                    kept.put(idx, record)
                hit_lru = lru.read(idx)
                if epoch >= measure_from:
                    reads["all"] += 1
                    reads["kept"] += hit_kept
                    reads["lru"] += hit_lru
    return {"keep_admitted": reads["kept"] / reads["all"], "lru": reads["lru"] / reads["all"], "reads": reads["all"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=13)
    parser.add_argument("--measure_from", type=int, default=9)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args(argv)
    out = {}
    for name, *shape in SCENARIOS:
        out[name] = hit_rates(*shape, args.epochs, args.measure_from)
        r = out[name]
        print(f"{name:55s} kept {100 * r['keep_admitted']:5.1f}%  LRU {100 * r['lru']:5.1f}%  ({r['reads']} reads)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
