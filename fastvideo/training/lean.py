"""The communication-lean options, resolved once at start-up against the memory model:
--rollout_weights (sharded | gathered | auto) and --update_timesteps_per_forward (K | all).

    choice = lean.choose(cfg, world_size, device, family, transformer_config, vae_config)
    choice.gathered      # the no-grad passes keep the weights gathered (fsdp.gathered_forwards)
    choice.timesteps     # (sample, timestep) terms per update forward (Updater)
    choice.notes         # start-up lines: what auto chose, why K was reduced

The verdict is fastvideo.perf.memory's (its peak against one device's memory). On the CPU the
device is the host and the model's figures are not checked: auto chooses gathered, K is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fastvideo import devices
from fastvideo.component_settings.update import ALL
from fastvideo.errors import ConfigError

HEADROOM = 0.9  # the share of a device's memory the model's peak may use (its uncounted framework memory)


@dataclass(frozen=True)
class LeanChoice:
    gathered: bool
    timesteps: int
    notes: list[str] = field(default_factory=list)


def memory_shape(cfg, world_size: int, device, text_tokens: int = 512):
    """The perf.memory.MemoryShape of the run: the one tools/cost_model --memory builds from the same
    command line (tests/training/test_lean.py holds the two equal), but for the device's own fields
    (communicators, HCCL buffers); text_tokens: the prompt embeddings' length (FLUX's T5 default)."""
    import torch

    from fastvideo.perf.memory import MemoryShape

    m, lora, needs = cfg.model, cfg.lora, cfg.objective_needs()
    trained = cfg.objective_settings().trained_steps_per_sample(cfg)
    master = 4 if m.master_weight_type == "fp32" else 2
    return MemoryShape(
        height=cfg.rollout.height, width=cfg.rollout.width, text_tokens=text_tokens,
        sampling_steps=cfg.rollout.sampling_steps,
        samples_per_rank=cfg.prompts_per_rank * cfg.rollout.num_generations,
        trained_per_rank=cfg.prompts_per_rank * cfg.rollout.trained_per_prompt,
        rollout_batch=cfg.rollout.rollout_batch_size, micro_batch=cfg.update.train_micro_batch_size,
        world_size=world_size, strategy=cfg.fsdp_strategy, master_bytes=master,
        compute_dtype=torch.bfloat16 if m.mixed_precision == "bf16" else torch.float32,
        checkpoint_fraction=m.selective_checkpointing if m.gradient_checkpointing else 0.0,
        use_ema=cfg.optim.use_ema, grads_held=trained > 1 or cfg.update.gradient_accumulation_steps > 1,
        cpu_offload=cfg.cpu_offload, vae_bytes=4 if m.vae_precision == "fp32" else 2,
        rewards=tuple(r.name for r in cfg.reward.spec if r.kind == "local"),  # remote ones hold no weights here
        lora_rank=lora.rank if lora.enabled else 0, lora_targets=tuple(lora.target_modules),
        lora_base_bytes=2 if lora.base_precision == "bf16" else master, lora_replicate_base=not cfg.cpu_offload,
        kl_reference=needs.reference, old_policy=needs.old_policy, keeps_latents=needs.replay,
        keeps_log_probs=needs.log_probs, update_copy=needs.update_copy,
        gather_bytes=2 if cfg.fsdp_param_dtype == "bf16" else 4, grads_unsharded=cfg.update.grad_sync == "per_step",
        accumulation=cfg.update.gradient_accumulation_steps)


def _fits(shape, transformer_config: dict, vae_config: dict, family, limit: float) -> tuple[bool, float]:
    from fastvideo.perf.memory import estimate

    est = estimate(transformer_config, vae_config, shape, family=family)
    return est.peak_bytes <= limit, est.peak_bytes


def choose(cfg, world_size: int, device, family, transformer_config: dict, vae_config: dict) -> LeanChoice:
    """Resolve the two flags; raises ConfigError for an explicit K that the memory model refuses."""
    trained = cfg.objective_settings().trained_steps_per_sample(cfg)
    k = cfg.update.stack(trained)
    mode = cfg.rollout_weights
    total = devices.total_memory_bytes(device.type) if devices.is_accelerator(device) else None
    if total is None:  # the CPU (or an unreadable device): nothing to check against
        notes = ["--rollout_weights auto: gathered (no device memory to check on this device)"] if mode == "auto" else []
        return LeanChoice(mode != "sharded", k, notes)
    from fastvideo.models.base import FamilyCostModel

    if not isinstance(family, FamilyCostModel):  # a plugin family without a memory model: nothing to check with
        return LeanChoice(mode == "gathered", k, [f"--rollout_weights {mode} / --update_timesteps_per_forward {k}: "
                                                  "not checked (the model family has no cost model); auto: sharded"])
    shape = replace(memory_shape(cfg, world_size, device), timesteps_per_forward=k)
    choice = resolve(shape, mode, cfg.update.timesteps_per_forward == ALL, HEADROOM * total,
                   lambda s: _fits(s, transformer_config, vae_config, family, HEADROOM * total))
    if shape.grads_unsharded:
        ok, peak = _fits(replace(shape, rollout_gathered=choice.gathered, timesteps_per_forward=choice.timesteps),
                         transformer_config, vae_config, family, HEADROOM * total)
        if not ok:
            raise ConfigError(f"--grad_sync per_step: with the whole unsharded gradients the memory model's peak is "
                              f"{peak / 1e9:.1f} GB, over the {HEADROOM * total / 1e9:.1f} GB usable on this device; "
                              "use --grad_sync per_microbatch")
        choice.notes.append(f"--grad_sync per_step: one gradient reduce-scatter per optimizer step (the memory "
                            f"model's peak with the unsharded gradients: {peak / 1e9:.1f} GB of "
                            f"{HEADROOM * total / 1e9:.1f} GB usable)")
    return choice


def resolve(shape, mode: str, k_is_all: bool, limit: float, fits) -> LeanChoice:
    """The memory model's choice for a perf.memory.MemoryShape whose timesteps_per_forward is the
    requested K (all: the trained steps): ``mode`` auto -> gathered where the peak with the whole
    model gathered fits ``limit`` bytes; K halved (all) or refused (an explicit K) until it fits.
    fits(shape) -> (fits, peak bytes). Shared by the trainer (choose) and the cost model."""
    notes, k = [], shape.timesteps_per_forward
    gathered = mode == "gathered"
    if mode == "auto":
        gathered, peak = fits(replace(shape, rollout_gathered=True))
        notes.append(f"--rollout_weights auto: {'gathered' if gathered else 'sharded'} (the memory model's peak with "
                     f"the weights gathered: {peak / 1e9:.1f} GB of {limit / 1e9:.1f} GB usable)")
    shape = replace(shape, rollout_gathered=gathered)
    while k > 1:
        ok, peak = fits(replace(shape, timesteps_per_forward=k))
        if ok:
            break
        if not k_is_all:
            raise ConfigError(f"--update_timesteps_per_forward {k}: the memory model's peak is {peak / 1e9:.1f} GB, "
                              f"over the {limit / 1e9:.1f} GB usable on this device; use a smaller K or all")
        notes.append(f"--update_timesteps_per_forward all: {k} timesteps per forward would peak at "
                     f"{peak / 1e9:.1f} GB of {limit / 1e9:.1f} GB usable; trying {k // 2}")
        k //= 2
    return LeanChoice(gathered, k, notes)
