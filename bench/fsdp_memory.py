"""Memory per rank with and without FSDP sharding, on 2 gloo ranks (CPU).

    python bench/fsdp_memory.py [--preset small] [--nproc 2]

For each strategy (none = DDP full replica, full = FSDP full shard) it launches the ranks with
torchrun, takes one AdamW step on the transformer and prints, per rank, the bytes it holds in
parameters + gradients + optimizer state (exact accounting of the training state), and the
process's peak resident memory (which also counts the Python/torch runtime).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(model_dir: str, strategy: str, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from fastvideo import devices
    from fastvideo.distributed.fsdp import wrap_model
    from fastvideo.models import flux

    info = devices.init_distributed()
    model = wrap_model(flux.load_transformer(model_dir), strategy=strategy, device=info.device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    inner = getattr(model, "module", model)
    dim = inner.config.joint_attention_dim
    g = torch.Generator().manual_seed(info.rank)
    out_t = model(hidden_states=torch.randn(1, 64, 64, generator=g), encoder_hidden_states=torch.randn(1, 16, dim, generator=g),
                  pooled_projections=torch.randn(1, inner.config.pooled_projection_dim, generator=g),
                  timestep=torch.tensor([0.5]), guidance=torch.tensor([3.5]), img_ids=flux.image_ids(16, 16),
                  txt_ids=flux.text_ids(16), return_dict=False)[0]
    out_t.square().mean().backward()
    opt.step()
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    held += sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    held += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    rec = {"rank": info.rank, "strategy": strategy, "state_bytes": held,
           "peak_rss_bytes": devices.peak_memory_bytes(info.device)}
    Path(out, f"{strategy}_{info.rank}.json").write_text(json.dumps(rec))
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
        env = dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
        rows = []
        for strategy in ("none", "full"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                   __file__, "--worker", str(model), strategy, tmp]
            subprocess.run(cmd, check=True, env=env, capture_output=True)
            rows += [json.loads(Path(tmp, f"{strategy}_{r}.json").read_text()) for r in range(args.nproc)]
    print(f"# {args.preset} preset, {args.nproc} gloo ranks, one AdamW step (fp32)\n")
    print("| strategy | rank | params+grads+AdamW state (MB) | peak RSS (MB) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['strategy']} | {r['rank']} | {r['state_bytes'] / 1e6:.1f} | {r['peak_rss_bytes'] / 1e6:.0f} |")
    none = sum(r["state_bytes"] for r in rows if r["strategy"] == "none") / args.nproc
    full = sum(r["state_bytes"] for r in rows if r["strategy"] == "full") / args.nproc
    print(f"\nsharded / replicated training state per rank: {full / none:.3f} (ideal {1 / args.nproc:.3f})")


if __name__ == "__main__":
    main()
