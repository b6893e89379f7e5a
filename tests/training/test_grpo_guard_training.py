"""GRPO with --policy_loss grpo_guard end to end on the tiny FLUX: 2 gloo ranks under FSDP, in
MixGRPO-Flash's setting (the SDE window, DPM-Solver++ after it, Flow-GRPO's SDE: the "Fast + Guard"
combination flow_grpo #192 reports collapsing on OCR), resumed bit for bit from its first checkpoint;
and the same under --fsdp_version 2 (fully_shard) with LoRA adapters, resumed bit for bit too.
Two micro-batches per rank: the first trains before any optimizer step (the current policy is the
rollout's: the ratio is 1 and the mean bias 0 up to rounding, which holds only if the old means are
rebuilt right), the second after one (a drift: the bias is positive)."""

from __future__ import annotations

import pytest

from helpers import resumed_metrics, run_and_resume, same_checkpoint_file

GUARD = dict(policy_loss="grpo_guard", save_images_every=0, checkpointing_steps=1, max_train_steps=2,
             train_micro_batch_size=1, training_strategy="part", group_size=2, iters_per_group=1,
             sample_strategy="progressive", prog_overlap=True, prog_overlap_step=1, roll_back=True,
             dpm_algorithm_type="dpmsolver++", dpm_post_compress_ratio=0.5, dpm_solver_type="midpoint",
             flow_grpo_sampling=True, eta=0.7, clip_range=1e-3)


KEYS = ("reward_mean", "loss", "grad_norm", "ratio_mean", "clip_fraction", "guard_bias", "first_ratio_dev")


@pytest.mark.slow
def test_grpo_guard_trains_two_ranks_and_resumes_exactly(tiny_flux_dir, tiny_embeddings, tmp_path):
    """One straight run and one resumed (the module's only runs)."""
    straight, resumed = run_and_resume(tmp_path, tiny_embeddings, tiny_flux_dir, **GUARD)
    rows = resumed_metrics(straight, resumed, KEYS)
    for r in rows:
        assert r["grad_norm"] == r["grad_norm"] and r["skipped_steps"] == 0  # finite
        # the first micro-batch scores the rollout's own policy: ratio 1 up to rounding (a wrong old
        # mean gives exp(b s) with b of order 1 / s^2: far from 1)
        assert r["first_ratio_dev"] < 1e-4, r["first_ratio_dev"]
        assert r["guard_bias"] > 0  # the second micro-batch follows an optimizer step
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2")


@pytest.mark.slow
def test_grpo_guard_under_fsdp2_and_lora_trains_and_resumes_exactly(tiny_flux_dir, tiny_embeddings, tmp_path):
    """GRPO-Guard's old means (the rollout's policy, rebuilt for each term) under FSDP2's DTensor shards
    and LoRA's adapters: the same checks, the adapters and the optimizer state bit for bit on resume."""
    flags = {**GUARD, "fsdp_version": 2, "use_lora": True, "lora_rank": 4, "lora_alpha": 8}
    straight, resumed = run_and_resume(tmp_path, tiny_embeddings, tiny_flux_dir, **flags)
    rows = resumed_metrics(straight, resumed, KEYS)
    for r in rows:
        assert r["grad_norm"] == r["grad_norm"] and r["grad_norm"] > 0 and r["skipped_steps"] == 0
        assert r["first_ratio_dev"] < 1e-4, r["first_ratio_dev"]
        assert r["guard_bias"] > 0
    for name in ("pytorch_lora_weights.safetensors", "optimizer.safetensors"):
        assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2", name), name
