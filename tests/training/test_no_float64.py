"""One full training iteration (rollout, decode, reward, advantages, update, metrics) does no
float64 or complex work on tensors that would live on the accelerator."""

from __future__ import annotations

import sys

import pytest
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from float64_guard import Float64OnDevice, NoFloat64OnDevice  # noqa: E402
from helpers import single_process_trainer, train_args  # noqa: E402
from fastvideo.algorithms.base import RewardResult  # noqa: E402


def test_guard_fails_on_deliberate_float64():
    x = torch.ones(3)
    with pytest.raises(Float64OnDevice, match="float64"):
        with NoFloat64OnDevice():
            x.double()
    with pytest.raises(Float64OnDevice, match="complex64"):
        with NoFloat64OnDevice():
            torch.polar(x, x)
    with NoFloat64OnDevice() as guard:
        (x * 2).sum()
    assert guard.ops == 2


def _cpu_float64(x):
    return x.double().sum().item()


def test_guard_allows_listed_cpu_code():
    with NoFloat64OnDevice(cpu_only=[_cpu_float64]):
        assert _cpu_float64(torch.ones(3)) == 3.0


@pytest.fixture
def as_on_npu(monkeypatch):
    """The stand-in torch_npu installed and the CPU treated as an NPU, so the model takes the NPU
    paths (fused norm and attention, float32 RoPE) exactly as it would on the device."""
    import npu_stub

    return npu_stub.install(monkeypatch)


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_one_iteration_without_float64(precision, as_on_npu, tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, tiny_flux_dir, tiny_embeddings, monkeypatch, precision)
    with NoFloat64OnDevice() as guard:
        record = trainer.run_iteration()
    assert guard.ops > 1000 and record["iteration"] == 1
    assert as_on_npu.calls["npu_rms_norm"] > 0  # the NPU paths really ran


def _trainer(tmp_path, tiny_flux_dir, tiny_embeddings, monkeypatch, precision="no"):
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path, mixed_precision=precision, max_train_steps=1,
                      fsdp_sharding_strategy="none", save_images_every=0, reward_overlap="off")
    return single_process_trainer(argv, monkeypatch)


def test_guard_catches_stock_diffusers_rope(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    """Without the NPU adaptation, diffusers computes RoPE in float64: the guard sees it."""
    trainer = _trainer(tmp_path, tiny_flux_dir, tiny_embeddings, monkeypatch)
    with pytest.raises(Float64OnDevice, match="float64"):
        with NoFloat64OnDevice():
            trainer.run_iteration()


def test_guard_catches_a_float64_advantage(as_on_npu, tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    """The same iteration as test_one_iteration_without_float64, with advantages computed in
    float64: caught."""
    trainer = _trainer(tmp_path, tiny_flux_dir, tiny_embeddings, monkeypatch)
    real = trainer.compute_advantages
    monkeypatch.setattr(trainer, "compute_advantages",
                        lambda rewards: real(RewardResult(rewards.total.double(), rewards.per_reward)).float())
    with pytest.raises(Float64OnDevice, match="float64"):
        with NoFloat64OnDevice():
            trainer.run_iteration()


@pytest.mark.parametrize("reference_weight", [False, True])
def test_nft_iteration_without_float64(reference_weight, as_on_npu, tiny_flux_dir, tiny_embeddings, tmp_path,
                                       monkeypatch):
    """--algorithm nft (bf16, KL): float64-free; the reference's float64 adaptive weight
    (DiffusionNFT computes mean |x0_pred - x0| in double) would be caught."""
    from fastvideo.algorithms import nft_loss

    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path, mixed_precision="bf16", max_train_steps=1,
                      fsdp_sharding_strategy="none", save_images_every=0, reward_overlap="off", algorithm="nft",
                      kl_coef=0.1)
    trainer = single_process_trainer(argv, monkeypatch)
    if reference_weight:
        def in_double(x0_pred, x0):
            err = x0_pred - x0
            w = (x0_pred.double() - x0.double()).abs().mean(dim=tuple(range(1, err.ndim))).clamp(min=1e-5)
            return err.square().mean(dim=tuple(range(1, err.ndim))) / w.float()

        monkeypatch.setattr(nft_loss, "_weighted_error", in_double)
        with pytest.raises(Float64OnDevice, match="float64"):
            with NoFloat64OnDevice():
                trainer.run_iteration()
        return
    with NoFloat64OnDevice() as guard:
        record = trainer.run_iteration()
    assert guard.ops > 1000 and record["iteration"] == 1 and record["kl"] == record["kl"]
