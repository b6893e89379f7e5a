"""Per-iteration time, MFU and host-sync count of the tiny model, with each hot-loop option on and off.

    python bench/options_table.py [--device cpu|cuda|npu] [--iterations 3] [--json OUT.json]
        [--model_dir DIR --data_json PATH]   (default: a tiny FLUX and its embeddings made here)

One process on the device (what one lent GPU or NPU has): the trainer of the real entry point,
one warm-up iteration, then the median of --iterations timed iterations per variant, and one more
iteration under fastvideo.perf.syncs.SyncCounter (syncs in the step loops and in total) and under
torch's FlopCounterMode (the FLOPs MFU divides by: everything executed, recompute included).
Variants: the default, and each option that changes a single process's hot loop (--adamw_kernel
foreach / loop, --mixed_precision bf16). The FSDP options (--fsdp_param_dtype bf16,
--fsdp_forward_prefetch) act only with 2 or more ranks: docs/performance.md has their CPU
figures from 2 gloo ranks. MFU needs the device's peak (fastvideo.perf.flops.peak_tflops_for);
on the CPU it is "n/a". A benchmark, not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS = [
    ("default", []),
    ("adamw foreach", ["--adamw_kernel", "foreach"]),
    ("adamw loop", ["--adamw_kernel", "loop"]),
    ("bf16 autocast", ["--mixed_precision", "bf16"]),
]


def tiny_inputs(work: Path) -> tuple[Path, Path]:
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess
    from fastvideo.tools.make_tiny_flux import make_tiny_flux

    model = make_tiny_flux(work / "tiny_flux", preset="tiny", seed=0)
    cfg = PreprocessConfig(model_path=str(model), prompt_file=str(ROOT / "assets" / "prompts_tiny.txt"),
                           output_dir=str(work / "emb"), max_sequence_length=32, batch_size=8,
                           dataloader_num_workers=0)
    return model, Path(run_preprocess(cfg).json_path)


def flags(model: Path, data: Path, out: Path, iterations: int, extra: list[str]) -> list[str]:
    return ["--pretrained_model_name_or_path", str(model), "--data_json_path", str(data), "--output_dir", str(out),
            "--rewards", "compressibility:1.0", "--h", "32", "--w", "32", "--sampling_steps", "4", "--eta", "0.7",
            "--use_group", "--num_generations", "4", "--rollout_batch_size", "4", "--train_micro_batch_size", "2",
            "--timestep_fraction", "0.6", "--learning_rate", "1e-3", "--mixed_precision", "no",
            "--max_train_steps", str(iterations + 3), "--checkpointing_steps", "1000", "--save_images_every", "0",
            "--dataloader_num_workers", "0", "--seed", "42", *extra]


def measure(argv: list[str], iterations: int) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from fastvideo import devices
    from fastvideo.config import parse_config
    from fastvideo.perf.flops import peak_tflops_for
    from fastvideo.perf.syncs import STEP_PHASES, SyncCounter
    from fastvideo.train_grpo_flux import build_trainer

    cfg = parse_config(argv)
    trainer = build_trainer(cfg, devices.init_distributed())
    trainer.run_iteration()  # warm-up
    seconds = []
    for _ in range(iterations):
        devices.synchronize(trainer.device)
        t0 = time.perf_counter()
        trainer.run_iteration()
        devices.synchronize(trainer.device)
        seconds.append(time.perf_counter() - t0)
    with SyncCounter() as counter:
        trainer.run_iteration()
    with FlopCounterMode(display=False) as flops:
        trainer.run_iteration()
    s = statistics.median(seconds)
    peak = peak_tflops_for(devices.device_name(trainer.device))
    phases = counter.by_phase()
    return {"seconds_per_iteration": s, "flops": flops.get_total_flops(),
            "mfu": flops.get_total_flops() / (s * peak * 1e12) if peak else None,
            "syncs": counter.total(), "syncs_in_step_loops": sum(phases[p] for p in STEP_PHASES),
            "syncs_by_phase": dict(phases)}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="default: FASTVIDEO_DEVICE or the device layer's choice")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--model_dir", type=Path, default=None)
    ap.add_argument("--data_json", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    if args.device:
        os.environ["FASTVIDEO_DEVICE"] = args.device
    work = Path(tempfile.mkdtemp(prefix="options_table_"))
    model, data = (args.model_dir, args.data_json) if args.model_dir else tiny_inputs(work)
    rows = {}
    for name, extra in VARIANTS:
        rows[name] = measure(flags(model, data, work / name.replace(" ", "_"), args.iterations, extra),
                             args.iterations)
    base = rows["default"]["seconds_per_iteration"]
    print(f"{'variant':<16}{'s/it':>9}{'vs default':>12}{'MFU':>8}{'syncs':>7}{'in loops':>10}")
    for name, r in rows.items():
        mfu = f"{100 * r['mfu']:.2f}%" if r["mfu"] is not None else "n/a"
        print(f"{name:<16}{r['seconds_per_iteration']:>9.3f}{r['seconds_per_iteration'] / base:>12.3f}{mfu:>8}"
              f"{r['syncs']:>7}{r['syncs_in_step_loops']:>10}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
