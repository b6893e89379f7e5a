"""tools/demo_figures: the README's demo figures rebuilt from the runs' own files (metrics.jsonl,
eval.jsonl, config.json), the machine named in the table's header."""

from __future__ import annotations

import json

import pytest

from fastvideo.tools import demo_figures


def _run(folder, rewards, evals, spec=("compressibility:1",)):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i + 1, "reward_mean": r,
                                                              "time_iteration": 0.5}) + "\n"
                                                  for i, r in enumerate(rewards)))
    (folder / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (folder / "config.json").write_text(json.dumps({"reward": {"spec": list(spec)}}))


def _eval(iteration, **means):
    return {"iteration": iteration, "rewards": {k: {"mean": v, "std": 0.1} for k, v in means.items()}}


def test_figures_are_the_fifths_and_the_guard_rewards_heldout(tmp_path):
    # 12 iterations: a fifth is 2 (a quarter would be 3)
    rewards = [-4.0, -3.8, -3.9, -3.7, -3.6, -3.5, -3.4, -3.2, -3.3, -3.6, -3.0, -3.3]
    _run(tmp_path / "outputs", rewards, [_eval(0, detail=9.0, compressibility=-3.9),
                                         _eval(10, detail=8.0, compressibility=-3.1)])
    f = demo_figures.run_figures("flux", tmp_path / "outputs")
    assert (f.line, f.iterations, f.heldout_iteration, f.seconds) == ("recipe", 12, 10, 6.0)
    assert f.first == pytest.approx(-3.9) and f.last == pytest.approx(-3.15)
    # the held-out figure is the run's first reward (its guard), not the first in the record
    assert (f.heldout_base, f.heldout_last) == (-3.9, -3.1)
    row = demo_figures.table([f], "a CPU").splitlines()[-1]
    assert row == "| flux | recipe | 12 | -3.900 -> -3.150 (+0.750) | -3.900 -> -3.100 (iteration 10) | 6 |"


def test_from_runs_writes_the_table_with_the_machine_and_refuses_unknown_demos(tmp_path, capsys):
    _run(tmp_path / "runs" / "outputs_wan", [-3.0, -2.0], [])
    _run(tmp_path / "runs" / "outputs_hunyuan_video", [-4.0, -3.5], [_eval(0, detail=1.0), _eval(10, detail=2.0)],
         spec=("detail:1",))
    out = tmp_path / "figures.md"
    assert demo_figures.main(["--out", str(out), "--demos", "wan,hunyuan_video",
                              "--from_runs", str(tmp_path / "runs")]) == 0
    text = out.read_text()
    assert text.startswith("Measured on: ") and "ATen kernels" in text and "torch " in text
    assert "| wan | current | 2 | -3.000 -> -2.000 (+1.000) | - | 1 |" in text
    # HunyuanVideo's demo runs on the recipe line (both lines run it; the demo's default)
    assert "| hunyuan_video | recipe | 2 | -4.000 -> -3.500 (+0.500) | 1.000 -> 2.000 (iteration 10) | 1 |" in text
    for bad in (["--demos", "flux3"], ["--demos", "flux"]):  # unknown; a run that is not there
        with pytest.raises(SystemExit) as exc:
            demo_figures.main(["--out", str(out), "--from_runs", str(tmp_path / "runs"), *bad])
        assert exc.value.code == 2
    assert "unknown flux3" in capsys.readouterr().err
