"""bench/nft_race.py --tune: the rule that picks each method's learning rate, and the tuned race's
bookkeeping (tuning seeds apart from the race's, the race at the chosen lrs, a stopped race resumed),
with the training runs stood in for by made-up reward curves."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def race():
    spec = importlib.util.spec_from_file_location("bench_nft_race", BENCH / "nft_race.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_most_seeds_reaching_the_target_wins_before_the_median(race):
    # 1e-2 is faster where it finishes, 3e-3 finishes on more seeds: "fastest median first" would pick 1e-2
    # (its upper median of [1, 1, 1, None] is 1.0), "most reached first" picks 3e-3
    assert race.best_lr({1e-2: [1.0, 1.0, 1.0, None], 3e-3: [2.0, 2.0, 2.0, 2.0]}) == 3e-3


def test_equal_counts_go_to_the_lower_upper_median(race):
    # both reach 3 of 4; 1e-2 has the lower mean over its finished runs (3.67 < 4) and the lower lower
    # median (5 vs 4: no), but the upper median (None counted slowest) is 5 against 4: 3e-2 wins
    assert race.upper_median([1.0, 5.0, 5.0, None]) == 5.0 and race.upper_median([4.0, 4.0, 4.0, None]) == 4.0
    assert race.best_lr({1e-2: [1.0, 5.0, 5.0, None], 3e-2: [4.0, 4.0, 4.0, None]}) == 3e-2
    # two runs: the upper median is the slower one (a lower median would call these equal and take 3e-3)
    assert race.best_lr({3e-3: [1.0, 9.0], 1e-2: [2.0, 3.0]}) == 1e-2
    assert race.upper_median([None, 2.0]) == float("inf")


def test_a_full_tie_goes_to_the_smaller_lr_and_nothing_is_refused(race):
    assert race.best_lr({3e-2: [2.0, None], 3e-3: [2.0, None], 1e-2: [2.0, None]}) == 3e-3
    assert race.best_lr({3e-2: [None, None], 1e-2: [None, None]}) == 1e-2
    with pytest.raises(ValueError):
        race.best_lr({})


def _rows(reach_at: int | None, cpu: float = 0.5, n: int = 12) -> list[dict]:
    """A run whose reward jumps from 0 to 1 at iteration ``reach_at`` (never when None): with any
    target below 0.2 its 5-iteration average first clears it there, after (reach_at + 1) x cpu s."""
    return [{"reward_mean": 1.0 if reach_at is not None and i >= reach_at else 0.0, "cpu_iteration": cpu}
            for i in range(n)]


# method -> lr -> the iteration where its made-up run reaches the target (None: never)
CURVES = {"full": {0.003: 9, 0.01: 6, 0.03: None}, "flash": {0.003: 5, 0.01: 5, 0.03: 5},
          "nft": {0.003: None, 0.01: 8, 0.03: 6}}


def _fake_cell(calls):
    def run_cell(inputs, tmp, seed, modes, iterations, budget=None):
        calls.append((seed, dict(modes)) if budget is None else (seed, dict(modes), budget))
        cell = {}
        for method, mode in modes.items():
            lr = float(mode.split("@")[1])
            reach = CURVES[method][lr]
            if method == "nft" and lr == 0.03 and seed == 102:
                reach = None  # 3e-2 reaches on one tuning seed of two, 1e-2 on both: 1e-2 is chosen
            cell[method] = _rows(reach)
        return cell
    return run_cell


def _args(race, path, **over):
    import argparse

    base = dict(grid=[3e-3, 1e-2, 3e-2], tune_seeds=[101, 102], seeds=[1, 2, 3], iterations=20, target=0.04,
                methods=["full", "flash", "nft"], limit_seeds=None,
                json=path)
    return argparse.Namespace(**{**base, **over})


def test_the_race_runs_each_method_at_its_chosen_lr_and_resumes(race, tmp_path, monkeypatch, capsys):
    import iteration

    calls = []
    monkeypatch.setattr(race, "run_cell", _fake_cell(calls))
    monkeypatch.setattr(iteration, "build_inputs", lambda *a: (None, None))
    path = tmp_path / "race.json"
    saved = race.tuned_race(_args(race, path))
    assert saved["chosen"] == {"full": 0.01, "flash": 0.003, "nft": 0.01}
    assert len(calls) == 2 * 3 + 3  # every (tuning seed, lr) cell, then every race seed
    assert [c[0] for c in calls[6:]] == [1, 2, 3]
    assert all(c[1] == {"full": "full@0.01", "flash": "flash@0.003", "nft": "nft@0.01"} for c in calls[6:])
    assert json.loads(path.read_text())["race"]["nft"]["3"] == _rows(8)
    calls.clear()
    race.tuned_race(_args(race, path, seeds=[1, 2, 3]))  # everything saved: nothing reruns
    assert calls == []
    race.report(json.loads(path.read_text()))
    out = capsys.readouterr().out
    assert "| DiffusionNFT | 0.01 | 2/2 | 4.5 | yes |" in out and "| DiffusionNFT | 0.03 | 1/2 |" in out
    assert "| DanceGRPO | 0.01 | 3/3 | 3.5 |" in out  # reached at iteration 6: 7 x 0.5 CPU s
    assert "| MixGRPO-Flash | 0.003 | 3/3 | 3.0 |" in out and "| 3 / 0 / 0 | — | 3 / 0 / 0 | 12 ± 0 | 0.500 ± 0.000 |" in out


def test_tuning_seeds_must_be_held_out_and_a_file_of_another_race_is_refused(race, tmp_path, monkeypatch):
    import iteration

    monkeypatch.setattr(race, "run_cell", _fake_cell([]))  # a missing check must not start real training
    monkeypatch.setattr(iteration, "build_inputs", lambda *a: (None, None))
    with pytest.raises(SystemExit, match="overlap in \\[2\\]"):
        race.tuned_race(_args(race, None, tune_seeds=[101, 2], seeds=[1, 2]))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"target": 0.05}))
    with pytest.raises(SystemExit, match="holds another race"):
        race.tuned_race(_args(race, other))


def test_a_stopped_tuning_compares_its_lrs_on_the_seeds_run_at_every_lr(race):
    # 3e-2 has one more seed, reached: counted, it would win 2 to 1; on the common seed 101 both reach
    # and 1e-2 is faster (3.0 against 4.0 CPU s)
    tuning = {"0.01": {m: {"101": _rows(5)} for m in race.METHODS},
              "0.03": {m: {"101": _rows(7), "102": _rows(5)} for m in race.METHODS}}
    assert race.choose({"target": 0.04, "tuning": tuning}) == {m: 0.01 for m in race.METHODS}


def test_the_best_existing_method_and_the_sign_tests_of_the_new_ones(race):
    # Flash reaches on 3 of 4 seeds, DanceGRPO on 4 (slower): most seeds reached first, as best_lr
    times = {"full": [3.0, 3.0, 3.0, 3.0], "flash": [1.0, 1.0, 1.0, None], "nft": [2.0, 2.0, 2.0, 2.0]}
    assert race.best_of(times) == "nft"  # 4/4 like DanceGRPO, lower upper median (2 < 3)
    assert race.best_of({"full": [1.0, None], "flash": [1.0, None]}) == "full"  # a full tie: the first named
    # a new method earlier on 5 seeds, later on 1, tied (both unfinished) on 1: p(>= 5 of 6) = 7/64
    new, best = [1.0, 1.0, 1.0, 1.0, 1.0, 9.0, None], [2.0, 2.0, 2.0, 2.0, 2.0, 1.0, None]
    assert race.sign_against(new, best) == f"{7 / 64:.3g}; {63 / 64:.3g}"
    assert race.sign_against(best, new) == f"{63 / 64:.3g}; {7 / 64:.3g}"


def test_new_methods_join_a_held_race_without_rerunning_its_cells(race, tmp_path, monkeypatch, capsys):
    """A race file holding full / flash / nft cells: a rerun with the new methods runs only them, each
    cell at the CPU seconds of the reference run it holds (not rerun), and the report gives every new
    method's sign test against the best existing method (here MixGRPO-Flash)."""
    import iteration

    calls = []
    monkeypatch.setattr(race, "run_cell", _fake_cell([]))
    monkeypatch.setattr(iteration, "build_inputs", lambda *a: (None, None))
    path = tmp_path / "race.json"
    race.tuned_race(_args(race, path))  # the held race: full, flash, nft

    def run_new(inputs, tmp, seed, modes, iterations, budget=None):
        calls.append((seed, sorted(modes), budget))
        return {m: _rows(None, n=30) if m == "awm" else _rows(5, cpu=0.25, n=30) for m in modes}

    monkeypatch.setattr(race, "run_cell", run_new)
    saved = race.tuned_race(_args(race, path, methods=["awm", "dgpo"], limit_seeds=2))
    assert len(calls) == 2 * 3 + 2 and all(c[1] == ["awm", "dgpo"] for c in calls)
    assert all(c[2] == 12 * 0.5 for c in calls)  # the held DanceGRPO run's 12 iterations x 0.5 CPU s
    assert saved["chosen"]["dgpo"] == 0.003 and set(saved["race"]["awm"]) == {"1", "2"}
    race.report(saved)
    out = capsys.readouterr().out
    assert "2 race seeds held by every method: 1, 2; best existing method: MixGRPO-Flash" in out
    # DGPO reaches at iteration 5 at 0.25 CPU s each (1.5 s), Flash at 5 at 0.5 (3.0): earlier on both seeds,
    # p 0.25; AWM never: later on both
    assert "| DGPO | 0.003 | 2/2 | 1.5 |" in out
    race_table = out.split("best existing method")[1]
    dgpo = next(line for line in race_table.splitlines() if line.startswith("| DGPO |"))
    awm = next(line for line in race_table.splitlines() if line.startswith("| AWM |"))
    assert dgpo.endswith("| 0.25; 1 |") and awm.endswith("| 1; 0.25 |") and "| not reached |" in awm
    flash = next(line for line in race_table.splitlines() if line.startswith("| MixGRPO-Flash |"))
    assert flash.endswith("| — |")
