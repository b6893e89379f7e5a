"""--algorithm awm end to end on the tiny FLUX: 2 gloo ranks under FSDP, LoRA with the KL term to the
frozen base (the adapters switched off) and Flow-Factory's EMA-KL (--awm_ema_kl_beta: the EMA of the
adapters, checkpointed), resumed bit for bit from its first checkpoint; its terms logged."""

from __future__ import annotations

import pytest

from helpers import resumed_metrics, run_and_resume, same_checkpoint_file

AWM = dict(algorithm="awm", save_images_every=0, checkpointing_steps=1, max_train_steps=2, sampling_steps=4,
           timestep_fraction=0.5, train_micro_batch_size=1, kl_coef=0.1, awm_weighting="ghuber",
           use_lora=True, lora_rank=4, lora_alpha=8, awm_ema_kl_beta=0.1, awm_ema_warmup=2)


@pytest.fixture(scope="module")
def awm_runs(tiny_flux_dir, tiny_embeddings, tmp_path_factory):
    return run_and_resume(tmp_path_factory.mktemp("awm"), tiny_embeddings, tiny_flux_dir, **AWM)


@pytest.mark.slow
def test_awm_trains_two_ranks_and_resumes_exactly(awm_runs):
    straight, resumed = awm_runs
    rows = resumed_metrics(straight, resumed, ("reward_mean", "loss", "grad_norm", "awm_log_prob", "ratio_mean",
                                               "kl", "ema_kl"))
    for r in rows:
        assert r["grad_norm"] == r["grad_norm"] and r["grad_norm"] > 0 and r["skipped_steps"] == 0
        assert r["ratio_mean"] == 1.0 and r["clip_fraction"] == 0.0  # on-policy: old = current, detached
        assert r["awm_log_prob"] < 0  # -w(l, t) of a non-zero matching error
    # the base until the first optimizer step (after the first of a rank's two micro-batches), then apart
    assert 0 < rows[0]["kl"] and 0 < rows[1]["kl"]
    assert "first_ratio_dev" not in rows[0] and "guard_bias" not in rows[0]
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2", "pytorch_lora_weights.safetensors")
    # the EMA: the adapters at iteration 1's end (decay 0), then moved by 0.15; restored on resume, bit for bit
    assert rows[1]["ema_kl"] > 0
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2", "awm_ema.safetensors")


@pytest.mark.slow
def test_awm_with_lora_and_ema_kl_under_fsdp2_resumes_exactly(tiny_flux_dir, tiny_embeddings, tmp_path):
    """The same AWM run under FSDP2 (fully_shard): trains, and the adapters and the EMA resume bit for bit."""
    straight, resumed = run_and_resume(tmp_path, tiny_embeddings, tiny_flux_dir, **AWM, fsdp_version=2)
    rows = resumed_metrics(straight, resumed, ("reward_mean", "loss", "grad_norm", "kl", "ema_kl"))
    assert all(r["grad_norm"] > 0 for r in rows) and rows[1]["ema_kl"] > 0
    for name in ("pytorch_lora_weights.safetensors", "awm_ema.safetensors"):
        assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2", name), name
