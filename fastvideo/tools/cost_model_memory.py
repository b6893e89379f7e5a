"""The cost model's memory side (``python -m fastvideo.tools.cost_model --memory``): its flags, the
perf.memory.MemoryShape they describe, the --rollout_weights auto / --update_timesteps_per_forward all
choice the trainer would make (training/lean.resolve), and the report (memory, FSDP traffic)."""

from __future__ import annotations

import json

from fastvideo import devices
from fastvideo.errors import ConfigError


def _memory_flags(g) -> None:
    g.add_argument("--memory", action="store_true", help="per-device peak memory instead of FLOPs")
    g.add_argument("--fsdp_sharding_strategy", "--fsdp_sharding_startegy", dest="fsdp_sharding_strategy",
                   default="full", choices=["full", "zero2", "hybrid", "none"])
    g.add_argument("--ranks_per_node", type=int, default=None, help="hybrid sharding: the shard group size")
    g.add_argument("--rollout_batch_size", type=int, default=1)
    g.add_argument("--train_micro_batch_size", type=int, default=1)
    g.add_argument("--gradient_accumulation_steps", type=int, default=1)
    g.add_argument("--mixed_precision", default="bf16", choices=["bf16", "no"])
    g.add_argument("--master_weight_type", default="fp32", choices=["fp32", "bf16"])
    g.add_argument("--vae_precision", default="bf16", choices=["bf16", "fp32", "auto"],
                   help="auto = bf16 on an accelerator, fp32 on CPU (as the run)")
    g.add_argument("--selective_checkpointing", type=float, default=1.0)
    g.add_argument("--use_ema", action="store_true")
    g.add_argument("--use_cpu_offload", action="store_true")
    g.add_argument("--rewards", default="hpsv2:1.0", help="the run's reward spec (names count, weights do not)")
    g.add_argument("--device", default=devices.NPU, choices=devices.DEVICE_TYPES, help="npu adds HCCL buffers")
    g.add_argument("--hccl_buffsize_mb", type=int, default=None,
                   help="HCCL_BUFFSIZE (default: the environment's, else scripts/npu_env.sh's 800)")
    g.add_argument("--device_memory_gb", type=float, default=None, help="memory per device, for the verdict")
    g.add_argument("--fsdp_param_dtype", default="fp32", choices=["fp32", "bf16"], help="the dtype FSDP gathers in")
    g.add_argument("--rollout_weights", default="sharded", choices=["sharded", "gathered", "auto"],
                   help="gathered: the whole model gathered once per rollout; auto: gathered where the peak fits "
                        "90%% of --device_memory_gb (the trainer's flag and rule, training/lean.py)")
    g.add_argument("--update_timesteps_per_forward", default="1", metavar="K|all",
                   help="trained timesteps stacked in one update forward (the trainer's flag)")
    g.add_argument("--grad_sync", default="per_microbatch", choices=["per_microbatch", "per_step"],
                   help="per_step: gradients reduce-scattered once per optimizer step (unsharded gradients held)")
    g.add_argument("--use_lora", action="store_true", help="train LoRA adapters on a frozen base (--memory only)")
    g.add_argument("--lora_rank", type=int, default=128)
    g.add_argument("--lora_target_modules", default="to_k,to_q,to_v,to_out.0")
    g.add_argument("--lora_base_precision", choices=("master", "bf16"), default="master",
                   help="the frozen base's dtype: master = --master_weight_type")


def memory_shape(args):
    import os

    import torch

    from fastvideo.perf.memory import MemoryShape

    if args.fsdp_sharding_strategy == "hybrid" and args.ranks_per_node is None:
        raise ConfigError("--fsdp_sharding_strategy hybrid needs --ranks_per_node (the shard group size)")
    comms = {"full": 1, "zero2": 1, "none": 1, "hybrid": 3}[args.fsdp_sharding_strategy] if args.device == devices.NPU else 0
    vae_fp32 = args.vae_precision == "fp32" or (args.vae_precision == "auto" and args.device == devices.CPU)
    return MemoryShape(
        height=args.h, width=args.w, text_tokens=args.text_tokens, sampling_steps=args.sampling_steps,
        samples_per_rank=args.prompts_per_rank * args.num_generations, rollout_batch=args.rollout_batch_size,
        micro_batch=args.train_micro_batch_size, world_size=args.world_size, strategy=args.fsdp_sharding_strategy,
        ranks_per_node=args.ranks_per_node, master_bytes=4 if args.master_weight_type == "fp32" else 2,
        compute_dtype=torch.bfloat16 if args.mixed_precision == "bf16" else torch.float32,
        checkpoint_fraction=args.selective_checkpointing if args.gradient_checkpointing else 0.0,
        use_ema=args.use_ema,
        grads_held=args.trained_steps > 1 or args.gradient_accumulation_steps > 1,
        cpu_offload=args.use_cpu_offload and args.device != devices.CPU,
        vae_bytes=4 if vae_fp32 else 2, rewards=tuple(r.split(":")[0] for r in args.rewards.split(",") if r),
        communicators=comms, gather_bytes=2 if args.fsdp_param_dtype == "bf16" else 4,
        rollout_gathered=args.rollout_weights == "gathered", timesteps_per_forward=_timesteps(args),
        grads_unsharded=args.grad_sync == "per_step", accumulation=args.gradient_accumulation_steps,
        trained_per_rank=args.prompts_per_rank * (getattr(args, "bestofn", 0) or args.num_generations),
        hccl_buffsize_mb=args.hccl_buffsize_mb or int(os.environ.get("HCCL_BUFFSIZE", 800)),
        **_lora_and_copies(args),
    )


def _timesteps(args) -> int:
    """--update_timesteps_per_forward resolved against the trained steps (all -> T)."""
    from fastvideo.component_settings.update import ALL, timesteps_value

    k = timesteps_value(args.update_timesteps_per_forward)
    return args.trained_steps if k == ALL else min(k, args.trained_steps)


def _lora_and_copies(args) -> dict:
    """MemoryShape's LoRA fields, the extra weight copies (KL reference, NFT's old policy, AWM's EMA) and
    what the rollout keeps, as the trainer builds them (training/builders.py: lora_base_dtype,
    _replicate_frozen, build_kl_reference; the objective's needs, settings.ObjectiveNeeds)."""
    master = 4 if args.master_weight_type == "fp32" else 2
    if args.use_lora and args.lora_rank < 1:
        raise ConfigError(f"--lora_rank {args.lora_rank} must be at least 1")
    targets = tuple(t.strip() for t in args.lora_target_modules.split(",") if t.strip())
    needs = objective_update(args)[1]
    return {"lora_rank": args.lora_rank if args.use_lora else 0, "lora_targets": targets,
            "lora_base_bytes": 2 if args.lora_base_precision == "bf16" else master,
            "lora_replicate_base": not args.use_cpu_offload,
            "kl_reference": needs.reference, "old_policy": needs.old_policy, "update_copy": needs.update_copy,
            # an objective that replays no stored transition keeps x0 alone, and no log-prob (NFT, AWM, DGPO)
            "keeps_latents": needs.replay, "keeps_log_probs": needs.log_probs}


def objective_update(args):
    """(trained steps per sample, None for GRPO's own count (its candidates and the SDE window); the run's
    settings.ObjectiveNeeds) as --algorithm's settings declare them (ObjectiveSettings.trained_steps_per_sample,
    needs) for --sampling_steps, --timestep_fraction, --kl_coef and the objective's own training flags
    (args.training_flags, e.g. --awm_ema_kl_beta): NFT, AWM, DGPO train int(N x fraction) of all N timesteps
    (they replay no stored transition), Flash-GRPO its one SDE step; DGPO reads its reference always."""
    import argparse
    from dataclasses import replace
    from types import SimpleNamespace

    from fastvideo.algorithms.registry import resolve_objective
    from fastvideo.algorithms.settings import GRPOSettings
    from fastvideo.settings import ObjectiveSettings

    objective = resolve_objective(args.algorithm)
    settings = getattr(objective, "settings", None)
    cfg = SimpleNamespace(rollout=SimpleNamespace(sampling_steps=args.sampling_steps),
                          grpo=SimpleNamespace(timestep_fraction=args.timestep_fraction, kl_coef=args.kl_coef))
    if settings is None or settings is GRPOSettings:
        return None, replace(ObjectiveSettings().needs(cfg, objective), reference=args.kl_coef > 0)
    own_flags = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    settings.add_flags(own_flags)
    given = argparse.Namespace(algorithm=args.algorithm)
    own = settings.from_args(own_flags.parse_known_args(getattr(args, "training_flags", []), namespace=given)[0])
    return own.trained_steps_per_sample(cfg), own.needs(cfg, objective)


def lean_shape(args, shape, config: dict, vae_cfg: dict, family, profiles: list | None = None) -> tuple:
    """``shape`` with --rollout_weights auto and --update_timesteps_per_forward all resolved as the
    trainer resolves them (training/lean.resolve) against --device_memory_gb; the notes it prints.
    profiles: a list that receives (shape, perf.memory.ModelProfile) for each shape the choice profiled
    (the report reuses the chosen shape's profile instead of measuring it again)."""
    from dataclasses import replace

    from fastvideo.component_settings.update import ALL, timesteps_value
    from fastvideo.perf.memory import GB, estimate, profile_model
    from fastvideo.training import lean

    k_all = timesteps_value(args.update_timesteps_per_forward) == ALL
    if args.rollout_weights != "auto" and not k_all:
        return shape, []
    if args.device_memory_gb is None:
        notes = (["--rollout_weights auto: gathered (pass --device_memory_gb for the memory model's choice)"]
                 if args.rollout_weights == "auto" else [])
        return replace(shape, rollout_gathered=shape.rollout_gathered or bool(notes)), notes
    limit = lean.HEADROOM * args.device_memory_gb * GB

    def fits(s):
        prof = profile_model(config, vae_cfg, s, family=family)
        if profiles is not None:
            profiles.append((s, prof))
        peak = estimate(config, vae_cfg, s, prof=prof, family=family).peak_bytes
        return peak <= limit, peak

    choice = lean.resolve(shape, args.rollout_weights, k_all, limit, fits)
    return replace(shape, rollout_gathered=choice.gathered, timesteps_per_forward=choice.timesteps), choice.notes


def memory_report(args, config: dict, vae_cfg: dict, desc: str, family=None) -> str:
    from fastvideo.perf import comms
    from fastvideo.perf.memory import GB, checkpoint_host_peak, estimate, profile_model

    profiled = []
    shape, lean_notes = lean_shape(args, memory_shape(args), config, vae_cfg, family, profiled)
    prof = next((p for s, p in profiled if s == shape), None)
    if prof is None:
        prof = profile_model(config, vae_cfg, shape, family=family)
    est = estimate(config, vae_cfg, shape, prof=prof, family=family)
    # Forwards of the model's own units without a backward: NFT's v_old, AWM's v_ema, and under LoRA the KL's
    # v_ref (the base with its adapters off); a full fine-tune's KL reference is its own copy (reference_params).
    own_nograd = int(shape.old_policy) + int(shape.update_copy) + int(shape.kl_reference and shape.lora_rank > 0)
    traffic = comms.from_memory_shape(shape, prof, args.trained_steps, own_nograd)
    if args.json:
        return json.dumps({"model": desc, "shape": {k: str(v) for k, v in vars(shape).items()}, **est.as_dict(),
                           "params": prof.params, "adapter_params": prof.adapter_params,
                           "verdict": est.verdict(args.device_memory_gb),
                           "checkpoint_host_peak_bytes": checkpoint_host_peak(prof, shape),
                           "fsdp_traffic_bytes": comms.traffic_by_gather_dtype(traffic),
                           "fsdp_traffic_chosen_bytes": comms.fsdp_traffic(traffic),
                           "fsdp_traffic_default_bytes": comms.fsdp_traffic(comms.today(traffic)),
                           "lean": {"rollout_gathered": shape.rollout_gathered,
                                    "timesteps_per_forward": shape.timesteps_per_forward, "notes": lean_notes}},
                          indent=2)
    lines = [f"model {desc}: {args.h}x{args.w}, {shape.samples_per_rank} samples per rank, {args.world_size} ranks, "
             f"{shape.strategy} sharding ({shape.shards} shards), checkpointing {shape.checkpoint_fraction:g}, "
             f"micro-batch {shape.micro_batch}, rollout batch {shape.rollout_batch}", *_copies_line(args, shape, prof),
             *lean_notes, "", f"{'component':<24}{'GB':>10}"]
    for name, value in est.components.items():
        lines.append(f"{name:<24}{value / GB:>10.2f}")
    lines.append(f"{'peak (' + est.peak_phase + ')':<24}{est.peak_bytes / GB:>10.2f}")
    lines.append("phases: " + ", ".join(f"{k} {v / GB:.2f} GB" for k, v in est.phases.items()))
    lines.append(est.verdict(args.device_memory_gb))
    lines.append("not counted: framework context and workspaces, allocator fragmentation, reward activations")
    host = checkpoint_host_peak(prof, shape)
    lines.append(f"checkpoint save, rank-0 host memory peak: {host['gathered'] / GB:.2f} GB gathered (default), "
                 f"{host['sharded'] / GB:.2f} GB with --checkpoint_format sharded")
    lines += ["", *comms.gather_dtype_table(traffic), "", *comms.comparison_table(traffic)]
    return "\n".join(lines)
def _copies_line(args, shape, prof) -> list[str]:
    """What LoRA and the KL reference change, in one line (none for a plain full fine-tune)."""
    parts = []
    if shape.lora_rank:
        layout = "replicated on every rank" if shape.lora_replicate_base or shape.strategy == "none" else "sharded"
        parts.append(f"LoRA rank {shape.lora_rank} on {','.join(shape.lora_targets)}: {prof.adapter_params:,} "
                     f"trainable parameters; the frozen base ({prof.params:,}) in {8 * shape.lora_base_bytes}-bit, "
                     f"{layout}")
    if shape.kl_reference:
        parts.append("KL reference: the base with its adapters off (no copy)" if shape.lora_rank else
                     "KL reference: a frozen copy of the weights in the master precision, sharded like the model")
    return ["; ".join(parts)] if parts else []
