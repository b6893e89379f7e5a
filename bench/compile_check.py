"""--compile against eager in one process: seconds per iteration, compile time, and the numbers.

    python bench/compile_check.py [--preset small] [--size 128] [--iterations 2] [--backend auto]
        [--device cpu|cuda|npu] [--json OUT.json]

Builds a random FLUX of the preset and its prompt embeddings, then runs the real trainer twice
from the same seed: eager, then with --compile (regional: one compiled graph per block class and
grad mode, fastvideo/models/compile.py; backend from the device layer unless --backend names
one). Per variant: the first iteration (for --compile it includes compiling), the median of
--iterations later iterations, and the first iteration's metrics (reward of the rollout, loss and
grad norm of the update, the first update's |ratio - 1|), so the ratio of the times and the
agreement of the numbers come from one run on one machine. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gc
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

KEYS = ("reward_mean", "loss", "grad_norm", "first_ratio_dev")


def make_inputs(work: Path, preset: str) -> tuple[Path, Path]:
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess
    from fastvideo.tools.make_tiny_flux import make_tiny_flux

    model = make_tiny_flux(work / f"{preset}_flux", preset=preset, seed=0)
    cfg = PreprocessConfig(model_path=str(model), prompt_file=str(ROOT / "assets" / "prompts_tiny.txt"),
                           output_dir=str(work / "emb"), max_sequence_length=32, batch_size=8,
                           dataloader_num_workers=0)
    return model, Path(run_preprocess(cfg).json_path)


def flags(model: Path, data: Path, out: Path, size: int, iterations: int, extra: list[str]) -> list[str]:
    return ["--pretrained_model_name_or_path", str(model), "--data_json_path", str(data), "--output_dir", str(out),
            "--rewards", "compressibility:1.0", "--h", str(size), "--w", str(size), "--sampling_steps", "4",
            "--eta", "0.7", "--use_group", "--num_generations", "4", "--rollout_batch_size", "4",
            "--train_micro_batch_size", "2", "--timestep_fraction", "0.6", "--learning_rate", "1e-4",
            "--mixed_precision", "no", "--gradient_checkpointing", "--max_train_steps", str(iterations + 2),
            "--checkpointing_steps", "1000", "--save_images_every", "0", "--dataloader_num_workers", "0",
            "--seed", "42", *extra]


def measure(argv: list[str], iterations: int) -> dict:
    from fastvideo import devices
    from fastvideo.config import parse_config
    from fastvideo.train_grpo_flux import build_trainer

    cfg = parse_config(argv)
    trainer = build_trainer(cfg, devices.init_distributed())
    seconds = []
    for _ in range(iterations + 1):
        devices.synchronize(trainer.device)
        t0 = time.perf_counter()
        trainer.run_iteration()
        devices.synchronize(trainer.device)
        seconds.append(time.perf_counter() - t0)
    first = json.loads((Path(cfg.output.output_dir) / "metrics.jsonl").read_text().splitlines()[0])
    del trainer
    gc.collect()
    return {"first_iteration_s": seconds[0], "seconds_per_iteration": statistics.median(seconds[1:]),
            "first_metrics": {k: first[k] for k in KEYS}}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small", choices=["tiny", "small"])
    ap.add_argument("--size", type=int, default=128, help="image side in pixels")
    ap.add_argument("--iterations", type=int, default=2, help="timed iterations after the first")
    ap.add_argument("--backend", default="auto", choices=["auto", "inductor", "aot_eager", "eager"])
    ap.add_argument("--device", default=None, help="default: FASTVIDEO_DEVICE or the device layer's choice")
    ap.add_argument("--variants", nargs="+", default=["eager", "compile"], choices=["eager", "compile"],
                    help="compile alone fills torch's compile cache (a cold first iteration) for a later full run")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.device:
        os.environ["FASTVIDEO_DEVICE"] = args.device
    work = Path(tempfile.mkdtemp(prefix="compile_check_"))
    model, data = make_inputs(work, args.preset)
    rows = {}
    for name, extra in (("eager", []), ("compile", ["--compile", "--compile_backend", args.backend])):
        if name in args.variants:
            rows[name] = measure(flags(model, data, work / name, args.size, args.iterations, extra), args.iterations)
    base = next(iter(rows.values()))["seconds_per_iteration"]
    print(f"preset {args.preset} {args.size}x{args.size}, backend {args.backend}, {args.iterations} timed iterations")
    print(f"{'variant':<10}{'first it (s)':>14}{'s/it':>9}{'ratio':>10}  first iteration's " + ", ".join(KEYS))
    for name, r in rows.items():
        m = r["first_metrics"]
        print(f"{name:<10}{r['first_iteration_s']:>14.2f}{r['seconds_per_iteration']:>9.3f}"
              f"{r['seconds_per_iteration'] / base:>10.3f}  " + ", ".join(f"{m[k]:.6g}" for k in KEYS))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
