"""Pass counts and FLOPs of the sampling plans (DanceGRPO, MixGRPO, Flash, Fast) and the bench table."""

import importlib.util
import json
from pathlib import Path

import pytest

from fastvideo.perf import flops as F
from fastvideo.models.flux import flops as FX
from fastvideo.tools import cost_model


@pytest.mark.parametrize("kw, expected", [
    (dict(), (16, 9)),  # DanceGRPO: 16 passes, int(15 * 0.6) = 9 trained
    (dict(window=4), (16, 4)),
    (dict(window=4, window_start=3), (16, 4)),
    (dict(window=4, dpm_post_ratio=0.4), (4 + 4, 4)),  # last SDE 3: int(13 * 0.4) = 5 points -> 4 DPM steps
    (dict(window=2, window_start=14), (16, 1)),  # clipped to the 15 candidates
])
def test_plan_steps(kw, expected):
    assert F.plan_steps(16, 15, 9, **kw) == expected


def test_pass_counts_by_hand():
    c = F.pass_counts(rollout_steps=11, trained_steps=4, samples=12, rollout_batch_size=4, micro_batch_size=5)
    assert (c.rollout_forward_samples, c.update_forward_samples, c.update_backward_samples) == (132, 48, 48)
    assert (c.rollout_calls, c.update_calls) == (3 * 11, 3 * 4)
    assert c.block_calls(57, False) == 57 * (33 + 12) and c.block_calls(57, True) == 57 * (33 + 24)


def _json(capsys, *argv):
    cost_model.main(["--json", *argv])
    return json.loads(capsys.readouterr().out)


def test_cost_model_mixgrpo_and_flash_ratios(capsys):
    fwd = FX.transformer_forward_flops(FX.FLUX_DEV, 2025, 512)
    bwd = FX.transformer_backward_flops(FX.FLUX_DEV, 2025, 512)
    dec = F.vae_decoder_flops(FX.FLUX_DEV_VAE_CONFIG, 90, 90)

    def model(n, t):  # per sample, model FLOPs (no recompute)
        return n * fwd + t * (fwd + bwd) + dec

    mix = _json(capsys, "--sampling_steps", "25", "--training_strategy", "part", "--group_size", "4")
    assert mix["sampling_steps"] == 25 and mix["trained_steps"] == 4
    assert mix["vs"]["full_sde_same_steps"]["model_flops_ratio"] == pytest.approx(model(25, 4) / model(25, 14))
    assert mix["vs"]["dancegrpo_reference"]["model_flops_ratio"] == pytest.approx(model(25, 4) / model(16, 9))
    flash = _json(capsys, "--sampling_steps", "25", "--training_strategy", "part", "--dpm_algorithm_type",
                  "dpmsolver++", "--dpm_post_compress_ratio", "0.4")
    assert flash["sampling_steps"] == 11  # 4 SDE + 7 DPM-Solver++ passes
    assert flash["vs"]["full_sde_same_steps"]["model_flops_ratio"] == pytest.approx(model(11, 4) / model(25, 14))
    fast = _json(capsys, "--sde_steps", "2", "--window_start", "5")
    assert (fast["sampling_steps"], fast["trained_steps"]) == (16, 2)
    # --dpm_apply_strategy all keeps the full schedule: no fewer passes than the Euler window
    dpm_all = _json(capsys, "--sampling_steps", "25", "--training_strategy", "part", "--dpm_algorithm_type",
                    "dpmsolver++", "--dpm_apply_strategy", "all")
    assert (dpm_all["sampling_steps"], dpm_all["trained_steps"]) == (25, 4)
    with pytest.raises(SystemExit):
        cost_model.main(["--dpm_algorithm_type", "dpmsolver++"])


def test_iteration_bench_modes_check_the_counts(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location(
        "bench_iteration", Path(__file__).resolve().parents[2] / "bench" / "iteration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(mod.MODES, "mixgrpo", (6, mod.MIXGRPO[:3] + ["2"] + mod.MIXGRPO[4:]))
    monkeypatch.setattr("sys.argv", ["iteration.py", "--preset", "tiny", "--size", "32", "--steps", "6",
                                     "--generations", "2", "--rollout_batch_size", "2", "--iterations", "1",
                                     "--micro", "2", "--modes", "full", "mixgrpo", "fast"])
    mod.main()
    rows = [ln.split(" | ") for ln in capsys.readouterr().out.splitlines() if ln.startswith(("| full", "| mixgrpo",
                                                                                              "| fast"))]
    assert [r[2] for r in rows] == ["SSSSSS", "SSOOOO", rows[2][2]] and rows[2][2].count("S") == 2
    assert [r[3] for r in rows] == ["18/18", "16/16", "16/16"]  # 2 samples x (6 + T) with T = 3, 2, 2
    assert all(r[4].endswith("ok") for r in rows)
