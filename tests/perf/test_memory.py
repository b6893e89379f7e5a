"""The memory model: the liveness simulation on known computations, the sharding arithmetic, the
verdict, and the CLI on the small preset."""

from __future__ import annotations

import dataclasses
import functools
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
    grpo, nft = (memory.estimate(cfg, {}, _shape(master_bytes=2, old_policy=c), prof) for c in (False, True))
    assert nft.components["old_policy"] == 251 * 4 and "old_policy" not in grpo.components
    assert nft.phases["rollout"] - grpo.phases["rollout"] == 251 * 4 + 251 * 2  # the copy and the bf16 backup
    assert nft.phases["update"] - grpo.phases["update"] == 251 * 4  # no backup at the update's peak
    offload = memory.static_components(prof, _shape(old_policy=True, cpu_offload=True))
    assert offload["old_policy"] == 0  # the copy is of host-resident shards


def test_a_rollout_without_latents_stores_x0_alone():
    """NFT's rollout (keeps_latents False) holds each sample's clean latent, not its N+1 states:
    FLUX at 256 px is 16 x 16 tokens of 64 channels; 8 samples, 4 steps."""
    cfg = {"in_channels": 64, "joint_attention_dim": 8, "pooled_projection_dim": 4}
    state = 8 * 256 * 64 * 4  # one [B, L, C] float32 latent
    rest = 8 * 4 * 4 + 8 * (32 * 8 + 4) * 4 + 8 * 3 * 256 * 256 * 4  # log-probs, cond, images
    assert memory.trajectory_bytes(cfg, _shape()) == (4 + 1 + 1) * state + rest  # x_0 .. x_4 and x0
    assert memory.trajectory_bytes(cfg, _shape(keeps_latents=False)) == state + rest
    # the cost model's shape: --algorithm nft's rollout keeps no step latents, GRPO's all of them
    from fastvideo.tools import cost_model

    for algorithm, keeps in (("grpo", True), ("nft", False)):
        assert cost_model.memory_shape(cost_model.parse_args(TINY + ["--algorithm", algorithm])).keeps_latents is keeps


def test_held_in_every_phase_is_the_estimates_trajectory_and_reward_weights():
    """The pre-flight's bound (preflight.memory_problems) is exactly the estimate's trajectory and
    reward-model components, below its peak; past ``over`` it is the images and rewards alone."""
    prof = memory.ModelProfile(params=1000, largest_block_params=100, root_params=0, update_activations=5000,
                               rollout_activations=700, vae_params=10, vae_decode=900)
    cfg = {"in_channels": 64, "joint_attention_dim": 8, "pooled_projection_dim": 4}
    shape = _shape(rewards=("hpsv2", "compressibility"))
    est = memory.estimate(cfg, {}, shape, prof)
    bound = memory.held_in_every_phase(cfg, shape)
    assert bound == est.components["trajectory"] + est.components["reward_model"] < est.peak_bytes
    images, weights = 8 * 3 * 256 * 256 * 4, memory.REWARD_PARAMS["hpsv2"] * 4
    assert memory.held_in_every_phase(cfg, shape, over=images + weights - 1) == images + weights
    assert memory.held_in_every_phase(cfg, shape, over=images + weights) == bound


# The stated small config: the tiny preset (one double block, one single block, 2 heads x 16 = inner
# dim 32; 81,664 transformer parameters), 64x64, 2 ranks, full sharding, fp32 master weights.
TINY = ["--memory", "--model", "tiny", "--world_size", "2", "--h", "64", "--w", "64", "--text_tokens", "8",
        "--sampling_steps", "2", "--num_generations", "2", "--device", "cpu", "--mixed_precision", "no"]
TINY_PARAMS = 81_664
# LoRA rank 4 on to_k, to_q, to_v, to_out.0: the double block's attention has the four (32 -> 32), the
# single block's three (pre-only: no to_out); each adapter is A [4, 32] + B [32, 4].
ADAPTERS, DOUBLE_BLOCK_ADAPTERS = 7 * 4 * (32 + 32), 4 * 4 * (32 + 32)  # 1792, 1024


@functools.cache
def _tiny_profile(lora_rank: int) -> memory.ModelProfile:
    """The tiny preset's profile (the static components below read only its parameter counts)."""
    from fastvideo.models.registry import get_model_family
    from fastvideo.tools import cost_model

    family = get_model_family("flux")
    config, vae, _ = cost_model.resolve_model("tiny", family)
    shape = cost_model.memory_shape(cost_model.parse_args(TINY))
    return memory.profile_model(config, vae, dataclasses.replace(shape, lora_rank=lora_rank), family)


def _static(*extra):
    from fastvideo.perf import comms
    from fastvideo.tools import cost_model

    args = cost_model.parse_args(TINY + list(extra))
    shape = cost_model.memory_shape(args)
    prof = _tiny_profile(shape.lora_rank)
    return prof, memory.static_components(prof, shape), comms.from_memory_shape(shape, prof, args.trained_steps)


def test_lora_counts_the_adapters_the_trainer_injects(tiny_flux_dir):
    """The adapter count is peft's on the real tiny transformer, as training.lora.apply_lora injects them."""
    from diffusers import FluxTransformer2DModel

    from fastvideo.training.lora import LoraSettings, apply_lora

    model = FluxTransformer2DModel.from_pretrained(tiny_flux_dir, subfolder="transformer")
    assert sum(p.numel() for p in model.parameters()) == TINY_PARAMS
    apply_lora(model, LoraSettings(True, 4, 8.0, 0.0, ("to_k", "to_q", "to_v", "to_out.0"), None),
               torch.float32, torch.float32, seed=0)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == ADAPTERS
    prof, _, _ = _static("--use_lora", "--lora_rank", "4")
    assert (prof.params, prof.adapter_params, prof.largest_block_adapter_params) == (TINY_PARAMS, ADAPTERS,
                                                                                    DOUBLE_BLOCK_ADAPTERS)


def test_lora_and_kl_reference_bytes_by_hand():
    from fastvideo.perf import comms

    prof, lora, traffic = _static("--use_lora", "--lora_rank", "4", "--kl_coef", "0.1", "--use_ema",
                                  "--master_weight_type", "bf16")
    half = ADAPTERS // 2  # this rank's adapter elements
    # bf16 master adapters: 2 bytes; AdamW 2 moments; EMA float32; base in the master dtype, whole on every rank
    assert lora == {"parameters": half * 2, "gradients": half * 2, "adamw_states": 2 * half * 2, "ema": half * 4,
                    "frozen_base": TINY_PARAMS * 2, "fsdp_unsharded": 2 * DOUBLE_BLOCK_ADAPTERS * 2,
                    "fsdp_unsharded_grads": DOUBLE_BLOCK_ADAPTERS * 2}  # no kl_reference: the base is it
    assert (traffic.params, traffic.frozen_params, traffic.reference_params) == (ADAPTERS, 0, 0)
    _, bf16_base, _ = _static("--use_lora", "--lora_rank", "4", "--lora_base_precision", "bf16")
    assert bf16_base["frozen_base"] == TINY_PARAMS * 2 and bf16_base["parameters"] == half * 4
    # NFT keeps a float32 old policy of the adapters; its base stays whole on every rank, as GRPO's
    _, nft, traffic = _static("--use_lora", "--lora_rank", "4", "--algorithm", "nft")
    assert nft["frozen_base"] == TINY_PARAMS * 4 and nft["old_policy"] == half * 4
    assert traffic.frozen_params == 0 and traffic.nograd_update_forwards == 0  # _static passes no v_old count
    # CPU offload shards the base (gathered with its block)
    _, off, traffic = _static("--use_lora", "--lora_rank", "4", "--use_cpu_offload")
    assert off["frozen_base"] == TINY_PARAMS // 2 * 4
    assert off["fsdp_unsharded"] == 2 * DOUBLE_BLOCK_ADAPTERS * 4 + (2 * prof.largest_block_params + prof.root_params) * 4
    assert (traffic.params, traffic.frozen_params, traffic.frozen_bytes) == (ADAPTERS, TINY_PARAMS, 4)
    # full fine-tuning with --kl_coef: a frozen fp32 copy sharded like the model, a replica under DDP
    _, full, traffic = _static("--kl_coef", "0.1")
    assert full["kl_reference"] == full["parameters"] == TINY_PARAMS // 2 * 4
    assert traffic.reference_params == TINY_PARAMS
    # its no-grad forward gathers it once per update term: 2 micro-batches x 1 trained step, ring (2-1)/2
    plain = comms.fsdp_traffic(dataclasses.replace(traffic, reference_params=0))
    assert comms.fsdp_traffic(traffic)["update_gather"] - plain["update_gather"] == 2 * TINY_PARAMS * 4 / 2
    _, ddp, _ = _static("--kl_coef", "0.1", "--fsdp_sharding_strategy", "none")
    assert ddp["kl_reference"] == ddp["ddp_buckets"] == TINY_PARAMS * 4


def test_lora_memory_report_and_flops_refusal(capsys):
    from fastvideo.tools.cost_model import main

    main(TINY + ["--use_lora", "--lora_rank", "4", "--kl_coef", "0.1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["adapter_params"] == ADAPTERS and out["phases"]["setup"] >= TINY_PARAMS * 4
    main(TINY + ["--use_lora", "--lora_rank", "4"])
    text = capsys.readouterr().out
    assert f"LoRA rank 4 on to_k,to_q,to_v,to_out.0: {ADAPTERS:,} trainable parameters" in text
    assert "frozen_base" in text
    with pytest.raises(SystemExit) as exc:
        main(["--use_lora"])  # FLOPs: not modelled under LoRA
    assert exc.value.code == 2 and "--memory models its memory" in capsys.readouterr().err


def test_checkpoint_host_peak_by_format_by_hand():
    """Rank 0's host peak while saving: gathered holds AdamW's two whole moments; sharded the larger
    of one FSDP unit and its own slice of AdamW + EMA (+ NFT's old policy)."""
    prof = memory.ModelProfile(params=1001, largest_block_params=100, root_params=50, update_activations=0,
                               rollout_activations=0, vae_params=0, vae_decode=0, adapter_params=40)
    plain = memory.checkpoint_host_peak(prof, _shape())  # 4 ranks, fp32 master, no EMA
    assert plain == {"gathered": 1001 * 2 * 4, "sharded": 251 * 2 * 4}
    ema = memory.checkpoint_host_peak(prof, _shape(use_ema=True, old_policy=True))
    assert ema == {"gathered": 1001 * 8, "sharded": 251 * (8 + 4 + 4)}
    bf16 = memory.checkpoint_host_peak(prof, _shape(master_bytes=2, use_ema=True))
    assert bf16 == {"gathered": 1001 * 4, "sharded": 251 * (4 + 4)}  # the float32 EMA ties bf16 AdamW
    wide = memory.checkpoint_host_peak(prof, _shape(world_size=64))  # a block outweighs the slice
    assert wide["sharded"] == 100 * 4
    lora = memory.checkpoint_host_peak(prof, _shape(lora_rank=4))  # adapters only; their file whole
    assert lora == {"gathered": 40 * 8, "sharded": 40 * 4}


def test_cost_model_prints_the_checkpoint_host_peak(capsys):
    """At FLUX.1-dev size on 16 ranks with EMA: the AdamW moments (~95 GB) through rank 0 gathered,
    one 1/16 slice of AdamW + EMA (~9 GB) sharded: docs/checkpoints.md's arithmetic."""
    from fastvideo.tools.cost_model import main

    import re

    main(["--memory", "--world_size", "16", "--use_ema"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("checkpoint save"))
    gathered, sharded = map(float, re.findall(r"([0-9.]+) GB", line))
    assert 90 < gathered < 100 and 8 < sharded < 10, line


def test_the_preflights_activation_floor_is_the_estimates_larger_rollout_peak():
    """preflight.memory_problems' bound for large images: what every phase holds (the estimate's
    trajectory and reward weights) plus perf.memory.rollout_activation_floor, the larger of the
    estimate's rollout activations and VAE decode peak; never above the estimate's peak."""
    from fastvideo.models.registry import get_model_family
    from fastvideo.tools import cost_model

    family = get_model_family("flux")
    config, vae, _ = cost_model.resolve_model("tiny", family)
    shape = cost_model.memory_shape(cost_model.parse_args([*TINY[:5], "--h", "512", "--w", "512", *TINY[9:]]))
    prof = memory.profile_model(config, vae, shape, family)
    est = memory.estimate(config, vae, shape, prof, family)
    floor = memory.rollout_activation_floor(config, vae, shape, family)
    assert floor == max(prof.rollout_activations, prof.vae_decode) and prof.vae_decode > prof.rollout_activations > 0
    assert memory.held_in_every_phase(config, shape, family) + floor <= est.peak_bytes
    assert est.peak_phase == "vae_decode" and est.components["activations"] == floor  # the decode's own figure


def test_awm_ema_kl_counts_its_float32_copy_of_the_trainable_weights(tiny_flux_dir):
    """--algorithm awm --awm_ema_kl_beta > 0 keeps an EMA of the trainable weights (training.ema.WeightCopy,
    float32, shard-local) and reads it in one more no-grad forward per trained step: the cost model (and
    the trainer's lean.memory_shape, test_lean) counts its bytes, the real tiny FLUX's WeightCopy's, per
    shard, full and LoRA; without the flag (or for GRPO) nothing."""
    from diffusers import FluxTransformer2DModel

    from fastvideo.tools import cost_model
    from fastvideo.training.ema import WeightCopy
    from fastvideo.training.lora import LoraSettings, apply_lora

    model = FluxTransformer2DModel.from_pretrained(tiny_flux_dir, subfolder="transformer")
    held = {}
    for lora in (False, True):
        if lora:
            apply_lora(model, LoraSettings(True, 4, 8.0, 0.0, ("to_k", "to_q", "to_v", "to_out.0"), None),
                       torch.float32, torch.float32, seed=0)
        held[lora] = sum(s.numel() * s.element_size() for s in WeightCopy(model).shadow)  # one process: whole
    assert held == {False: TINY_PARAMS * 4, True: ADAPTERS * 4}
    for lora, flags in ((False, []), (True, ["--use_lora", "--lora_rank", "4"])):
        awm = ["--algorithm", "awm", *flags]
        prof, static, _ = _static(*awm, "--awm_ema_kl_beta", "0.1")
        off = _static(*awm)[1]
        assert static["update_copy"] == -(-held[lora] // 4 // 2) * 4  # 2 ranks' shards
        assert "update_copy" not in off and "update_copy" not in _static(*flags)[1]
        assert {k: v for k, v in static.items() if k != "update_copy"} == off
        forwards = [cost_model.parse_args(TINY + awm + beta).nograd_update_forwards
                    for beta in (["--awm_ema_kl_beta", "0.1"], [])]
        assert forwards == [1, 0]  # v_ema's (FLOPs and FSDP gathers)
        shape = cost_model.memory_shape(cost_model.parse_args(TINY + awm + ["--awm_ema_kl_beta", "0.1"]))
        hosts = [memory.checkpoint_host_peak(prof, dataclasses.replace(shape, update_copy=c)) for c in (True, False)]
        assert hosts[0]["sharded"] - hosts[1]["sharded"] == static["update_copy"]  # each rank writes its shard too
