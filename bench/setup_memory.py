"""Peak memory of each rank while the transformer is loaded and wrapped for FSDP: the full copy per
rank (load, then shard) against the meta build filled unit by unit (fastvideo.models.sharded_load).

    python bench/setup_memory.py [--preset small] [--nproc 2]

CPU / gloo: memory is the process's resident set (peak from getrusage, minus the resident set just
before loading, after every import; glibc's mmap threshold fixed so that RSS follows live bytes); on
an accelerator the allocator's peak would be the measure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)

ROOT = Path(__file__).resolve().parents[1]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(model_dir: str, mode: str, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import FluxTransformer2DModel  # noqa: F401  (imported before the baseline)

    from fastvideo import devices
    from fastvideo.distributed.fsdp import wrap_model
    from fastvideo.models import flux, sharded_load

    info = devices.init_distributed()
    before = rss_bytes()
    if mode == "full_copy":
        model = wrap_model(flux.load_transformer(model_dir), "full", info.device)
    else:
        base, loader = sharded_load.meta_transformer(Path(model_dir) / "transformer", None, torch.float32, info.device,
                                                     FLUX)
        model = wrap_model(base, "full", info.device, param_init_fn=loader)
        loader.check_complete()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    shard = sum(p.numel() * p.element_size() for p in model.parameters())
    rec = {"rank": info.rank, "mode": mode, "rss_before": before, "peak": peak, "after": rss_bytes(), "shard": shard}
    Path(out, f"{mode}_{info.rank}.json").write_text(json.dumps(rec))
    devices.destroy_distributed()


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=["tiny", "small"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    sys.path.insert(0, str(ROOT))
    from fastvideo.tools.make_tiny_flux import make_tiny_flux

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_flux(Path(tmp) / "m", preset=args.preset, seed=0)
        full = sum(f.stat().st_size for f in (model / "transformer").glob("*.safetensors"))
        # A fixed glibc mmap threshold, so RSS follows live bytes (see bench/memory_check.py).
        env = dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
        rows = []
        for mode in ("full_copy", "sharded"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                   __file__, "--worker", str(model), mode, tmp]
            subprocess.run(cmd, check=True, env=env, capture_output=True)
            rows += [json.loads(Path(tmp, f"{mode}_{r}.json").read_text()) for r in range(args.nproc)]
    print(f"# {args.preset} preset, {args.nproc} gloo ranks, fp32 transformer file {full / 1e6:.1f} MB\n")
    print("| load | rank | RSS before (MB) | set-up peak (MB) | peak - before (MB) | shard held (MB) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['rank']} | {r['rss_before'] / 1e6:.0f} | {r['peak'] / 1e6:.0f} | "
              f"{(r['peak'] - r['rss_before']) / 1e6:.1f} | {r['shard'] / 1e6:.1f} |")
    growth = {m: max(r["peak"] - r["rss_before"] for r in rows if r["mode"] == m) for m in ("full_copy", "sharded")}
    print(f"\nlargest set-up growth per rank: full copy {growth['full_copy'] / 1e6:.1f} MB, sharded "
          f"{growth['sharded'] / 1e6:.1f} MB (ratio {growth['sharded'] / growth['full_copy']:.2f})")


if __name__ == "__main__":
    main()
