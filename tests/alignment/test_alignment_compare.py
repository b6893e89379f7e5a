"""compare_runs on synthetic recorded runs: verdicts, first failing iteration, PSNR, loss trend,
usage errors, and the report's files."""

import json
import math

import numpy as np
import pytest
import torch
from alignment_helpers import record_run, sample_image
from PIL import Image

from fastvideo.alignment.compare import (
    DEFAULT_LAYER_TOL,
    RunFolderError,
    Thresholds,
    compare_runs,
    parse_layer_tol,
    pearson,
    psnr,
    relative_errors,
)
from fastvideo.tools.compare_runs import main


def _strict_json(path):
    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name} in {path}")

    return json.loads(path.read_text(), parse_constant=no_constants)


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory):
    return record_run(tmp_path_factory.mktemp("ref"), iterations=5, record_tensors=True)


def test_identical_runs_pass(ref_run, tmp_path, capsys):
    twin = record_run(tmp_path / "twin", iterations=5, record_tensors=True)
    assert main([str(ref_run), str(twin), "--out", str(tmp_path / "out")]) == 0
    assert "PASS" in capsys.readouterr().out
    summary = _strict_json(tmp_path / "out" / "summary.json")
    assert summary["verdict"] == "PASS"
    assert [it["reward"]["mean_rel"] for it in summary["iterations"]] == [0.0] * 5
    assert all(it["min_psnr"] == "inf" and it["max_pixel_diff"] == 0 for it in summary["iterations"])
    assert summary["iterations"][0]["tensors"]["initial_noise_max_rel"] == 0.0
    assert summary["loss_trend"]["corr"] == pytest.approx(1.0)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Verdict: **PASS**" in report


def test_reward_off_by_ten_percent_fails_at_the_right_iteration(ref_run, tmp_path, capsys):
    off = record_run(tmp_path / "off", iterations=5, reward_factor=lambda it: 1.10 if it >= 3 else 1.0)
    assert main([str(ref_run), str(off), "--out", str(tmp_path / "out")]) == 1
    summary = _strict_json(tmp_path / "out" / "summary.json")
    reward = next(c for c in summary["checks"] if c["name"] == "reward")
    assert reward["passed"] is False and reward["first_failing_iteration"] == 3
    rel = [it["reward"]["mean_rel"] for it in summary["iterations"]]
    assert rel[:2] == [0.0, 0.0] and rel[2:] == pytest.approx([0.10] * 3)
    assert summary["iterations"][2]["reward"]["max_rel"] == pytest.approx(0.10)
    assert "## Verdict: **FAIL**" in (tmp_path / "out" / "report.md").read_text()
    assert "iteration 3" in capsys.readouterr().out


def test_reward_tolerance_and_iteration_window(ref_run, tmp_path):
    off = record_run(tmp_path / "off", iterations=5, reward_factor=lambda it: 1.03 if it == 4 else 1.0)
    assert compare_runs(ref_run, off).passed  # 3% < the article's 5%
    strict = compare_runs(ref_run, off, Thresholds(reward_tol=0.02))
    assert not strict.passed and strict.checks[0].first_failing_iteration == 4
    assert compare_runs(ref_run, off, Thresholds(reward_tol=0.02, max_iterations=3)).passed
    assert [c.iteration for c in compare_runs(ref_run, off, Thresholds(max_iterations=3)).iterations] == [1, 2, 3]


def test_different_prompts_fail_with_a_reason(ref_run, tmp_path):
    other = record_run(tmp_path / "other", iterations=5, first_sample=lambda it: 100 + it * 8)
    cmp = compare_runs(ref_run, other)
    assert not cmp.passed
    assert "different prompts" in cmp.checks[0].detail and cmp.checks[0].first_failing_iteration == 1


def test_relative_error_and_pearson_match_numpy():
    a, b = np.array([1.0, -2.0, 0.5]), np.array([1.1, -2.0, 0.25])
    np.testing.assert_allclose(relative_errors(a, b), [0.1, 0.0, 0.5])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=20), rng.normal(size=20)
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])) and math.isnan(pearson([1.0], [2.0]))


def test_psnr_values():
    a = np.zeros((8, 8, 3), np.uint8)
    assert psnr(a, a) == math.inf
    assert psnr(a, a + 1) == pytest.approx(20 * math.log10(255))  # MSE 1
    b = a.copy()
    b[0, 0, 0] = 255  # MSE = 255^2 / 192
    assert psnr(a, b) == pytest.approx(10 * math.log10(192))


def _noisy(std):
    def image_fn(iteration, sample_id):
        img = sample_image(iteration, sample_id)
        if iteration >= 2:
            g = torch.Generator().manual_seed(7 + sample_id)
            img = (img + std * torch.randn(img.shape, generator=g)).clamp(0, 1)
        return img

    return image_fn


def test_image_psnr_and_threshold(ref_run, tmp_path):
    noisy = record_run(tmp_path / "noisy", iterations=5, image_fn=_noisy(0.05))
    cmp = compare_runs(ref_run, noisy)
    assert cmp.passed  # PSNR is reported, not judged, without --psnr_min
    it2 = cmp.iterations[1]
    for d in it2.images:  # independent recomputation from the PNG files
        x = np.asarray(Image.open(ref_run / "iter_000002" / "images" / d.name)).astype(np.float64)
        y = np.asarray(Image.open(noisy / "iter_000002" / "images" / d.name)).astype(np.float64)
        assert d.psnr == pytest.approx(10 * np.log10(255**2 / np.mean((x - y) ** 2)))
        assert d.max_abs_diff == int(np.abs(x - y).max())
    assert 20 < it2.min_psnr < 32  # 5% noise is about 26 dB
    assert cmp.iterations[0].min_psnr == math.inf
    judged = compare_runs(ref_run, noisy, Thresholds(psnr_min=35))
    images = next(c for c in judged.checks if c.name == "images")
    assert images.passed is False and images.first_failing_iteration == 2
    assert compare_runs(ref_run, noisy, Thresholds(psnr_min=15)).passed


def test_loss_trend(ref_run, tmp_path):
    scaled = record_run(tmp_path / "scaled", iterations=5, loss_fn=lambda it: 2 * (0.5 / it) + 0.1)
    cmp = compare_runs(ref_run, scaled, Thresholds(loss_corr_min=0.9))
    assert cmp.loss.corr == pytest.approx(1.0) and cmp.loss.diff_corr == pytest.approx(1.0)
    assert cmp.passed
    rising = record_run(tmp_path / "rising", iterations=5, loss_fn=lambda it: 0.1 * it)
    cmp = compare_runs(ref_run, rising, Thresholds(loss_corr_min=0.9))
    la = [0.5 / it for it in range(1, 6)]
    assert cmp.loss.corr == pytest.approx(np.corrcoef(la, [0.1 * it for it in range(1, 6)])[0, 1])
    assert not cmp.passed and next(c for c in cmp.checks if c.name == "loss_trend").passed is False
    assert compare_runs(ref_run, rising).passed  # the loss is not judged by default


def test_report_files_and_plots(ref_run, tmp_path):
    off = record_run(tmp_path / "off", iterations=5, reward_factor=lambda it: 1.0 + 0.02 * it,
                     image_fn=_noisy(0.05))
    assert main([str(ref_run), str(off), "--out", str(tmp_path / "out"), "--psnr_min", "10"]) == 1
    out = tmp_path / "out"
    report = (out / "report.md").read_text()
    for name in ("reward.png", "loss.png", "reward_rel_error.png", "psnr.png"):
        path = out / name
        assert path.stat().st_size > 5000, name
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size == (800, 450)
            assert np.asarray(im.convert("L")).std() > 5, f"{name} is blank"
        assert f"]({name})" in report
    assert "| 3 | 4 |" in report  # the per-iteration table: iteration 3, 4 samples
    assert "first differences" in report


def test_usage_errors(tmp_path, capsys):
    run = record_run(tmp_path / "run", iterations=1)
    assert main([str(tmp_path / "nope"), str(run), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "nope" in err
    (tmp_path / "empty").mkdir()
    assert main([str(run), str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "no recorded iterations" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([str(run), str(run), "--out", str(tmp_path / "o"), "--layer_tol", "rope=abc"])
    assert exc.value.code == 2
    with pytest.raises(RunFolderError):
        compare_runs(tmp_path / "nope", run)


def test_parse_layer_tol():
    assert parse_layer_tol(None) == DEFAULT_LAYER_TOL
    assert set(parse_layer_tol("1e-4").values()) == {1e-4}
    tol = parse_layer_tol("1e-4,vae=0.1")
    assert tol["vae"] == 0.1 and tol["rope"] == 1e-4
    with pytest.raises(ValueError, match="unknown kind"):
        parse_layer_tol("mlp=0.1")


def test_a_precision_difference_is_named_next_to_the_probe_verdict():
    """Probes run without autocast: an fp32 and a bf16 run agree there, which the report must say."""
    from fastvideo.alignment.compare import config_differences, precision_note

    a = {"config": {"model": {"mixed_precision": "no", "family": "flux"}, "fsdp_param_dtype": "fp32"}}
    b = {"config": {"model": {"mixed_precision": "bf16", "family": "flux"}, "fsdp_param_dtype": "fp32"}}
    note = precision_note(config_differences(a, b))
    assert note.startswith("the runs differ in precision (model.mixed_precision no vs bf16): the layer probes "
                           "run without autocast")
    assert precision_note(config_differences(a, a)) is None
