"""--vae_precision: which dtype the VAE decodes rollouts in, and what bf16 changes."""

from __future__ import annotations

import torch

from helpers import single_process_trainer, train_args
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)


def test_vae_dtype_for_each_choice():
    from fastvideo.training.builders import vae_dtype_for

    cpu = torch.device("cpu")
    assert vae_dtype_for("auto", cpu) == torch.float32
    assert vae_dtype_for("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert vae_dtype_for("fp32", torch.device("cuda", 0)) == torch.float32
    assert vae_dtype_for("bf16", cpu) == torch.bfloat16


def test_bf16_vae_decodes_close_to_fp32_in_the_trainer(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    """The same rollout decoded by an fp32 and a bf16 VAE: the trainer really loads the VAE in the
    chosen dtype, and the bf16 images differ from fp32 by bf16 rounding only."""
    from fastvideo.sampling.rollout import decode_images

    vaes = {}
    for precision in ("fp32", "bf16"):
        argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / precision, vae_precision=precision,
                          fsdp_sharding_strategy="none", save_images_every=0)
        trainer = single_process_trainer(argv, monkeypatch)
        vaes[precision] = trainer.vae
        if trainer.scorer is not None:
            trainer.scorer.close()
    assert next(vaes["fp32"].parameters()).dtype == torch.float32
    assert next(vaes["bf16"].parameters()).dtype == torch.bfloat16
    x0 = torch.randn(4, 4, 64, generator=torch.Generator().manual_seed(1))
    images = {p: decode_images(v, x0, trainer.rollout_cfg, "cpu", family=FLUX) for p, v in vaes.items()}
    assert images["bf16"].dtype == torch.float32
    diff = (images["bf16"] - images["fp32"]).abs().max().item()
    assert 0 < diff < 0.05, diff
