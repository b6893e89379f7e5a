"""FLUX.1-schnell-shaped models (no guidance embedding) train: 2 iterations on the tiny one."""

from __future__ import annotations

import pytest
import torch

from helpers import single_process_trainer, train_args


@pytest.mark.slow
def test_schnell_trains_two_iterations(tiny_schnell_dir, tiny_embeddings, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from fastvideo.distributed.fsdp import full_model_state_dict

    argv = train_args(tiny_embeddings, tiny_schnell_dir, tmp_path / "run", max_train_steps=2, save_images_every=0,
                      checkpointing_steps=100, fsdp_sharding_strategy="none", shift=1)
    trainer = single_process_trainer(argv, monkeypatch)
    records = [trainer.run_iteration() for _ in range(2)]
    assert [r["iteration"] for r in records] == [1, 2]
    assert all(r["grad_norm"] == r["grad_norm"] and r["grad_norm"] > 0 for r in records)
    base = load_file(str(next((tiny_schnell_dir / "transformer").glob("*.safetensors"))))
    trained = full_model_state_dict(trainer.model)
    assert any(not torch.equal(trained[k], base[k]) for k in base)
