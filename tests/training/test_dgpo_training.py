"""--algorithm dgpo end to end on the tiny FLUX: 2 gloo ranks under FSDP2 (fully_shard), full
fine-tuning and LoRA, the DSM clip against the old policy and the KL term, resumed bit for bit from
its first checkpoint (weights and old policy)."""

from __future__ import annotations

import pytest

from helpers import resumed_metrics, run_and_resume, same_checkpoint_file

DGPO = dict(algorithm="dgpo", save_images_every=0, checkpointing_steps=1, max_train_steps=2, sampling_steps=4,
            timestep_fraction=0.5, kl_coef=0.01, dgpo_beta=10, clip_range=0.05, fsdp_version=2)


@pytest.mark.slow
def test_dgpo_trains_two_ranks_and_resumes_exactly(tiny_flux_dir, tiny_embeddings, tmp_path):
    """One straight run and one resumed (the module's only runs)."""
    straight, resumed = run_and_resume(tmp_path, tiny_embeddings, tiny_flux_dir, **DGPO)
    rows = resumed_metrics(straight, resumed, ("reward_mean", "loss", "grad_norm", "dgpo_dsm", "dgpo_ref_gap",
                                               "dgpo_weight", "clip_fraction", "kl", "old_decay"))
    for r in rows:
        assert r["grad_norm"] == r["grad_norm"] and r["grad_norm"] > 0 and r["skipped_steps"] == 0
    # iteration 1: the policy is the base and the old policy (d = d_ref, s_G = 0, no clip)
    assert rows[0]["dgpo_ref_gap"] == 0.0 and rows[0]["dgpo_weight"] == 0.5 and rows[0]["clip_fraction"] == 0.0
    assert rows[0]["kl"] == 0.0 and rows[0]["old_decay"] == pytest.approx(0.001)
    # iteration 2: one step away from both
    assert rows[1]["dgpo_ref_gap"] != 0.0 and rows[1]["dgpo_weight"] != 0.5 and rows[1]["kl"] > 0
    assert rows[1]["old_decay"] == pytest.approx(0.002)
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2")
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2", "old_policy.safetensors")


@pytest.mark.slow
def test_dgpo_with_lora_under_fsdp2_resumes_exactly(tiny_flux_dir, tiny_embeddings, tmp_path):
    """DGPO's adapters (the old policy and the reference are the adapters' own states) under FSDP2:
    trains and resumes bit for bit."""
    lora = dict(use_lora=True, lora_rank=4, lora_alpha=8)
    straight, resumed = run_and_resume(tmp_path, tiny_embeddings, tiny_flux_dir, **DGPO, **lora)
    rows = resumed_metrics(straight, resumed, ("reward_mean", "loss", "grad_norm", "dgpo_dsm", "dgpo_ref_gap", "kl"))
    assert all(r["grad_norm"] > 0 for r in rows) and rows[1]["dgpo_ref_gap"] != 0.0
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2", "pytorch_lora_weights.safetensors")
