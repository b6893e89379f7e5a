"""Wall time to the same reward gain: DanceGRPO (all SDE) vs MixGRPO vs Flash vs Flow-GRPO-Fast.

    python bench/mix_learning.py [--modes full mixgrpo flash fast] [--seeds 1 2] [--iterations 30]
                                 [--equal_time]

The tiny demo task (scripts/demo/grpo_tiny_cpu.sh's settings: tiny FLUX, 64x64, 8 steps, G = 8,
JPEG-compressibility reward, lr 3e-3, clip 0.2) on one CPU process. For each mode and seed it
records the reward per iteration and the CPU seconds per iteration (run it with
OMP_NUM_THREADS=1: one-thread CPU time does not grow when other jobs share the machine), then prints the gain (mean of the
last 5 iterations minus the first 5), the seconds per iteration, and the wall time until the
5-iteration moving average first reaches TARGET = --target_share x the mean gain of the full-SDE
runs above the run's own first-5 mean. Mean and spread over seeds. A benchmark, not a test.

With --equal_time every mode gets the CPU seconds its seed's full-SDE run spent on --iterations
iterations (a cheaper mode runs more iterations), which is the comparison "wall time to the same
gain" asks for: the gain is then the gain at equal time, and a run that has not reached the target
when its time is up is censored at the budget. The median time to target counts censored runs as
slower than every finished one (it is "not reached" when half or more are censored). Per seed,
each mode is also paired with the full-SDE run of the same seed: "earlier" counts the seeds where
it reaches the target first (a censored run is later than any finished one; two censored runs tie).
--json PATH writes every run's per-iteration rewards and CPU seconds, rewritten after each seed so a
stopped race keeps its finished seeds (--from_json re-reads one),
--plot PATH draws the mean reward gain against CPU seconds per mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
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


def run(model: Path, data: Path, out: Path, mode: str, seed: int, iterations: int,
        cpu_budget: float | None = None) -> list[dict]:
    """Reward and CPU seconds per iteration: ``iterations`` of them, or, with ``cpu_budget``, as many
    as fit in that many CPU seconds (at least 10, at most 10 x ``iterations``)."""
    from fastvideo import devices
    from fastvideo.config import parse_config
    from fastvideo.training.trainer import Trainer

    argv = [
        "--data_json_path", str(data), "--pretrained_model_name_or_path", str(model), "--output_dir", str(out),
        "--rewards", "compressibility:1.0", "--h", "64", "--w", "64", "--sampling_steps", "8", "--eta", "0.7",
        "--shift", "3", "--num_generations", "8", "--train_batch_size", "1", "--rollout_batch_size", "8",
        "--train_micro_batch_size", "4", "--timestep_fraction", "1.0", "--ignore_last", "--use_group",
        "--init_same_noise", "--clip_range", "0.2", "--adv_clip_max", "5.0", "--learning_rate", "3e-3",
        "--weight_decay", "0.0", "--mixed_precision", "no", "--max_train_steps", str(10 * iterations),
        "--checkpointing_steps", "100000", "--save_images_every", "0", "--dataloader_num_workers", "0",
        "--seed", str(seed), "--sampler_seed", str(1223627 + seed), "--fsdp_sharding_strategy", "none",
    ] + MODES[mode]
    if not same_noise_allowed(argv):  # a deterministic rollout from shared noise gives G equal samples
        argv.remove("--init_same_noise")
    trainer = Trainer(parse_config(argv), devices.init_distributed())
    trainer.setup()
    trainer.save_checkpoint = lambda: None
    rows, spent = [], 0.0
    while True:
        if cpu_budget is None and len(rows) == iterations:
            return rows
        if cpu_budget is not None and len(rows) >= 10 and (spent >= cpu_budget or len(rows) == 10 * iterations):
            return rows
        cpu0 = time.process_time()
        rec = trainer.run_iteration()
        rows.append(dict(rec, cpu_iteration=time.process_time() - cpu0))
        spent += rows[-1]["cpu_iteration"]


def same_noise_allowed(argv: list[str]) -> bool:
    """Whether a mode may keep the demo's --init_same_noise: not where every step of the rollout is
    deterministic (NFT's solver, AWM's and DGPO's Euler ODE), which refuse it."""
    algorithm = argv[argv.index("--algorithm") + 1] if "--algorithm" in argv else "grpo"
    return "--nft_solver" not in argv and algorithm not in ODE_ALGORITHMS


ODE_ALGORITHMS = ("awm", "dgpo")
CLOCK = "cpu_iteration"  # one-thread CPU seconds: robust to other jobs on a shared machine


def time_to_target(rows: list[dict], target: float) -> float | None:
    base = statistics.mean(r["reward_mean"] for r in rows[:5])
    elapsed = 0.0
    for i, r in enumerate(rows):
        elapsed += r[CLOCK]
        if i >= 4 and statistics.mean(x["reward_mean"] for x in rows[i - 4:i + 1]) - base >= target:
            return elapsed
    return None


def median_time(times: list[float | None]) -> str:
    """Median time to target with unfinished runs counted as slower than all finished ones."""
    ranked = sorted(times, key=lambda t: (t is None, t or 0.0))
    mid = ranked[len(ranked) // 2]  # the upper median: a tie between two runs goes to the slower
    return "not reached" if mid is None else f"{mid:.1f}"


def paired_counts(times: list[float | None], reference: list[float | None]) -> tuple[int, int, int]:
    """(earlier, tied, later) over seeds: time to target against the same seed's reference run."""
    inf = float("inf")
    pairs = [(inf if t is None else t, inf if r is None else r) for t, r in zip(times, reference)]
    return (sum(t < r for t, r in pairs), sum(t == r for t, r in pairs), sum(t > r for t, r in pairs))


def _fmt(values: list[float], digits: int = 1) -> str:
    if not values:
        return "not reached"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def sign_test(wins: int, losses: int) -> float:
    """One-sided sign test: P(at least ``wins`` of wins + losses fair coin flips), ties dropped."""
    from math import comb

    n = wins + losses
    return sum(comb(n, i) for i in range(wins, n + 1)) / 2 ** n if n else 1.0


def gain(rows: list[dict]) -> float:
    return statistics.mean(r["reward_mean"] for r in rows[-5:]) - statistics.mean(r["reward_mean"] for r in rows[:5])


def summarize(results: dict[str, list[list[dict]]], target: float) -> None:
    print("| mode | iterations | CPU s / iteration | gain (last 5 - first 5) | CPU s to target (reached runs) "
          "| median CPU s to target (all runs) | runs reaching it | seeds earlier / tied / later than full "
          "| sign test p |")
    print("|---|---|---|---|---|---|---|---|---|")
    full_times = [time_to_target(rows, target) for rows in results["full"]]
    for m, runs in results.items():
        per_it = [statistics.mean(r[CLOCK] for r in rows[1:]) for rows in runs]
        all_times = [time_to_target(rows, target) for rows in runs]
        times = [t for t in all_times if t is not None]
        paired, p = "—", "—"
        if m != "full":
            earlier, tied, later = paired_counts(all_times, full_times)
            paired, p = f"{earlier} / {tied} / {later}", f"{sign_test(earlier, later):.3g}"
        print(f"| {m} | {_fmt([len(rows) for rows in runs], 0)} | {_fmt(per_it, 3)} | "
              f"{_fmt([gain(rows) for rows in runs], 3)} | {_fmt(times)} | {median_time(all_times)} | "
              f"{len(times)}/{len(runs)} | {paired} | {p} |", flush=True)


def plot(results: dict[str, list[list[dict]]], target: float, path: Path) -> None:
    """Reward gain (5-iteration moving average minus the run's first-5 mean) against CPU seconds:
    mean over seeds with a ± standard-error band, up to the shortest run's time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    end = min(sum(r[CLOCK] for r in rows) for runs in results.values() for rows in runs)
    grid = np.linspace(0.0, end, 200)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m, runs in results.items():
        curves = []
        for rows in runs:
            t = np.cumsum([r[CLOCK] for r in rows])
            rew = np.array([r["reward_mean"] for r in rows])
            avg = np.convolve(rew, np.ones(5) / 5, mode="valid") - rew[:5].mean()
            curves.append(np.interp(grid, t[4:], avg, left=np.nan))
        c = np.array(curves)
        with warnings.catch_warnings():  # the first few grid points precede every run's 5th iteration
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(c, axis=0)
            se = np.nanstd(c, axis=0, ddof=1) / np.sqrt(np.sum(~np.isnan(c), axis=0))
        ax.plot(grid, mean, label=f"{m} ({len(runs)} seeds)")
        ax.fill_between(grid, mean - se, mean + se, alpha=0.2)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("one-thread CPU seconds")
    ax.set_ylabel("reward gain (5-iteration mean)")
    ax.set_title("Tiny demo task: reward gain at equal CPU time")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _save(path: Path | None, results: dict, seeds: list[int], equal_time: bool, target_share: float) -> None:
    """The finished seeds' runs (rewritten after each seed, so a stopped race keeps them)."""
    if path is None:
        return
    target = target_share * statistics.mean(gain(rows) for rows in results["full"])
    path.write_text(json.dumps({
        "target": target, "seeds": seeds, "equal_time": equal_time,
        "runs": {m: [[{"reward_mean": r["reward_mean"], CLOCK: r[CLOCK]} for r in rows] for rows in runs]
                 for m, runs in results.items()}}))


def run_all(args) -> dict[str, list[list[dict]]]:
    """Seed by seed: full SDE first (its CPU seconds are the seed's budget with --equal_time), then
    the other modes; --json is rewritten after every seed."""
    results: dict[str, list[list[dict]]] = {m: [] for m in ["full"] + [m for m in args.modes if m != "full"]}
    with tempfile.TemporaryDirectory() as tmp:
        model, data = build_inputs("tiny", Path(tmp))
        for i, s in enumerate(args.seeds):
            results["full"].append(run(model, data, Path(tmp) / f"full_{s}", "full", s, args.iterations))
            budget = sum(r[CLOCK] for r in results["full"][-1]) if args.equal_time else None
            for m in list(results)[1:]:
                results[m].append(run(model, data, Path(tmp) / f"{m}_{s}", m, s, args.iterations, budget))
            _save(args.json, results, args.seeds[:i + 1], args.equal_time, args.target_share)
            print(f"# seed {s} done ({i + 1}/{len(args.seeds)})", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--target_share", type=float, default=0.5)
    ap.add_argument("--json", type=Path, default=None, help="write every run's rewards and CPU seconds here")
    ap.add_argument("--from_json", type=Path, default=None, help="summarize (and plot) a --json file instead of running")
    ap.add_argument("--plot", type=Path, default=None, help="draw the reward gain against CPU seconds (PNG)")
    ap.add_argument("--equal_time", action="store_true",
                    help="give every mode the CPU seconds of the same seed's full-SDE run")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        results, target = saved["runs"], saved["target"]
        print(f"# {args.from_json}: seeds {saved['seeds']}, equal time {saved['equal_time']}; target gain "
              f"{target:.3f}\n")
    else:
        if "full" not in args.modes:
            raise SystemExit("--modes must include full: the target gain is a share of its gain")
        results = run_all(args)
        target = args.target_share * statistics.mean(gain(rows) for rows in results["full"])
        budget = "equal CPU time per seed (full SDE's)" if args.equal_time else "equal iterations"
        print(f"# tiny demo task, {args.iterations} full-SDE iterations, {budget}, seeds {args.seeds}; "
              f"target gain {target:.3f} (= {args.target_share} x full-SDE mean gain)\n")
    summarize(results, target)
    if args.plot:
        plot(results, target, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
