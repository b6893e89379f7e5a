"""Measured peak memory per rank of one GRPO iteration on the small preset (2 gloo ranks, CPU),
next to the memory model's prediction (python -m fastvideo.tools.cost_model --memory).

    python bench/memory_check.py [--configs full,none,full_ckpt,none_ckpt] [--json out.json]

Memory on CPU is the resident set (with glibc's mmap threshold fixed, see main): a rank's figure is its peak RSS over set-up and one iteration
minus its RSS just before set-up, after importing everything set-up imports (the Python / torch /
diffusers runtime is not the model's, as a CUDA or CANN context is not on an accelerator).
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

ROOT = Path(__file__).resolve().parents[1]
# The run: small preset at 256x256 (256 image + 32 text tokens), 8 samples per rank, fp32.
RUN_FLAGS = ["--h", "256", "--w", "256", "--sampling_steps", "4", "--use_group", "--num_generations", "8", "--train_batch_size", "1",
             "--rollout_batch_size", "4", "--train_micro_batch_size", "4", "--timestep_fraction", "0.5",
             "--mixed_precision", "no", "--use_ema"]
CONFIGS = {
    "full": ["--fsdp_sharding_strategy", "full"],
    "none": ["--fsdp_sharding_strategy", "none"],
    "full_ckpt": ["--fsdp_sharding_strategy", "full", "--gradient_checkpointing"],
    "none_ckpt": ["--fsdp_sharding_strategy", "none", "--gradient_checkpointing"],
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _import_runtime() -> None:
    """Import what set-up imports, so that the baseline holds the runtime and the growth is the run's."""
    import matplotlib.pyplot  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    from diffusers import AutoencoderKL, FluxTransformer2DModel  # noqa: F401
    from diffusers.optimization import get_scheduler  # noqa: F401

    import fastvideo.data.dataset  # noqa: F401
    import fastvideo.data.sampler  # noqa: F401
    import fastvideo.rewards.combine  # noqa: F401
    import fastvideo.sampling.rollout  # noqa: F401
    import fastvideo.training.builders  # noqa: F401
    import fastvideo.training.checkpoint  # noqa: F401
    import fastvideo.training.ema  # noqa: F401


def worker(out: str, argv: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from fastvideo import devices
    from fastvideo.config import parse_config
    from fastvideo.training.trainer import Trainer

    cfg = parse_config(argv)
    info = devices.init_distributed()
    trainer = Trainer(cfg, info)
    _import_runtime()
    before = rss_bytes()
    trainer.setup()
    setup_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainer.run_iteration()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(out, f"rank{info.rank}.json").write_text(json.dumps(
        {"rank": info.rank, "before": before, "setup_peak": setup_peak, "peak": peak}))
    devices.destroy_distributed()


def predicted(flags: list[str]) -> dict:
    import contextlib
    import io

    from fastvideo.tools.cost_model import main as cost_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ckpt = [] if "--gradient_checkpointing" in flags else ["--no-gradient_checkpointing"]
        cost_main(["--memory", "--json", "--model", "small", "--world_size", "2", "--device", "cpu", "--text_tokens", "32",
                   "--vae_precision", "auto", "--rewards", "compressibility:1.0", *ckpt,
                   *(f for f in flags if f != "--use_group")])  # the cost model always counts G per prompt
    return json.loads(buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1:])
        return
    sys.path.insert(0, str(ROOT))
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess
    from fastvideo.tools.make_tiny_flux import make_tiny_flux

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_flux(Path(tmp) / "m", preset="small", seed=0)
        pre = PreprocessConfig(model_path=str(model), prompt_file=str(ROOT / "assets" / "prompts_tiny.txt"),
                               output_dir=str(Path(tmp) / "emb"), max_sequence_length=32, batch_size=8,
                               dataloader_num_workers=0)
        json_path = run_preprocess(pre).json_path
        # glibc keeps freed blocks below its dynamic mmap threshold (which grows to 32 MB) in its heap,
        # so RSS would record the allocator's high-water mark, not the live tensors. A fixed 64 kB
        # threshold returns large blocks at free: RSS then follows the live bytes, as an accelerator's
        # allocator statistics (max_memory_allocated) do.
        env = dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
        for name in args.configs.split(","):
            out = Path(tmp) / name
            out.mkdir()
            flags = RUN_FLAGS + CONFIGS[name]
            argv = ["--pretrained_model_name_or_path", str(model), "--data_json_path", str(json_path),
                    "--output_dir", str(out / "run"), "--rewards", "compressibility:1.0", "--max_train_steps", "1",
                    "--checkpointing_steps", "100", "--save_images_every", "0", "--dataloader_num_workers", "0",
                    *flags]
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
                   "--worker", str(out), *argv]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"{name} failed:\n{r.stderr[-4000:]}")
            ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
            measured = max(x["peak"] - x["before"] for x in ranks)
            pred = predicted(flags)
            rows.append({"config": name, "measured": measured, "predicted": pred["peak_bytes"],
                         "ranks": ranks, "breakdown": pred["components"]})
    print("| config | measured peak - before (MB) | predicted (MB) | predicted / measured |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['measured'] / 1e6:.0f} | {r['predicted'] / 1e6:.0f} | "
              f"{r['predicted'] / r['measured']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
