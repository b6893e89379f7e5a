"""Wall time to the same reward gain: DanceGRPO (all SDE) vs MixGRPO vs Flash vs Flow-GRPO-Fast.

    python bench/mix_learning.py [--modes full mixgrpo flash fast] [--seeds 1 2] [--iterations 30]

The tiny demo task (scripts/demo/grpo_tiny_cpu.sh's settings: tiny FLUX, 64x64, 8 steps, G = 8,
JPEG-compressibility reward, lr 3e-3, clip 0.2) on one CPU process. For each mode and seed it
records the reward per iteration and the CPU seconds per iteration (run it with
OMP_NUM_THREADS=1: one-thread CPU time does not grow when other jobs share the machine), then prints the gain (mean of the
last 5 iterations minus the first 5), the seconds per iteration, and the wall time until the
5-iteration moving average first reaches TARGET = --target_share x the mean gain of the full-SDE
runs above the run's own first-5 mean. Mean and spread over seeds. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration import build_inputs  # noqa: E402  (sets the CPU environment)

WINDOW = ["--training_strategy", "part", "--group_size", "2", "--iters_per_group", "5", "--sample_strategy",
          "progressive", "--prog_overlap", "--prog_overlap_step", "1", "--roll_back"]
MODES = {
    "full": [],
    "mixgrpo": WINDOW,
    "flash": WINDOW + ["--dpm_algorithm_type", "dpmsolver++", "--dpm_post_compress_ratio", "0.4",
                       "--dpm_solver_order", "2", "--dpm_solver_type", "midpoint"],
    "fast": ["--sde_steps", "2", "--sde_start", "random"],
}


def run(model: Path, data: Path, out: Path, mode: str, seed: int, iterations: int) -> list[dict]:
    from fastvideo import platform
    from fastvideo.config import parse_config
    from fastvideo.training.trainer import GRPOTrainer

    argv = [
        "--data_json_path", str(data), "--pretrained_model_name_or_path", str(model), "--output_dir", str(out),
        "--rewards", "compressibility:1.0", "--h", "64", "--w", "64", "--sampling_steps", "8", "--eta", "0.7",
        "--shift", "3", "--num_generations", "8", "--train_batch_size", "1", "--rollout_batch_size", "8",
        "--train_micro_batch_size", "4", "--timestep_fraction", "1.0", "--ignore_last", "--use_group",
        "--init_same_noise", "--clip_range", "0.2", "--adv_clip_max", "5.0", "--learning_rate", "3e-3",
        "--weight_decay", "0.0", "--mixed_precision", "no", "--max_train_steps", str(iterations),
        "--checkpointing_steps", "100000", "--save_images_every", "0", "--dataloader_num_workers", "0",
        "--seed", str(seed), "--sampler_seed", str(1223627 + seed), "--fsdp_sharding_strategy", "none",
    ] + MODES[mode]
    trainer = GRPOTrainer(parse_config(argv), platform.init_distributed())
    trainer.setup()
    trainer.save_checkpoint = lambda: None
    rows = []
    for _ in range(iterations):
        cpu0 = time.process_time()
        rec = trainer.run_iteration()
        rows.append(dict(rec, cpu_iteration=time.process_time() - cpu0))
    return rows


CLOCK = "cpu_iteration"  # one-thread CPU seconds: robust to other jobs on a shared machine


def time_to_target(rows: list[dict], target: float) -> float | None:
    base = statistics.mean(r["reward_mean"] for r in rows[:5])
    elapsed = 0.0
    for i, r in enumerate(rows):
        elapsed += r[CLOCK]
        if i >= 4 and statistics.mean(x["reward_mean"] for x in rows[i - 4:i + 1]) - base >= target:
            return elapsed
    return None


def _fmt(values: list[float], digits: int = 1) -> str:
    if not values:
        return "not reached"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--target_share", type=float, default=0.5)
    args = ap.parse_args()
    if "full" not in args.modes:
        raise SystemExit("--modes must include full: the target gain is a share of its gain")
    with tempfile.TemporaryDirectory() as tmp:
        model, data = build_inputs("tiny", Path(tmp))
        results = {m: [run(model, data, Path(tmp) / f"{m}_{s}", m, s, args.iterations) for s in args.seeds]
                   for m in args.modes}

    def gain(rows):
        return statistics.mean(r["reward_mean"] for r in rows[-5:]) - statistics.mean(r["reward_mean"] for r in rows[:5])

    target = args.target_share * statistics.mean(gain(rows) for rows in results["full"])
    print(f"# tiny demo task, {args.iterations} iterations, seeds {args.seeds}; target gain {target:.3f} "
          f"(= {args.target_share} x full-SDE mean gain)\n")
    print("| mode | CPU s / iteration | gain (last 5 - first 5) | CPU seconds to target | runs reaching it |")
    print("|---|---|---|---|---|")
    for m, runs in results.items():
        per_it = [statistics.mean(r[CLOCK] for r in rows[1:]) for rows in runs]
        times = [t for t in (time_to_target(rows, target) for rows in runs) if t is not None]
        print(f"| {m} | {_fmt(per_it, 3)} | {_fmt([gain(rows) for rows in runs], 3)} | {_fmt(times)} | "
              f"{len(times)}/{len(runs)} |", flush=True)


if __name__ == "__main__":
    main()
