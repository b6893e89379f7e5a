"""Throughput of the checkpoint digests (sha256 per file, fastvideo.training.checkpoint.files).

    python bench/checkpoint_digest.py [--mb 512] [--repeats 5]

Writes a file of random bytes, then reports the best of ``repeats`` for: hashing bytes already in
memory, file_digest on the file (from the page cache: the save hashes what it has just written),
and folder_digests over two such files (two threads). Best-of, because a shared machine only
ever slows a run down. Extrapolation to FLUX.1-dev (11.9e9 parameters): docs/checkpoints.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None) -> None:
    from fastvideo.training.checkpoint.files import file_digest, folder_digests

    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    data = os.urandom(a.mb << 20)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in ("a", "b"):
            (folder / name).write_bytes(data)
        size = len(data) / 1e6
        memory = _best(lambda: hashlib.sha256(data).digest(), a.repeats)
        one = _best(lambda: file_digest(folder / "a"), a.repeats)
        two = _best(lambda: folder_digests(folder, ["a", "b"]), a.repeats)
    print(f"sha256 in memory:        {size / memory:7.0f} MB/s")
    print(f"file_digest, one file:   {size / one:7.0f} MB/s")
    print(f"folder_digests, 2 files: {2 * size / two:7.0f} MB/s ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
