"""Batched rewards, before/after: one model call per image against batched calls.

    python bench/rewards.py [--rewards compressibility hpsv2] [--hps_size base|tiny]
                            [--num_images 16] [--size 128] [--batch_sizes 4 8 16] [--repeats 3]

Scores --num_images random images ([N, 3, size, size] in [0, 1], one prompt each) with every
reward built by fastvideo.rewards.base.build_reward at batch_size 1 (before: one image per model
call) and at each of --batch_sizes. Each batch size is warmed up once, then timed round-robin
(best of --repeats). Prints images/s, the speed-up over batch size 1 and the max abs difference
of the scores from batch size 1 (batching must not change them beyond float rounding, ~1e-5).

hpsv2 runs on a random-weight open_clip model written in HPSv2Reward's file layout
(open_clip_pytorch_model.bin, HPS_v2.1_compressed.pt and <model>.json in one folder):
  * --hps_size base: ViT-B/16-sized (embed 512; vision width 768, 12 layers, patch 16, 224 px;
    text width 512, 12 layers, 8 heads), large enough for batching to show; the real HPSv2.1
    is ViT-H-14, heavier still;
  * --hps_size tiny: make_tiny_reward's tiny model (for smoke runs; per-call overhead only).
compressibility encodes one JPEG per image whatever the batch size: expect about 1.0x.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FASTVIDEO_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from fastvideo import platform  # noqa: E402
from fastvideo.rewards.base import build_reward  # noqa: E402

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rewards", nargs="+", default=["compressibility", "hpsv2"],
                    choices=["compressibility", "hpsv2"])
    ap.add_argument("--hps_size", default="base", choices=["base", "tiny"],
                    help="base: ViT-B/16-sized random open_clip model; tiny: make_tiny_reward's")
    ap.add_argument("--num_images", type=int, default=16)
    ap.add_argument("--size", type=int, default=128, help="square image size in pixels")
    ap.add_argument("--batch_sizes", type=int, nargs="+", default=[4, 8, 16],
                    help="reward batch sizes compared with batch size 1")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per batch size (the best is kept)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def hps_files(size: str, work: Path, seed: int) -> tuple[Path, str]:
    from fastvideo.tools.make_tiny_reward import HPS_PRESETS, write_hps

    return write_hps(work / f"hps_{size}", seed, preset=size)[0], HPS_PRESETS[size][0]


def make_scorer(reward, batch_size: int, images: torch.Tensor, prompts: list[str]):
    def score() -> tuple[float, torch.Tensor]:
        reward.batch_size = batch_size  # BatchedReward splits every call into chunks of this size
        t0 = time.perf_counter()
        scores = reward(images, prompts)
        return time.perf_counter() - t0, scores

    return score


def main(argv=None) -> None:
    args = parse_args(argv)
    device = platform.get_device()
    g = torch.Generator().manual_seed(args.seed)
    images = torch.rand(args.num_images, 3, args.size, args.size, generator=g)
    prompts = [f"a photo of object number {i}" for i in range(args.num_images)]
    batch_sizes = [1] + [bs for bs in args.batch_sizes if bs != 1]
    print(f"# {args.num_images} random {args.size}x{args.size} images, device {device} "
          f"({platform.device_name(device)}), torch threads {torch.get_num_threads()}, hps_size {args.hps_size}, "
          f"best of {args.repeats}\n")
    print("| reward | batch_size | seconds | images/s | vs batch 1 | max abs score diff vs batch 1 |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.rewards:
            kwargs = {}
            if name == "hpsv2":
                folder, model_name = hps_files(args.hps_size, Path(tmp), args.seed)
                kwargs = {"hps_ckpt_dir": folder, "model_name": model_name}
            reward = build_reward(name, device=device, batch_size=1, **kwargs)
            runners = {bs: make_scorer(reward, bs, images, prompts) for bs in batch_sizes}
            scores = {bs: run()[1] for bs, run in runners.items()}  # warm-up
            # Round-robin over batch sizes, best time of each (load bursts spread over all).
            best = {bs: math.inf for bs in batch_sizes}
            for _ in range(args.repeats):
                for bs, run in runners.items():
                    best[bs] = min(best[bs], run()[0])
            for bs in batch_sizes:
                diff = float((scores[bs] - scores[1]).abs().max())
                print(f"| {name} | {bs} | {best[bs]:.3f} | {args.num_images / best[bs]:.1f} | "
                      f"{best[1] / best[bs]:.2f}x | {diff:.2e} |", flush=True)
            del reward, runners


if __name__ == "__main__":
    main()
