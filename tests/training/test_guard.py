"""The reward-hacking guard's decisions and the published best checkpoint (pure, no training)."""

import json
import os

import pytest

import torch

from fastvideo.training.run.guard import AUTO_Z, RewardHackingGuard, publish_best, standard_error


def _run(guard, rows):
    return [guard.update(it, t, g) for it, t, g in rows]


def test_fires_after_patience_hacking_evaluations_in_a_row():
    guard = RewardHackingGuard(patience=2, drop=0.05)
    rows = [(0, 1.0, 0.50), (2, 1.2, 0.52), (4, 1.3, 0.46), (6, 1.4, 0.45), (8, 1.5, 0.44)]
    d = _run(guard, rows)
    # guard best 0.52 from iteration 2; 0.46 < 0.47 counts, so 4 and 6 are hacking
    assert [x.hacking for x in d] == [False, False, True, True, True]
    assert [x.streak for x in d] == [0, 0, 1, 2, 3]
    assert [x.fired for x in d] == [False, False, False, True, True]
    assert guard.best_iteration == 2 and guard.best_score == 1.2
    assert "iteration 6" in guard.message(6, 1.4, "detail", 0.45)


def test_a_fall_within_drop_or_without_a_trained_gain_is_not_hacking():
    guard = RewardHackingGuard(patience=1, drop=0.1)
    d = _run(guard, [(0, 1.0, 0.5), (1, 1.1, 0.45), (2, 0.9, 0.1), (3, 1.05, 0.39)])
    # 0.45 is within 0.1 of 0.5; at 2 the trained score is below the base; 3 counts
    assert [x.hacking for x in d] == [False, False, False, True]
    assert d[3].fired and guard.best_iteration == 1


def test_streak_resets_and_best_ignores_flagged_evaluations():
    guard = RewardHackingGuard(patience=3, drop=0.0)
    d = _run(guard, [(0, 0.0, 1.0), (1, 5.0, 0.9), (2, 1.0, 1.1), (3, 9.0, 1.0), (4, 2.0, 1.2)])
    assert [x.streak for x in d] == [0, 1, 0, 1, 0]
    assert not any(x.fired for x in d)
    # 1 and 3 score highest but were flagged; of 2 and 4 the higher trained score wins
    assert guard.best_iteration == 4
    assert [x.new_best for x in d] == [False, False, True, False, True]


def test_without_a_guard_best_is_the_highest_trained_score():
    guard = RewardHackingGuard(guard_enabled=False)
    d = _run(guard, [(0, 2.0, None), (1, 1.0, None), (2, 3.0, None), (3, 3.0, None)])
    assert not any(x.hacking for x in d)
    assert guard.best_iteration == 2  # iteration 0 (the base model) is never 'best'; ties keep the first


def test_best_is_never_worse_than_the_base_models_evaluation(tmp_path):
    """A run that only got worse publishes no best/ (it would be worse than the model it started from)."""
    guard = RewardHackingGuard(guard_enabled=False)
    d = _run(guard, [(0, 9.0, None), (1, 1.0, None), (2, 3.0, None), (3, 9.0, None), (4, 8.0, None)])
    assert [x.new_best for x in d] == [False, False, False, True, False] and guard.best_iteration == 3
    hacked = RewardHackingGuard(patience=1, drop=0.05)
    _run(hacked, [(0, 1.0, 0.5), (1, 1.2, 0.6), (2, 1.3, 0.4)])
    text = hacked.message(2, 1.3, "detail", 0.4, tmp_path / "run")
    assert f"Best checkpoint so far: iteration 1 ({tmp_path / 'run' / 'best'})." in text and "OUTPUT_DIR" not in text


def test_standard_error_is_std_over_sqrt_n_of_the_finite_scores():
    scores = torch.tensor([[0.1, 0.3, 0.2], [0.5, float("nan"), 0.4]])
    finite = [0.1, 0.3, 0.2, 0.5, 0.4]
    mean = sum(finite) / 5
    var = sum((x - mean) ** 2 for x in finite) / 4  # the sample variance
    assert standard_error(scores) == pytest.approx((var / 5) ** 0.5, rel=1e-12)
    assert standard_error(torch.tensor([0.3])) == 0.0


def test_auto_drop_ignores_noise_and_catches_a_fall_beyond_two_standard_errors():
    """The default (drop None): a fall counts beyond AUTO_Z * sqrt(se_best^2 + se_now^2)."""
    guard = RewardHackingGuard(patience=1)  # auto
    # the LoRA demo's case: detail 0.1426 -> 0.1425 with a standard error of 0.002 is noise
    d = [guard.update(0, 1.0, 0.1426, 0.002), guard.update(1, 1.1, 0.1425, 0.002)]
    assert not d[1].hacking and guard.threshold == pytest.approx(AUTO_Z * (2 * 0.002 ** 2) ** 0.5)
    # 0.1426 - 0.137 = 0.0056 is more than 2 * sqrt(0.002^2 + 0.001^2) = 0.00447: a fall
    assert guard.update(2, 1.2, 0.137, 0.001).hacking
    assert not guard.update(3, 1.2, 0.139, 0.001).hacking  # 0.0036 < 0.00447
    # a new best takes its own standard error for the comparisons after it
    guard.update(4, 1.0, 0.2, 0.0)
    assert guard.update(5, 1.3, 0.199, 0.0).hacking  # no noise measured: any fall counts
    assert "more than 0 below its best 0.2" in guard.message(5, 1.3, "detail", 0.199)


def test_a_fixed_drop_overrides_the_measured_noise():
    guard = RewardHackingGuard(patience=1, drop=0.0)
    guard.update(0, 1.0, 0.1426, 0.01)
    assert guard.update(1, 1.1, 0.1425, 0.01).hacking


def test_guard_needs_its_score_and_sane_settings():
    with pytest.raises(ValueError, match="no guard score"):
        RewardHackingGuard().update(0, 1.0, None)
    with pytest.raises(ValueError, match="patience"):
        RewardHackingGuard(patience=0)


def test_publish_best_survives_deleting_the_checkpoint(tmp_path):
    ckpt = tmp_path / "checkpoint-4"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights-4")
    (ckpt / "sub" / "x.bin").write_bytes(b"x")
    best = publish_best(ckpt, tmp_path, 4, 1.5)
    assert json.loads((best / "BEST.json").read_text()) == {"iteration": 4, "score": 1.5, "source": "checkpoint-4"}
    ckpt6 = tmp_path / "checkpoint-6"
    ckpt6.mkdir()
    (ckpt6 / "model.safetensors").write_bytes(b"weights-6")
    import shutil

    shutil.rmtree(ckpt)
    assert (best / "model.safetensors").read_bytes() == b"weights-4"
    assert (best / "sub" / "x.bin").read_bytes() == b"x"
    publish_best(ckpt6, tmp_path, 6, 2.0)
    assert (best / "model.safetensors").read_bytes() == b"weights-6"
    assert not (best / "sub").exists()
    assert sorted(os.listdir(tmp_path)) == ["best", "checkpoint-6"]  # no scratch folders left
