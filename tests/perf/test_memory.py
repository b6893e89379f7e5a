"""The memory model: the liveness simulation on known computations, the sharding arithmetic, the
verdict, and the CLI on the small preset."""

from __future__ import annotations

import json

import pytest
import torch

from fastvideo.perf import memory
from fastvideo.perf.live_bytes import LiveBytes


def test_live_bytes_counts_creation_to_death():
    x = torch.empty(1000, device="meta")  # exists before: not counted
    tracker = LiveBytes()
    with tracker:
        a = x * 2  # 4000 live
        b = a + 1  # 8000 live
        del a  # 4000
        c = b.view(10, 100)  # a view: no new storage
        d = c.t().contiguous()  # 8000 live: the peak ties
        b.mul_(3)  # in place: nothing new
        del b, c, d
        e = torch.empty(3000, device="meta")  # 12000 live alone
        del e
    assert tracker.peak == 12000 and tracker.current == 0


def test_live_bytes_sees_saved_activations_and_checkpointing():
    lin = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to("meta")
    x = torch.empty(32, 64, device="meta")
    peaks = []
    for ckpt in (False, True):
        tracker = LiveBytes()
        with tracker:
            y = torch.utils.checkpoint.checkpoint(lin, x, use_reentrant=False) if ckpt else lin(x)
            y.sum().backward()
        peaks.append(tracker.peak)
        lin.zero_grad(set_to_none=True)
    # Without checkpointing the [32, 256] hidden (pre- and post-GELU) and output are alive together.
    assert peaks[0] >= 2 * 32 * 256 * 4
    assert peaks[1] < peaks[0]


def _shape(**kw):
    base = dict(height=256, width=256, text_tokens=32, sampling_steps=4, samples_per_rank=8, rollout_batch=4,
                micro_batch=4, world_size=4, compute_dtype=torch.float32, rewards=("compressibility",))
    return memory.MemoryShape(**{**base, **kw})


def test_static_components_by_strategy():
    prof = memory.ModelProfile(params=1001, largest_block_params=100, root_params=50, update_activations=0,
                               rollout_activations=0, vae_params=0, vae_decode=0)
    full = memory.static_components(prof, _shape(strategy="full", use_ema=True))
    assert full["parameters"] == 251 * 4 and full["adamw_states"] == 2 * 251 * 4 and full["ema"] == 251 * 4
    assert full["fsdp_unsharded"] == (2 * 100 + 50) * 4 and full["fsdp_unsharded_grads"] == 400
    hybrid = memory.static_components(prof, _shape(strategy="hybrid", ranks_per_node=2, world_size=8))
    assert hybrid["parameters"] == 501 * 4
    ddp = memory.static_components(prof, _shape(strategy="none", master_bytes=2))
    assert ddp["parameters"] == ddp["gradients"] == ddp["ddp_buckets"] == 1001 * 2 and ddp["ema"] == 0
    offload = memory.static_components(prof, _shape(strategy="full", cpu_offload=True))
    assert offload["parameters"] == offload["adamw_states"] == 0


def test_verdict():
    est = memory.MemoryEstimate(peak_bytes=int(70.5e9))
    assert est.verdict(80) == "fits in 80 GB, with 9.5 GB to spare"
    assert est.verdict(64) == "does not fit in 64 GB, by 6.5 GB"


def test_cli_small_preset(capsys):
    from fastvideo.tools.cost_model import main

    main(["--memory", "--json", "--model", "small", "--world_size", "2", "--device", "npu", "--h", "256", "--w", "256",
          "--text_tokens", "32", "--sampling_steps", "4", "--num_generations", "8", "--rollout_batch_size", "4",
          "--train_micro_batch_size", "4", "--hccl_buffsize_mb", "100", "--device_memory_gb", "1"])
    out = json.loads(capsys.readouterr().out)
    assert out["peak_bytes"] == max(out["phases"].values())
    assert out["components"]["hccl_buffers"] == 2 * 100 * 2**20
    assert out["verdict"].startswith("does not fit in 1 GB") or out["verdict"].startswith("fits in 1 GB")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["--memory", "--model", "small", "--fsdp_sharding_strategy", "hybrid"])
    assert exc.value.code == 2 and "ranks_per_node" in capsys.readouterr().err


def test_gradients_and_activations_peak_apart_without_accumulation():
    prof = memory.ModelProfile(params=1000, largest_block_params=100, root_params=0, update_activations=5000,
                               rollout_activations=0, vae_params=0, vae_decode=0)
    cfg = {"in_channels": 64, "joint_attention_dim": 8, "pooled_projection_dim": 4}
    held = memory.estimate(cfg, {}, _shape(strategy="none", world_size=2), prof)
    apart = memory.estimate(cfg, {}, _shape(strategy="none", world_size=2, grads_held=False), prof)
    assert held.peak_bytes - apart.peak_bytes == 1000 * 4  # no gradients yet at the activation peak
    assert apart.components["gradients"] == 0 and apart.components["ddp_buckets"] == 4000


def test_nft_old_policy_is_a_float32_copy_of_the_shards_and_a_rollout_backup():
    """--algorithm nft keeps its old policy (float32, sharded like the master weights, whatever
    their dtype) all iteration, and the trained shards' backup while it samples the rollout."""
    prof = memory.ModelProfile(params=1001, largest_block_params=100, root_params=50, update_activations=0,
                               rollout_activations=0, vae_params=0, vae_decode=0)
    cfg = {"in_channels": 64, "joint_attention_dim": 8, "pooled_projection_dim": 4}
    grpo, nft = (memory.estimate(cfg, {}, _shape(master_bytes=2, weight_copies=c), prof) for c in (0, 1))
    assert nft.components["weight_copies"] == 251 * 4 and grpo.components["weight_copies"] == 0
    assert nft.phases["rollout"] - grpo.phases["rollout"] == 251 * 4 + 251 * 2  # the copy and the bf16 backup
    assert nft.phases["update"] - grpo.phases["update"] == 251 * 4  # no backup at the update's peak
    offload = memory.static_components(prof, _shape(weight_copies=1, cpu_offload=True))
    assert offload["weight_copies"] == 0  # the copy is of host-resident shards
