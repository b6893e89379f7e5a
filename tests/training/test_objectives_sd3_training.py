"""--algorithm awm, dgpo and flash_grpo end to end on the tiny SD3.5 (issue #49's bar): each trains 2
iterations on 2 gloo ranks and resumes bit for bit from its first checkpoint (no classifier-free
guidance, --guidance_scale 1, to keep the runs short)."""

from __future__ import annotations

import pytest

from helpers import resumed_metrics, run_and_resume, same_checkpoint_file

SD3 = dict(model_family="sd3", guidance_scale=1.0, save_images_every=0, checkpointing_steps=1, max_train_steps=2,
           sampling_steps=4)
RUNS = {
    "awm": (dict(timestep_fraction=0.5, train_micro_batch_size=1), ("awm_log_prob", "ratio_mean")),
    "dgpo": (dict(timestep_fraction=0.5, dgpo_beta=10, clip_range=0.05), ("dgpo_dsm", "dgpo_ref_gap", "dgpo_weight")),
    "flash_grpo": (dict(eta=1.0, clip_range=1e-3), ("ratio_mean", "flash_tgr", "flash_step")),
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(RUNS))
def test_objective_trains_tiny_sd3_two_ranks_and_resumes_exactly(algorithm, tiny_sd3_dir, sd3_sp_embeddings, tmp_path):
    flags, keys = RUNS[algorithm]
    straight, resumed = run_and_resume(tmp_path, sd3_sp_embeddings, tiny_sd3_dir, algorithm=algorithm, **SD3, **flags)
    rows = resumed_metrics(straight, resumed, ("reward_mean", "loss", "grad_norm") + keys)
    for r in rows:
        assert r["grad_norm"] == r["grad_norm"] and r["grad_norm"] > 0 and r["skipped_steps"] == 0
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2")
