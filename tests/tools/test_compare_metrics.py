"""python -m fastvideo.tools.compare_metrics: bit-for-bit comparison of two runs' logged numbers."""

import json
import math
import struct

import pytest

from fastvideo.tools.compare_metrics import EXIT_DIFFERENT, EXIT_EQUAL, EXIT_USAGE, compare_rows, main

ROWS = [
    {"iteration": 1, "reward_mean": -3.8326873779296875, "reward_std": 0.054659973829984665,
     "reward/compressibility_mean": -3.8326873779296875, "loss": 0.0016956627368927002,
     "grad_norm": 0.023539695888757706, "adv_mean": 5.736947059631348e-07, "ratio_mean": 0.9987843632698059,
     "clip_fraction": 0.0, "first_ratio_dev": 0.0, "lr": 0.003, "time_iteration": 1.4,
     "samples_per_s": 33.3, "peak_memory_gb": 0.79},
    {"iteration": 2, "reward_mean": -3.8113749027252197, "reward_std": 0.062075451016426086,
     "reward/compressibility_mean": -3.8113749027252197, "loss": -0.00014157406985759735,
     "grad_norm": 0.020722340792417526, "adv_mean": 3.427267074584961e-07, "ratio_mean": 0.9998719096183777,
     "clip_fraction": 0.0, "first_ratio_dev": 0.0, "lr": 0.003, "time_iteration": 0.9,
     "samples_per_s": 40.3, "peak_memory_gb": 0.80},
]


def next_ulp(x: float) -> float:
    """The float64 one unit in the last place above x (math.nextafter, by hand for clarity)."""
    bits = struct.unpack("<q", struct.pack("<d", x))[0]
    out = struct.unpack("<d", struct.pack("<q", bits + (1 if x >= 0 else -1)))[0]
    assert out == math.nextafter(x, math.inf)
    return out


def write_run(folder, rows, eval_rows=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if eval_rows is not None:
        (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
    return folder


def changed(rows, i, key, value):
    out = [dict(r) for r in rows]
    if value is None:
        del out[i][key]
    else:
        out[i][key] = value
    return out


def test_equal_runs_pass_and_timings_are_ignored(tmp_path, capsys):
    other = changed(changed(ROWS, 1, "time_iteration", 9.9), 0, "samples_per_s", 1.0)
    other = changed(other, 1, "peak_memory_gb", 5.0)
    assert compare_rows(ROWS, other, "metrics.jsonl") is None
    ev = [{"iteration": 0, "rewards": {"detail": {"mean": 0.14264211559202522, "per_prompt": [0.1, 0.2]}},
           "time_eval": 0.2}]
    a = write_run(tmp_path / "a", ROWS, ev)
    b = write_run(tmp_path / "b", other, [dict(ev[0], time_eval=3.0)])
    assert main([str(a), str(b)]) == EXIT_EQUAL
    out = capsys.readouterr().out
    assert "IDENTICAL: 2 iterations" in out and "eval.jsonl" in out
    assert "-3.8113749027252197 =" in out  # the table shows run A's value and '=' for run B


def test_one_ulp_is_a_difference(tmp_path, capsys):
    bumped = next_ulp(ROWS[1]["grad_norm"])
    assert bumped != ROWS[1]["grad_norm"] and abs(bumped - ROWS[1]["grad_norm"]) < 1e-17
    diff = compare_rows(ROWS, changed(ROWS, 1, "grad_norm", bumped), "metrics.jsonl")
    assert (diff.iteration, diff.row, diff.key) == (2, 2, "grad_norm")
    assert (diff.value_a, diff.value_b) == (ROWS[1]["grad_norm"], bumped)
    a, b = write_run(tmp_path / "a", ROWS), write_run(tmp_path / "b", changed(ROWS, 1, "grad_norm", bumped))
    assert main([str(a / "metrics.jsonl"), str(b), "--quiet"]) == EXIT_DIFFERENT
    out = capsys.readouterr().out
    assert "DIFFERENT: metrics.jsonl: iteration 2 (line 2), key 'grad_norm'" in out
    assert "!" not in out.splitlines()[0]  # --quiet: no table, the verdict alone


@pytest.mark.parametrize("a_value,b_value", [(0.0, -0.0), (1, 1.0)])
def test_sign_of_zero_and_int_vs_float_differ(a_value, b_value):
    diff = compare_rows(changed(ROWS, 0, "clip_fraction", a_value), changed(ROWS, 0, "clip_fraction", b_value), "m")
    assert diff is not None and diff.key == "clip_fraction"


def test_nan_equals_nan():
    rows = changed(ROWS, 0, "loss", float("nan"))
    assert compare_rows(rows, [dict(r) for r in rows], "m") is None


def test_missing_compared_key_is_a_difference(tmp_path, capsys):
    diff = compare_rows(ROWS, changed(ROWS, 0, "reward/compressibility_mean", None), "metrics.jsonl")
    assert (diff.iteration, diff.key) == (1, "reward/compressibility_mean")
    a, b = write_run(tmp_path / "a", ROWS), write_run(tmp_path / "b", changed(ROWS, 0, "loss", None))
    assert main([str(a), str(b)]) == EXIT_DIFFERENT
    assert "iteration 1 (line 1), key 'loss': 0.0016956627368927002 vs <missing>" in capsys.readouterr().out
    # a kl the new run starts logging is a difference too; a new bookkeeping key is not
    assert compare_rows(ROWS, changed(ROWS, 0, "kl", 0.5), "m").key == "kl"
    assert compare_rows(ROWS, changed(ROWS, 0, "new_counter", 3), "m") is None


def test_missing_or_extra_iteration_and_eval_file(tmp_path, capsys):
    diff = compare_rows(ROWS, ROWS[:1], "metrics.jsonl")
    assert (diff.row, diff.iteration, diff.key) == (2, 2, "<row>")
    ev = [{"iteration": 0, "rewards": {"detail": {"mean": 0.5}}}]
    a, b = write_run(tmp_path / "a", ROWS, ev), write_run(tmp_path / "b", ROWS)
    assert main([str(a), str(b)]) == EXIT_DIFFERENT
    assert "eval.jsonl" in capsys.readouterr().out
    c = write_run(tmp_path / "c", ROWS, [{"iteration": 0, "rewards": {"detail": {"mean": next_ulp(0.5)}}}])
    assert main([str(a), str(c)]) == EXIT_DIFFERENT
    assert "key 'rewards/detail/mean'" in capsys.readouterr().out


def test_usage_errors(tmp_path, capsys):
    a = write_run(tmp_path / "a", ROWS)
    assert main([str(a), str(tmp_path / "nowhere")]) == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err
    empty = write_run(tmp_path / "empty", [])
    assert main([str(a), str(empty)]) == EXIT_USAGE
    assert "is empty" in capsys.readouterr().err


def test_checker_script_refuses_an_unknown_base_ref():
    """scripts/check_bit_identical.sh stops before any run when BASE_REF names no commit."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(["bash", str(root / "scripts" / "check_bit_identical.sh"), "no-such-ref-xyz"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                                          "PYTHON": sys.executable})
    assert proc.returncode == 2
    assert "'no-such-ref-xyz' is not a commit" in proc.stderr
