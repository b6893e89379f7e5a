"""Checkpoint save time and rank-0 peak host memory: --checkpoint_format gathered vs sharded.

    MALLOC_MMAP_THRESHOLD_=65536 python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        bench/checkpoint_save.py [--preset small] [--repeats 2] [--out DIR]

Each rank builds the preset's FLUX transformer (random weights), wraps it as training does (FSDP
full shard), takes one fused-AdamW step so the optimizer holds its state, keeps an EMA, and then
saves the same state in both formats, alternating, --repeats times each. Per save: wall time
(every rank returns), and on rank 0 the peak resident memory above the resident memory just
before the save (a thread reads /proc/self/statm every millisecond). glibc's mmap threshold is
pinned (MALLOC_MMAP_THRESHOLD_) so freed tensors leave the resident set, as in
bench/memory_check.py. Prints a table; a benchmark, not a test. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRss:
    """The largest resident set size seen while the block runs, sampled every millisecond."""

    def __enter__(self):
        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def build(preset: str, device):
    from diffusers import FluxTransformer2DModel

    from fastvideo import devices
    from fastvideo.distributed import fsdp
    from fastvideo.tools.make_tiny_flux import PRESETS, transformer_config
    from fastvideo.training.ema import EMA

    torch.manual_seed(0)
    model = fsdp.wrap_model(FluxTransformer2DModel.from_config(transformer_config(PRESETS[preset])), "full", device)
    opt = torch.optim.AdamW(fsdp.trainable_parameters(model), lr=1e-4, **devices.adamw_kernel_kwargs(device))
    for p in fsdp.trainable_parameters(model):  # one step's worth of state without a forward
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt, EMA(model, decay=0.99)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: a temporary one)")
    args = ap.parse_args()
    from fastvideo import devices
    from fastvideo.distributed import fsdp
    from fastvideo.training.checkpoint import _broadcast_from_rank0, save_checkpoint

    info = devices.init_distributed()
    model, opt, ema = build(args.preset, info.device)
    out = str(args.out or tempfile.mkdtemp(prefix="ckpt_bench_")) if devices.rank() == 0 else None
    out = Path(_broadcast_from_rank0(out))  # rank 0's folder (a file system every rank sees)
    numel = sum(p.numel() for p in fsdp.trainable_parameters(model)) * devices.world_size()
    rows = {"gathered": [], "sharded": []}
    for i in range(args.repeats):
        for fmt in rows:
            devices.barrier()
            with PeakRss() as mem:
                t0 = time.perf_counter()
                path = save_checkpoint(out / fmt, i + 1, model, opt, None, ema, extra_state={},
                                       sharded=fmt == "sharded", keep_last=1)
                seconds = time.perf_counter() - t0
            rows[fmt].append((seconds, mem.peak - mem.base))
    if devices.rank() == 0:
        size = sum(f.stat().st_size for f in path.parent.parent.glob("sharded/checkpoint-*/**/*") if f.is_file())
        print(f"preset {args.preset}: {numel / 1e6:.1f} M trainable parameters (fp32), {devices.world_size()} ranks, "
              f"{args.repeats} saves per format; sharded checkpoint {size / 2**20:.0f} MiB")
        print(f"{'format':<10}{'save s (median)':>17}{'rank-0 peak above baseline MiB (max)':>40}")
        for fmt, r in rows.items():
            print(f"{fmt:<10}{statistics.median(s for s, _ in r):>17.2f}{max(m for _, m in r) / 2**20:>40.0f}")
    devices.destroy_distributed()


if __name__ == "__main__":
    main()
