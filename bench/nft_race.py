"""Equal-CPU-time race on the tiny demo task: DiffusionNFT vs DanceGRPO vs MixGRPO-Flash.

    OMP_NUM_THREADS=1 python bench/nft_race.py --tune [--grid 3e-3 1e-2 3e-2] [--tune_seeds 101 102]
                                               [--seeds 1 2] [--iterations 20] [--target 0.04] [--json P]
    OMP_NUM_THREADS=1 python bench/nft_race.py [--seeds 1 2] [--iterations 30] [--json P] [--plot P]

--tune (tuned against tuned, issue #39 item 7): every method (full = DanceGRPO, flash = MixGRPO-Flash,
nft = DiffusionNFT) runs at every learning rate of the same --grid on the --tune_seeds; each
method's lr is chosen by ``best_lr`` (most tuning seeds reaching the target gain, then the lowest
median CPU time to it, then the smaller lr); then each method races at its chosen lr on the
held-out --seeds (disjoint from the tuning seeds). A cell is one seed (and, while tuning, one lr):
DanceGRPO runs --iterations iterations and the other methods get its one-thread CPU seconds. The
target is a fixed gain (--target, default 0.040: 0.5 x DanceGRPO's mean gain at the demo's lr 3e-3
in the untuned 20-seed race), the same for every lr. --json is rewritten after every cell, and a
rerun with the same --json skips the cells it holds (a stopped race resumes); --from_json reports.

Without --tune, the untuned race: bench/mix_learning.py's harness with --equal_time (every mode gets
the CPU seconds of the same seed's DanceGRPO run; median CPU seconds to the target gain, runs
reaching it, paired counts and a sign test against DanceGRPO), with two NFT modes (--algorithm nft,
DPM-Solver++ rollouts of the same 8 steps, per-sample initial noise, every timestep trained, beta 1,
decay type 1):

- nft: one optimizer step per iteration over the whole group of 8 (the demo's micro-batches of 4,
  --gradient_accumulation_steps 2), as the reference's gradient_step_per_epoch 1, at lr 1e-2
  (chosen on seeds 1-3 at 30 equal iterations: docs/nft.md);
- nft_split: the demo's GRPO split (2 optimizer steps of half a group each) at its lr 3e-3, the
  configuration of the first, 12-seed race.

A benchmark, not a test (its selection rule is: tests/perf/test_nft_race.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mix_learning  # noqa: E402

NFT = ["--algorithm", "nft", "--nft_solver", "dpm", "--nft_beta", "1.0", "--nft_decay_type", "1"]
mix_learning.MODES["nft"] = NFT + ["--gradient_accumulation_steps", "2", "--learning_rate", "1e-2"]
mix_learning.MODES["nft_split"] = NFT  # the demo's micro-batches of 4, GA 1, lr 3e-3

# The objectives after NFT (issue #49), each on the demo's task and flags (clip 0.2, G 8, 8 steps) with what
# it needs or its peer's recipe sets: one optimizer step per iteration as the recipes' gradient_step_per_epoch 1
# (AWM and DGPO: Flow-Factory a0b2bc5, examples/awm/lora/flux1, examples/dgpo/lora/sd3_5; Flash-GRPO: the
# authors' one prompt per micro-batch and step, Shredded-Pork/Flash-GRPO 4211013), DGPO's dpo_beta 10 (its
# recipe), Flash-GRPO's SDE without eta (--eta 1); GRPO-Guard is DanceGRPO's demo with the guard's ratio.
mix_learning.MODES["awm"] = ["--algorithm", "awm", "--gradient_accumulation_steps", "2"]
mix_learning.MODES["dgpo"] = ["--algorithm", "dgpo", "--dgpo_beta", "10", "--train_micro_batch_size", "8"]
mix_learning.MODES["guard"] = ["--policy_loss", "grpo_guard"]
mix_learning.MODES["flash_grpo"] = ["--algorithm", "flash_grpo", "--eta", "1.0", "--train_micro_batch_size", "8"]
# The combination flow_grpo #192 reports collapsing on OCR ("Fast + Guard"): MixGRPO-Flash's window and
# DPM-Solver++ tail with the guard's ratio.
mix_learning.MODES["flash_guard"] = mix_learning.MODES["flash"] + ["--policy_loss", "grpo_guard"]

EXISTING = {"full": "DanceGRPO", "flash": "MixGRPO-Flash", "nft": "DiffusionNFT"}
NEW = {"dgpo": "DGPO", "awm": "AWM", "guard": "GRPO-Guard", "flash_grpo": "Flash-GRPO", "flash_guard": "Flash + Guard"}
METHODS = {**EXISTING, **NEW}
REFERENCE = "full"  # runs --iterations iterations; the cell's other methods get its CPU seconds
INF = float("inf")


def mode_at(method: str, lr: float) -> str:
    """The mix_learning mode of ``method`` at learning rate ``lr`` (the flag given last wins)."""
    name = f"{method}@{lr:g}"
    mix_learning.MODES[name] = [*mix_learning.MODES[method], "--learning_rate", f"{lr:g}"]
    return name


def upper_median(times: list[float | None]) -> float:
    """mix_learning.median_time as a number: unfinished runs (None) count as slower than every
    finished one (inf); the upper median, so a tie between two runs goes to the slower."""
    ranked = sorted(INF if t is None else t for t in times)
    return ranked[len(ranked) // 2]


def best_lr(times_by_lr: dict[float, list[float | None]]) -> float:
    """The learning rate whose tuning runs reach the target on the most seeds; among those, the
    lowest upper median CPU time to it (unfinished runs slower than any finished one); then the
    smaller lr. ``times_by_lr``: lr -> CPU seconds to the target per tuning seed, None if not reached."""
    if not times_by_lr:
        raise ValueError("no learning rate to choose from")
    return min(times_by_lr, key=lambda lr: (-sum(t is not None for t in times_by_lr[lr]),
                                            upper_median(times_by_lr[lr]), lr))


def times(runs: dict[str, list[dict]], target: float) -> list[float | None]:
    """CPU seconds to ``target`` per seed (seed order of the dict), None where not reached."""
    return [mix_learning.time_to_target(rows, target) for rows in runs.values()]


def run_cell(inputs, tmp: Path, seed: int, modes: dict[str, str], iterations: int,
             budget: float | None = None) -> dict[str, list[dict]]:
    """One seed: the reference method's mode for ``iterations`` iterations, then the others at its
    CPU seconds (``modes``: method -> mix_learning mode). With ``budget`` (the CPU seconds of the
    reference's run a saved cell holds) the reference is not rerun and ``modes`` need not name it."""
    model, data = inputs
    cell = {}
    if budget is None:
        cell[REFERENCE] = mix_learning.run(model, data, tmp / f"{modes[REFERENCE]}_{seed}", modes[REFERENCE], seed,
                                           iterations)
        budget = sum(r[mix_learning.CLOCK] for r in cell[REFERENCE])
    for method, mode in modes.items():
        if method != REFERENCE:
            cell[method] = mix_learning.run(model, data, tmp / f"{mode}_{seed}", mode, seed, iterations, budget)
    return cell


def _keep(rows: list[dict]) -> list[dict]:
    return [{"reward_mean": r["reward_mean"], mix_learning.CLOCK: r[mix_learning.CLOCK]} for r in rows]


def _store(saved: dict, where: list[str], seed: int, cell: dict, path: Path | None) -> None:
    """Put one cell's runs at saved[where...][method][seed] and rewrite --json."""
    for method, rows in cell.items():
        node = saved
        for key in [*where, method]:
            node = node.setdefault(key, {})
        node[str(seed)] = _keep(rows)
    if path is not None:
        path.write_text(json.dumps(saved))


def _missing(saved: dict, where: list[str], seed: int, methods) -> list[str]:
    """The ``methods`` whose run of ``seed`` the cell at saved[where...] does not hold yet."""
    node = saved
    for key in where:
        node = node.get(key, {})
    return [m for m in methods if str(seed) not in node.get(m, {})]


def _fill(saved: dict, where: list[str], seed: int, modes: dict[str, str], inputs, tmp: Path, args) -> None:
    """Run the cell's missing methods (``modes``: method -> mode): a held reference run is not rerun,
    the new methods get its saved CPU seconds (the cells of an earlier race gain the new methods)."""
    missing = _missing(saved, where, seed, modes)
    if not missing:
        return
    node = saved
    for key in where:
        node = node.get(key, {})
    held = node.get(REFERENCE, {}).get(str(seed))
    budget = None if held is None else sum(r[mix_learning.CLOCK] for r in held)
    todo = {m: modes[m] for m in missing if m != REFERENCE or held is None}
    _store(saved, where, seed, run_cell(inputs, tmp, seed, todo, args.iterations, budget), args.json)


def choose(saved: dict, methods=None) -> dict[str, float]:
    """Each method's lr by best_lr over the tuning seeds saved (``methods``: those with tuning runs)."""
    return {m: best_lr({float(lr): times(by_lr[lr], saved["target"]) for lr in by_lr})
            for m, by_lr in ((m, _by_lr(saved, m)) for m in (methods or _present(saved)))}


def _present(saved: dict) -> list[str]:
    """The methods (in METHODS' order) that have runs in the tuning."""
    return [m for m in METHODS if any(m in cell for cell in saved.get("tuning", {}).values())]


def best_of(race_times: dict[str, list[float | None]]) -> str:
    """The method whose race runs reach the target on the most seeds, then with the lowest upper median
    CPU time to it (best_lr's rule, over methods); a full tie goes to the first named."""
    order = list(race_times)
    return min(order, key=lambda m: (-sum(t is not None for t in race_times[m]), upper_median(race_times[m]),
                                     order.index(m)))


def _by_lr(saved: dict, method: str) -> dict[str, dict[str, list[dict]]]:
    """lr -> seed -> the method's tuning run, over the seeds run at every lr (a stopped tuning
    compares its lrs on the same seeds)."""
    by_lr = {lr: cell[method] for lr, cell in saved["tuning"].items() if method in cell}
    common = set.intersection(*(set(runs) for runs in by_lr.values())) if by_lr else set()
    return {lr: {s: rows for s, rows in runs.items() if s in common} for lr, runs in by_lr.items()}


def tuned_race(args) -> dict:
    """Tune on args.tune_seeds, then race at the chosen lrs on args.seeds; the saved record."""
    if set(args.tune_seeds) & set(args.seeds):
        raise SystemExit(f"--tune_seeds and --seeds overlap in {sorted(set(args.tune_seeds) & set(args.seeds))}: "
                         "the race must be on held-out seeds")
    keys = dict(target=args.target, grid=[float(g) for g in args.grid], iterations=args.iterations,
                tune_seeds=args.tune_seeds, seeds=args.seeds)
    saved = json.loads(args.json.read_text()) if args.json is not None and args.json.exists() else {}
    if any(saved.get(k) != v for k, v in keys.items() if k in saved):
        raise SystemExit(f"{args.json} holds another race ({ {k: saved.get(k) for k in keys} }): give another --json")
    saved.update(keys)
    from iteration import build_inputs

    with tempfile.TemporaryDirectory() as tmp:
        inputs = build_inputs("tiny", Path(tmp))
        methods = [REFERENCE, *(m for m in args.methods if m != REFERENCE)]
        for seed in args.tune_seeds:
            for lr in args.grid:
                _fill(saved, ["tuning", f"{lr:g}"], seed, {m: mode_at(m, lr) for m in methods}, inputs, Path(tmp), args)
                print(f"# tuning: seed {seed}, lr {lr:g} done", flush=True)
        saved["chosen"] = chosen = choose(saved)
        for seed in args.seeds[:args.limit_seeds]:
            _fill(saved, ["race"], seed, {m: mode_at(m, chosen[m]) for m in methods}, inputs, Path(tmp), args)
            print(f"# race: seed {seed} done", flush=True)
    return saved


def report(saved: dict) -> None:
    """The tuning table (per method and lr) and the race table (per method at its chosen lr, with
    paired counts against each other method, and each new method's sign test against the best
    existing one), over the race seeds every method present holds."""
    target = saved["target"]
    print(f"# target gain {target:g}; {saved['iterations']} DanceGRPO iterations per cell, the other methods at "
          f"its CPU seconds; tuning seeds {saved['tune_seeds']}, race seeds {saved['seeds']}\n")
    print("| method | lr | tuning seeds reaching the target | median CPU s to target | chosen |\n|---|---|---|---|---|")
    chosen = choose(saved)
    for m in chosen:
        for lr, runs in sorted(_by_lr(saved, m).items(), key=lambda kv: float(kv[0])):
            t = times(runs, target)
            print(f"| {METHODS[m]} | {lr} | {sum(x is not None for x in t)}/{len(t)} | "
                  f"{mix_learning.median_time(t)} | {'yes' if float(lr) == chosen[m] else ''} |")
    race = saved.get("race", {})
    present = [m for m in chosen if race.get(m)]
    seeds = [s for s in map(str, saved["seeds"]) if all(s in race[m] for m in present)]
    if not seeds:
        return
    race_times = {m: [mix_learning.time_to_target(race[m][s], target) for s in seeds] for m in present}
    best = best_of({m: race_times[m] for m in present if m in EXISTING})
    print(f"\n# {len(seeds)} race seeds held by every method: {', '.join(seeds)}; best existing method: {METHODS[best]}")
    print(f"\n| method | lr | race seeds reaching the target | median CPU s to target | gain (last 5 - first 5) | "
          f"{' | '.join(f'earlier / tied / later than {METHODS[o]}' for o in present)} | iterations | "
          f"CPU s / iteration | sign test p against {METHODS[best]} (earlier; later) |")
    print("|---|---|---|---|---|" + "---|" * (len(present) + 3))
    for m in present:
        gains = [mix_learning.gain(race[m][s]) for s in seeds]
        paired = ["—" if o == m else " / ".join(map(str, mix_learning.paired_counts(race_times[m], race_times[o])))
                  for o in present]
        per_it = [sum(r[mix_learning.CLOCK] for r in race[m][s]) / len(race[m][s]) for s in seeds]
        print(f"| {METHODS[m]} | {chosen[m]:g} | {sum(t is not None for t in race_times[m])}/{len(seeds)} | "
              f"{mix_learning.median_time(race_times[m])} | {mix_learning._fmt(gains, 3)} | {' | '.join(paired)} | "
              f"{mix_learning._fmt([len(race[m][s]) for s in seeds], 0)} | {mix_learning._fmt(per_it, 3)} | "
              f"{sign_against(race_times[m], race_times[best]) if m in NEW else '—'} |")


def sign_against(times_new: list[float | None], times_best: list[float | None]) -> str:
    """One-sided sign tests over the paired seeds (ties dropped): p of the new method being earlier, then
    p of it being later than the best existing method."""
    earlier, _, later = mix_learning.paired_counts(times_new, times_best)
    return f"{mix_learning.sign_test(earlier, later):.3g}; {mix_learning.sign_test(later, earlier):.3g}"


def main_tuned(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description="the tuned race (--tune)")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--grid", nargs="+", type=float, default=[3e-3, 1e-2, 3e-2])
    ap.add_argument("--tune_seeds", nargs="+", type=int, default=[101, 102, 103])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--target", type=float, default=0.040)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS),
                    help="the methods to run (DanceGRPO, the reference, always runs where a cell lacks it)")
    ap.add_argument("--limit_seeds", type=int, default=None,
                    help="race only the first N of --seeds now (a smaller race; a rerun with more adds seeds)")
    ap.add_argument("--from_json", type=Path, default=None, help="report a --json file instead of running")
    args = ap.parse_args(argv)
    report(json.loads(args.from_json.read_text()) if args.from_json else tuned_race(args))


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--tune" in argv:
        main_tuned(argv)
        sys.exit(0)
    if "--modes" not in argv and "--from_json" not in argv:
        argv += ["--modes", "full", "flash", "nft", "nft_split"]
    if "--equal_time" not in argv:
        argv.append("--equal_time")
    sys.argv = [sys.argv[0], *argv]
    mix_learning.main()
