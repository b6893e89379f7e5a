"""--algorithm flash_grpo end to end on the tiny FLUX: 2 gloo ranks, one Flash SDE step per iteration
(the rest ODE) trained with the rectified clipped ratio and the KL term, resumed bit for bit from its
first checkpoint; its terms logged. Full weights under FSDP1, and LoRA under FSDP2 (fully_shard: the
authors' recipe is LoRA, its KL reference the adapters switched off)."""

from __future__ import annotations

import pytest
import torch

from helpers import resumed_metrics, run_and_resume, same_checkpoint_file

FLASH = dict(algorithm="flash_grpo", save_images_every=0, checkpointing_steps=1, max_train_steps=2,
             sampling_steps=4, eta=1.0, kl_coef=0.01, clip_range=1e-3)


@pytest.mark.slow
def test_flash_grpo_trains_two_ranks_and_resumes_exactly(tiny_flux_dir, tiny_embeddings, tmp_path):
    """One straight run and one resumed (the module's only runs)."""
    from fastvideo.algorithms.flash_grpo.loss import rectification_weights
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.sde import sigma_schedule

    straight, resumed = run_and_resume(tmp_path, tiny_embeddings, tiny_flux_dir, **FLASH)
    rows = resumed_metrics(straight, resumed, ("reward_mean", "loss", "grad_norm", "ratio_mean", "clip_fraction",
                                               "kl", "flash_tgr", "flash_step"))
    for r in rows:
        assert r["grad_norm"] == r["grad_norm"] and r["grad_norm"] > 0 and r["skipped_steps"] == 0
        # the iteration's step: the run's window draw among the first int(4 x 0.5) = 2 transitions
        step = RandomSource(7).window_start(r["iteration"], 2)  # helpers.train_args: --seed 7
        assert r["flash_step"] == step
        w = rectification_weights(sigma_schedule(4, 3.0), torch.tensor([step]), 2, 1.0)
        assert r["flash_tgr"] == pytest.approx(float(w), rel=1e-6) and r["flash_tgr"] != 1.0
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] > 0  # the base until the first optimizer step
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2")


@pytest.mark.slow
def test_flash_grpo_lora_under_fsdp2_trains_two_ranks_and_resumes_exactly(tiny_flux_dir, tiny_embeddings, tmp_path):
    """LoRA (rank 4) under --fsdp_version 2 with the KL term: the reference is the adapters switched off
    (zero at the first iteration, B starts at zero), the resumed run equal bit for bit, adapters only saved."""
    straight, resumed = run_and_resume(tmp_path, tiny_embeddings, tiny_flux_dir, **FLASH, use_lora=True,
                                       lora_rank=4, lora_alpha=8, fsdp_version=2)
    rows = resumed_metrics(straight, resumed, ("reward_mean", "loss", "grad_norm", "ratio_mean", "clip_fraction",
                                               "kl", "flash_tgr", "flash_step"))
    for r in rows:
        assert r["grad_norm"] == r["grad_norm"] and r["grad_norm"] > 0 and r["skipped_steps"] == 0
        assert r["flash_step"] == flash_step_of(r["iteration"])
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] > 0
    assert same_checkpoint_file(straight / "checkpoint-2", resumed / "checkpoint-2", "pytorch_lora_weights.safetensors")
    assert not (straight / "checkpoint-2" / "diffusion_pytorch_model.safetensors").exists()


def flash_step_of(iteration: int) -> int:
    """The iteration's Flash step of helpers.train_args' --seed 7 among the first 2 of 4 transitions."""
    from fastvideo.sampling.randomness import RandomSource

    return RandomSource(7).window_start(iteration, 2)
