"""Per-rank memory and checkpoint size: LoRA versus full fine-tuning, with and without the KL term.

    python bench/lora_memory.py [--preset small] [--nproc 2] [--iterations 2] [--rank 16]

Builds a random FLUX of the preset, encodes the tiny prompt set, then runs the real trainer under
torchrun (gloo, FSDP full shard, --mixed_precision bf16) in four modes: full, full + --kl_coef,
--use_lora, --use_lora + --kl_coef. Each rank reports the bytes it holds in model parameters
(trainable and frozen, its FSDP shards), in AdamW state, in the KL reference copy, and its peak
resident memory (CPU: the process's max RSS, which also counts torch, the VAE and the buffers
of the run); rank 0 reports the checkpoint size. Prints a markdown table. A benchmark, not a test.
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
MODES = {
    "full": [],
    "full + KL": ["--kl_coef", "0.1"],
    "LoRA": ["--use_lora"],
    "LoRA + KL": ["--use_lora", "--kl_coef", "0.1"],
}


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def child(argv: list[str], report: str) -> None:
    """One rank: set up, train, checkpoint, report."""
    import torch

    from fastvideo import devices
    from fastvideo.config import parse_config
    from fastvideo.training.trainer import Trainer

    cfg = parse_config(argv)
    trainer = Trainer(cfg, devices.init_distributed())
    trainer.setup()
    trainer.train()
    params = list(trainer.model.parameters())
    state = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.ndim > 0]
    ref = trainer.kl_reference
    ref_bytes = _bytes(ref.model.parameters()) if ref is not None and ref.model is not trainer.model else 0
    row = {
        "rank": devices.rank(),
        "trainable_mb": _bytes(p for p in params if p.requires_grad) / 2**20,
        "frozen_mb": _bytes(p for p in params if not p.requires_grad) / 2**20,
        "adam_mb": _bytes(state) / 2**20,
        "reference_mb": ref_bytes / 2**20,
        "peak_rss_mb": devices.peak_memory_bytes(trainer.device) / 2**20,
        "time_iteration_s": trainer.metrics.read()[-1]["time_iteration"],
    }
    if devices.rank() == 0:
        ckpt = Path(cfg.output.output_dir) / f"checkpoint-{cfg.optim.max_train_steps}"
        row["checkpoint_mb"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) / 2**20
        from fastvideo.training.checkpoint import files

        weights = files.stored_file(ckpt, files.LORA_FILE if cfg.lora.enabled else files.MODEL_FILE)
        row["weights_file_mb"] = weights.stat().st_size / 2**20
    with open(report, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    devices.barrier()
    devices.destroy_distributed()


def _prepare(work: Path, preset: str) -> tuple[Path, Path]:
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess
    from fastvideo.tools.make_tiny_flux import make_tiny_flux

    model = work / "flux"
    if not (model / "model_index.json").is_file():
        make_tiny_flux(model, preset=preset, seed=0)
    cfg = PreprocessConfig(model_path=str(model), prompt_file=str(ROOT / "assets" / "prompts_tiny.txt"),
                           output_dir=str(work / "emb"), max_sequence_length=32, batch_size=8,
                           dataloader_num_workers=0)
    return model, Path(run_preprocess(cfg).json_path)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16, help="--lora_rank (alpha = 2 x rank, as upstream's 128 / 256)")
    ap.add_argument("--work", default=None, help="folder for the model, embeddings and runs (default: a temp dir)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="lora_memory-"))
    model, data = _prepare(work, args.preset)
    env = dict(os.environ, FASTVIDEO_DEVICE=os.environ.get("FASTVIDEO_DEVICE", "cpu"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    rows = {}
    for name, extra in MODES.items():
        out = work / name.replace(" + ", "_").replace(" ", "")
        report = work / f"{out.name}.jsonl"
        report.unlink(missing_ok=True)
        argv = ["--data_json_path", str(data), "--pretrained_model_name_or_path", str(model), "--output_dir", str(out),
                "--rewards", "compressibility:1.0", "--h", str(args.size), "--w", str(args.size),
                "--sampling_steps", "4", "--eta", "0.5", "--num_generations", "2", "--use_group", "--ignore_last",
                "--train_batch_size", "1", "--rollout_batch_size", "2", "--train_micro_batch_size", "1",
                "--timestep_fraction", "0.5", "--mixed_precision", "bf16", "--max_train_steps", str(args.iterations),
                "--checkpointing_steps", str(args.iterations), "--save_images_every", "0",
                "--dataloader_num_workers", "0", "--lora_rank", str(args.rank), "--lora_alpha", str(2 * args.rank),
                *extra]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               str(Path(__file__).resolve()), "--child", str(report), *argv]
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{name} failed:\n{proc.stderr[-4000:]}")
        rows[name] = [json.loads(line) for line in report.read_text().splitlines()]
    print(f"preset {args.preset}, {args.nproc} gloo ranks, FSDP full shard, --mixed_precision bf16, "
          f"{args.size}x{args.size}, LoRA rank {args.rank} alpha {2 * args.rank}; per rank (max over ranks), MiB")
    print("| mode | trainable params | frozen params | AdamW state | KL reference copy | peak RSS | checkpoint | "
          "weights file | s/iteration |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rs in rows.items():
        top = {k: max(r[k] for r in rs) for k in rs[0] if k != "rank"}
        r0 = next(r for r in rs if r["rank"] == 0)
        print(f"| {name} | {top['trainable_mb']:.2f} | {top['frozen_mb']:.2f} | {top['adam_mb']:.2f} | "
              f"{top['reference_mb']:.2f} | {top['peak_rss_mb']:.0f} | {r0['checkpoint_mb']:.2f} | "
              f"{r0['weights_file_mb']:.2f} | {top['time_iteration_s']:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        child(sys.argv[3:], sys.argv[2])
    else:
        main()
