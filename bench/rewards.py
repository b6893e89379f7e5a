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
aesthetic and imagereward run on make_tiny_reward's tiny random models (real file layouts).

    python bench/rewards.py --remote [--rewards hpsv2 compressibility] [--remote_batch_sizes 8 32]
                            [--encodings f32 u8 png]

instead times each reward in-process against the same reward served by
``python -m fastvideo.tools.reward_server`` (started here as a subprocess on 127.0.0.1, scoring at
the same batch size) through the remote: client, for each batch size and image encoding:
images/s both ways and their ratio (the server's overhead on loopback: encode, HTTP, decode),
and whether the scores are identical (f32 must be; u8/png score 8-bit images).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FASTVIDEO_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from fastvideo import devices  # noqa: E402
from fastvideo.rewards.registry import build_reward  # noqa: E402

def parse_args(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--rewards", nargs="+", default=["compressibility", "hpsv2"],
                    choices=["compressibility", "hpsv2", "aesthetic", "imagereward"])
    ap.add_argument("--hps_size", default="base", choices=["base", "tiny"],
                    help="base: ViT-B/16-sized random open_clip model; tiny: make_tiny_reward's")
    ap.add_argument("--num_images", type=int, default=16)
    ap.add_argument("--size", type=int, default=128, help="square image size in pixels")
    ap.add_argument("--batch_sizes", type=int, nargs="+", default=[4, 8, 16],
                    help="reward batch sizes compared with batch size 1")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per batch size (the best is kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--remote", action="store_true", help="in-process vs through a loopback reward server")
    ap.add_argument("--remote_batch_sizes", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--encodings", nargs="+", default=["f32", "u8", "png"], choices=["f32", "u8", "png"])
    ap.add_argument("--transfer", action="store_true",
                    help="the server's own cost: a reward that returns zeros, served in this process, "
                         "ms per image round trip for each --remote_batch_sizes and --encodings")
    return ap.parse_args(argv)


def reward_files(name: str, args, work: Path) -> dict:
    """Constructor kwargs pointing at random-weight files in the real layouts."""
    if name == "hpsv2":
        folder, model_name = hps_files(args.hps_size, work, args.seed)
        return {"hps_ckpt_dir": folder, "model_name": model_name}
    if name in ("aesthetic", "imagereward"):
        from fastvideo.tools.make_tiny_reward import make_tiny_reward

        tiny = make_tiny_reward(work / "tiny", args.seed)
        return ({"aesthetic_dir": tiny.aesthetic_dir, "clip_model_name": tiny.aesthetic_clip_name}
                if name == "aesthetic" else {"image_reward_dir": tiny.image_reward_dir})
    return {}


SERVER_FLAGS = {"hps_ckpt_dir": "--hps_ckpt_dir", "model_name": "--hps_model_name", "aesthetic_dir": "--aesthetic_dir",
                "clip_model_name": "--aesthetic_clip_name", "image_reward_dir": "--image_reward_dir"}


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
    if args.transfer:
        return main_transfer(args)
    if args.remote:
        return main_remote(args)
    device = devices.get_device()
    g = torch.Generator().manual_seed(args.seed)
    images = torch.rand(args.num_images, 3, args.size, args.size, generator=g)
    prompts = [f"a photo of object number {i}" for i in range(args.num_images)]
    batch_sizes = [1] + [bs for bs in args.batch_sizes if bs != 1]
    print(f"# {args.num_images} random {args.size}x{args.size} images, device {device} "
          f"({devices.device_name(device)}), torch threads {torch.get_num_threads()}, hps_size {args.hps_size}, "
          f"best of {args.repeats}\n")
    print("| reward | batch_size | seconds | images/s | vs batch 1 | max abs score diff vs batch 1 |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.rewards:
            kwargs = reward_files(name, args, Path(tmp))
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


def start_server(name: str, kwargs: dict, batch_size: int) -> tuple[subprocess.Popen, str]:
    """The reward server as a subprocess on a free loopback port; (process, base URL) once healthy."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "fastvideo.tools.reward_server", "--rewards", name, "--device", "cpu",
           "--batch_size", str(batch_size), "--port", str(port)]
    for key, value in kwargs.items():
        cmd += [SERVER_FLAGS[key], str(value)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(torch.get_num_threads()))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reward server exited: {proc.stderr.read()[-2000:]}")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("reward server did not start in 180 s")


def best_time(fn, repeats: int) -> tuple[float, torch.Tensor]:
    scores = fn()  # warm-up
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best, scores


def main_transfer(args) -> None:
    """Encode + HTTP + decode cost per image, with no model (uvicorn in a thread of this process)."""
    import threading

    import uvicorn

    from fastvideo.rewards.remote import RemoteReward
    from fastvideo.tools.reward_server import build_app

    images = torch.rand(args.num_images, 3, args.size, args.size, generator=torch.Generator().manual_seed(args.seed))
    prompts = ["p"] * args.num_images
    server = uvicorn.Server(uvicorn.Config(build_app({"zero": lambda im, p: torch.zeros(len(p))}),
                                           host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"# {args.num_images} images {args.size}x{args.size}, server in-process on 127.0.0.1:{port}\n")
    print("| encoding | batch | ms per image (round trip) |\n|---|---|---|")
    for enc in args.encodings:
        for bs in args.remote_batch_sizes:
            reward = RemoteReward(f"http://127.0.0.1:{port}/zero?encoding={enc}", batch_size=bs)
            seconds, _ = best_time(lambda: reward(images, prompts), args.repeats)
            print(f"| {enc} | {bs} | {seconds / args.num_images * 1e3:.1f} |", flush=True)
    server.should_exit = True


def main_remote(args) -> None:
    """In-process vs the same reward behind a loopback reward server, per batch size and encoding."""
    from fastvideo.rewards.remote import RemoteReward

    g = torch.Generator().manual_seed(args.seed)
    images = torch.rand(args.num_images, 3, args.size, args.size, generator=g)
    prompts = [f"a photo of object number {i}" for i in range(args.num_images)]
    print(f"# {args.num_images} random {args.size}x{args.size} images, CPU, torch threads {torch.get_num_threads()}, "
          f"hps_size {args.hps_size}, server on 127.0.0.1 (subprocess), best of {args.repeats}\n")
    print("| reward | batch | encoding | in-process img/s | remote img/s | remote / in-process | scores |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.rewards:
            kwargs = reward_files(name, args, Path(tmp))
            for bs in args.remote_batch_sizes:
                local = build_reward(name, device="cpu", batch_size=bs, **kwargs)
                t_local, ref = best_time(lambda: local(images, prompts), args.repeats)
                server, url = start_server(name, kwargs, bs)
                try:
                    for enc in args.encodings:
                        remote = RemoteReward(f"{url}/{name}?encoding={enc}", batch_size=bs)
                        t_remote, got = best_time(lambda: remote(images, prompts), args.repeats)
                        same = "identical" if torch.equal(got, ref) else f"max diff {float((got - ref).abs().max()):.1e}"
                        print(f"| {name} | {bs} | {enc} | {args.num_images / t_local:.1f} | "
                              f"{args.num_images / t_remote:.1f} | {t_local / t_remote:.2f} | {same} |", flush=True)
                finally:
                    server.terminate()
                    server.wait(30)


if __name__ == "__main__":
    main()
