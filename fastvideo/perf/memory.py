"""Per-device peak memory of one GRPO iteration, by component, and whether it fits a device.

Static (held the whole iteration): master parameters, their gradients (during the update), AdamW's
two moments, the EMA shadow (float32), all divided by the shard count under FSDP (full: world size;
hybrid: ranks per node; none = DDP: a full replica, plus DDP's gradient buckets, one more gradient
copy). Under LoRA (lora_rank > 0) only the adapters are trained: those components count the adapter
parameters (rank x (in + out) per targeted Linear, peft's count), and the frozen base is held in its
own precision, replicated on every rank (the trainer's default layout: never gathered) or, with CPU
offload, sharded like the model. The KL reference (--kl_coef > 0) of a full fine-tune is
a frozen copy of the initial weights in the master precision, sharded like the model; under LoRA
the reference is the base with its adapters off, so it costs nothing. NFT's old policy is a float32
copy of the trainable shards; in the rollout, while it is swapped in, the trained shards wait in a
backup of the same size.
FSDP also holds the unsharded parameters of the units in flight (two blocks with limit_all_gathers,
plus the root unit: embedders and output layers stay gathered) and one block's unsharded gradients.
Dynamic, per phase (the peak is the largest phase): set-up (FSDP fills the model one unit at a time:
fastvideo.models.sharded_load), the rollout's no-grad forwards, the VAE decode,
the update's forward + backward on one micro-batch (with or without (selective) checkpointing). The
transformer's activation figures are not estimated: the real diffusers model is run on the meta
device under fastvideo.perf.live_bytes.LiveBytes, which counts every tensor from creation to death.
The trajectory (latents of every step and the clean latent x0, log-probs, prompt embeddings, decoded
images; NFT's rollout keeps x0 and no step latents: Objective.needs_trajectory), the reward
model's weights and, on NPU, HCCL's buffers (2 x HCCL_BUFFSIZE per communicator) are added.

Not counted: the framework's own memory (CUDA/CANN context, kernels' workspaces, on CPU the Python
runtime), allocator fragmentation, the reward model's activations, text encoders (prompts come
pre-embedded).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field

import torch

GB = 1e9
# Reward models' parameter counts (open_clip ViT-H-14 for HPSv2.1 and PickScore, ViT-L-14 for CLIP).
REWARD_PARAMS = {"hpsv2": 986_109_440, "pickscore": 986_109_440, "clip": 427_616_513, "compressibility": 0}


@dataclass(frozen=True)
class MemoryShape:
    """One configuration: what the run's flags say that matters for memory."""

    height: int
    width: int
    text_tokens: int
    sampling_steps: int
    samples_per_rank: int  # prompts per rank x generations
    rollout_batch: int
    micro_batch: int
    world_size: int
    strategy: str = "full"  # full | zero2 | hybrid | none
    ranks_per_node: int | None = None
    master_bytes: int = 4  # fp32 master weights (2 for bf16)
    compute_dtype: torch.dtype = torch.bfloat16  # autocast dtype (float32 for --mixed_precision no)
    checkpoint_fraction: float = 1.0  # 0 = no gradient checkpointing
    use_ema: bool = False
    # Gradients exist while activations peak when a micro-batch trains more than one timestep or
    # gradients accumulate over micro-batches (the trainer's loop); otherwise they are set to None
    # after each optimizer step and grow only during the backward.
    grads_held: bool = True
    cpu_offload: bool = False
    vae_bytes: int = 2
    rewards: tuple[str, ...] = ("hpsv2",)
    reward_bytes: int = 4
    communicators: int = 0  # HCCL communicators (0 off NPU)
    hccl_buffsize_mb: int = 200
    lora_rank: int = 0  # 0: full fine-tuning; else adapters of this rank on lora_targets (peft suffix match)
    lora_targets: tuple[str, ...] = ("to_k", "to_q", "to_v", "to_out.0")
    lora_base_bytes: int = 4  # the frozen base's precision (--lora_base_precision)
    lora_replicate_base: bool = True  # the base outside FSDP, whole on every rank (builders._replicate_frozen)
    kl_reference: bool = False  # --kl_coef > 0: a frozen copy under full fine-tuning (LoRA: the base itself)
    old_policy: bool = False  # --algorithm nft: a float32 copy of the trainable shards
    keeps_latents: bool = True  # the rollout keeps every step's latents (False: NFT, x0 alone)
    keeps_log_probs: bool = True  # the rollout keeps every transition's log-prob (False: NFT, AWM, DGPO)
    update_copy: bool = False  # a float32 copy of the trainable shards read in the update (AWM's EMA-KL)
    gather_bytes: int = 4  # --fsdp_param_dtype: the dtype FSDP gathers parameters in
    rollout_gathered: bool = False  # --rollout_weights gathered: the whole model gathered through the rollout
    timesteps_per_forward: int = 1  # --update_timesteps_per_forward: a micro-batch's forward is this many x larger
    grads_unsharded: bool = False  # --grad_sync per_step: the whole unsharded gradients held through the update
    accumulation: int = 1  # --gradient_accumulation_steps (micro-batches per optimizer step)
    trained_per_rank: int = 0  # samples the update trains (--bestofn; all G are rolled out and held); 0: all

    @property
    def shards(self) -> int:
        if self.strategy == "none" or self.world_size == 1:
            return 1
        if self.strategy == "hybrid":
            return self.ranks_per_node or self.world_size
        return self.world_size


@dataclass(frozen=True)
class ModelProfile:
    """Parameter counts of the transformer and its activation peaks (bytes) for the shape's batches."""

    params: int
    largest_block_params: int
    root_params: int  # outside the blocks (embedders, norm_out, proj_out)
    update_activations: int  # forward + backward of one micro-batch
    rollout_activations: int  # one no-grad forward of one rollout batch
    vae_params: int
    vae_decode: int  # one no-grad decode of one rollout batch
    adapter_params: int = 0  # LoRA: trainable adapter parameters (0: full fine-tuning)
    largest_block_adapter_params: int = 0
    root_adapter_params: int = 0  # adapters outside the blocks
    units: int = 0  # FSDP units: the root and one per block
    frozen_params: int = 0  # full fine-tuning: parameters the family leaves frozen (an untrained Wan2.2-A14B expert)


@dataclass
class MemoryEstimate:
    components: dict[str, int] = field(default_factory=dict)  # component -> bytes at the peak phase
    phases: dict[str, int] = field(default_factory=dict)  # phase -> bytes
    peak_phase: str = ""
    peak_bytes: int = 0

    def verdict(self, device_memory_gb: float | None) -> str:
        if device_memory_gb is None:
            return f"peak {self.peak_bytes / GB:.1f} GB per device (pass --device_memory_gb for a verdict)"
        margin = device_memory_gb - self.peak_bytes / GB
        if margin >= 0:
            return f"fits in {device_memory_gb:g} GB, with {margin:.1f} GB to spare"
        return f"does not fit in {device_memory_gb:g} GB, by {-margin:.1f} GB"

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- meta-device profiling
class _FusedAttention(torch.autograd.Function):
    """Memory stand-in for a fused attention kernel (flash attention, CPU flash, NPU fusion
    attention): keeps q, k, v, the output and a float32 log-sum-exp per query for backward, never the
    [B, H, S, S] score matrix that the meta device's math fallback would materialise."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fused_sdpa(query, key, value, *args, **kwargs):
    """``scaled_dot_product_attention``'s signature (diffusers 0.32 passes q, k, v by position,
    0.42's attention dispatch by name: query=, key=, value=) over :class:`_FusedAttention`."""
    return _FusedAttention.apply(query, key, value)


@contextlib.contextmanager
def _fused_attention():
    original = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def _family(family):
    """``family``'s cost-model role; None: the reference model's family (FLUX.1-dev's, --model_family's default)."""
    from fastvideo.models.base import require_cost_model
    from fastvideo.models.registry import DEFAULT_FAMILY, get_model_family

    return require_cost_model(family if family is not None else get_model_family(DEFAULT_FAMILY))


def is_lora_target(name: str, targets: tuple[str, ...]) -> bool:
    """peft's rule for a list of target_modules: the module's name is a target or ends with '.' + it."""
    return any(name == t or name.endswith("." + t) for t in targets)


def adapter_params(module: torch.nn.Module, rank: int, targets: tuple[str, ...]) -> int:
    """Parameters of rank-``rank`` LoRA adapters (A: rank x in, B: out x rank, no bias) on the
    targeted Linears of ``module``."""
    return sum(rank * (m.in_features + m.out_features) for name, m in module.named_modules()
               if isinstance(m, torch.nn.Linear) and is_lora_target(name, targets))


def _meta_transformer(config: dict, dtype: torch.dtype, checkpoint_fraction: float, family,
                      lora: tuple[int, tuple[str, ...]] | None = None):
    """The family's transformer on the meta device; lora = (rank, targets): frozen, with peft's
    adapters injected (as training.lora.apply_lora does before the model is wrapped)."""
    from fastvideo.distributed.fsdp import apply_activation_checkpointing

    # buffers a family keeps real for loading (Wan's RoPE tables on the CPU) go to the meta device too
    model = family.meta_transformer(config, dtype).to("meta")
    if lora:
        from fastvideo.utils import require

        peft = require("peft", "lora", "cost_model --memory --use_lora")
        model.requires_grad_(False)
        for part in family.trained_parts(model):  # the model, or the trained Wan2.2-A14B experts
            part.add_adapter(peft.LoraConfig(r=lora[0], lora_alpha=lora[0], target_modules=list(lora[1])))
        model.to(dtype)
    if checkpoint_fraction > 0:
        apply_activation_checkpointing(model, family.block_classes(), fraction=checkpoint_fraction)
    return model


def transformer_activation_peak(config: dict, batch: int, layout, text_tokens: int, dtype: torch.dtype, train: bool,
                                checkpoint_fraction: float = 0.0, family=None,
                                lora: tuple[int, tuple[str, ...]] | None = None) -> int:
    """Peak bytes of the tensors one forward (and, if ``train``, backward) creates; parameter
    gradients are dropped as soon as they are made (they are counted as a static component).
    A family with a ``cost_depth_key`` (a stack of identical blocks: its length in the config) with
    no or every block checkpointed (the family's only stack: every block in it) is measured at 2, 3 and
    4 blocks: when a training peak grows by the same step s > 0 each block (what one more block keeps
    for the backward), or a no-grad peak stays, the N-block peak is that line's value at N (equal to the whole model's measurement: tests/perf/test_memory_depth.py), in seconds instead of
    minutes for a 60-block model; otherwise, or with some blocks checkpointed, the whole model is measured.
    layout: the family's LatentLayout (family.nominal_layout); lora: (rank, targets) trains
    adapters on the frozen model (a frozen Linear keeps no input for a weight gradient)."""
    family = _family(family)
    depth_key = getattr(family, "cost_depth_key", None)
    fraction = checkpoint_fraction if train else 0.0
    if depth_key and config.get(depth_key, 0) > 4 and fraction in (0.0, 1.0):
        peaks = [_measured_peak(dict(config, **{depth_key: n}), batch, layout, text_tokens, dtype, train,
                                fraction, family, lora) for n in (2, 3, 4)]
        step = peaks[1] - peaks[0]
        # each moment holds a fixed amount plus 0, i or N blocks' saved tensors (0 without grad): the peak
        # is the largest of lines of slope 0 or s; rising by s through 2-4 blocks, the steepest leads on
        if peaks[2] - peaks[1] == step and (step > 0 or not train):
            return peaks[0] + (config[depth_key] - 2) * step
    return _measured_peak(config, batch, layout, text_tokens, dtype, train, fraction, family, lora)


def _measured_peak(config: dict, batch: int, layout, text_tokens: int, dtype: torch.dtype, train: bool,
                   checkpoint_fraction: float, family, lora) -> int:
    """transformer_activation_peak measured: the meta-device forward (and backward) of the whole model."""
    from fastvideo.perf.live_bytes import LiveBytes

    model = _meta_transformer(config, dtype, checkpoint_fraction, family, lora if train else None)
    inputs = family.meta_inputs(config, batch, layout, text_tokens, dtype)
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    tracker = LiveBytes()
    # a trained part's pass (the model's own, or a trained Wan2.2-A14B expert's: both experts share one shape)
    forward = family.trained_parts(model)[0] if train else model
    with torch.set_grad_enabled(train), _fused_attention(), tracker:
        out = forward(**inputs)[0]
        if isinstance(out, (list, tuple)):  # a transformer that returns one tensor per sample (Z-Image)
            out = torch.stack(list(out))
        if train:
            out.float().square().mean().backward()
    return tracker.peak


def vae_decode_peak(vae_config: dict, batch: int, latent_h: int, latent_w: int, dtype: torch.dtype) -> tuple[int, int]:
    """(VAE parameter count, peak bytes of one no-grad decode of ``batch`` latents)."""
    from diffusers import AutoencoderKL

    cfg = {k: v for k, v in vae_config.items() if not k.startswith("_")}
    n = len(cfg["block_out_channels"])  # a short config (a family's reference_vae_config) lists no block types
    cfg.setdefault("down_block_types", ["DownEncoderBlock2D"] * n)
    cfg.setdefault("up_block_types", ["UpDecoderBlock2D"] * n)
    with torch.device("meta"):
        vae = AutoencoderKL.from_config(cfg)
    vae.to(dtype)
    return decode_peak(vae, torch.empty(batch, vae_config["latent_channels"], latent_h, latent_w, device="meta",
                                        dtype=dtype))


def decode_peak(vae, z: torch.Tensor) -> tuple[int, int]:
    """(parameter count of the meta-device ``vae``, peak bytes of one no-grad decode of the latents ``z``)."""
    from fastvideo.perf.live_bytes import LiveBytes

    tracker = LiveBytes()
    with torch.no_grad(), tracker:
        vae.decode(z, return_dict=False)
    return sum(p.numel() for p in vae.parameters()), tracker.peak


def profile_model(config: dict, vae_config: dict, shape: MemoryShape, family=None) -> ModelProfile:
    family = _family(family)
    layout = family.nominal_layout(shape.height, shape.width, config)
    model = _meta_transformer(config, torch.float32, 0.0, family)
    blocks = family.blocks(model)
    block_params = [sum(p.numel() for p in b.parameters()) for b in blocks]
    params = sum(p.numel() for p in model.parameters())
    parts = family.trained_parts(model)
    trained = sum(p.numel() for part in parts for p in part.parameters())
    vae_params, vae_peak = _vae_decode(vae_config, shape, layout, family)
    act = shape.compute_dtype
    lora = (shape.lora_rank, tuple(shape.lora_targets)) if shape.lora_rank else None
    # LoRA adapts the trained parts only (a frozen Wan2.2-A14B expert gets none: training.lora)
    in_parts = {id(m) for part in parts for m in part.modules()}
    trained_blocks = [b for b in blocks if id(b) in in_parts]
    block_adapters = [adapter_params(b, shape.lora_rank, shape.lora_targets) for b in trained_blocks] if lora else [0]
    adapters = sum(adapter_params(part, shape.lora_rank, shape.lora_targets) for part in parts) if lora else 0
    return ModelProfile(
        params=params, largest_block_params=max(block_params), root_params=params - sum(block_params),
        update_activations=transformer_activation_peak(config, shape.micro_batch * shape.timesteps_per_forward,
                                                       layout, shape.text_tokens, act, True,
                                                       shape.checkpoint_fraction, family, lora),
        rollout_activations=transformer_activation_peak(config, shape.rollout_batch, layout, shape.text_tokens,
                                                        act, False, family=family),
        vae_params=vae_params, vae_decode=vae_peak, adapter_params=adapters,
        largest_block_adapter_params=max(block_adapters), root_adapter_params=adapters - sum(block_adapters),
        units=len(blocks) + 1, frozen_params=params - trained,
    )


def _vae_decode(vae_config: dict, shape: MemoryShape, layout, family) -> tuple[int, int]:
    """(VAE parameters, its decode's activation peak) for one rollout batch of ``layout``."""
    vae_dtype = torch.bfloat16 if shape.vae_bytes == 2 else torch.float32
    if hasattr(family, "meta_vae"):  # a family whose VAE is not AutoencoderKL (Wan's causal video VAE)
        return decode_peak(*family.meta_vae(vae_config, shape.rollout_batch, layout, vae_dtype))
    lat_h, lat_w = layout.latent_hw
    return vae_decode_peak(vae_config, shape.rollout_batch, lat_h, lat_w, vae_dtype)


def rollout_activation_floor(config: dict, vae_config: dict, s: MemoryShape, family=None) -> int:
    """The larger of the rollout's transformer activations and the VAE decode's peak: with what every
    phase holds (held_in_every_phase) a lower bound of :func:`estimate`'s peak for any sharding, weight
    precision or update settings (those only add), priced by the profile the estimate uses without the
    update's backward trace (the pre-flight's, fastvideo/preflight.py, for large images)."""
    family = _family(family)
    layout = family.nominal_layout(s.height, s.width, config)
    rollout = transformer_activation_peak(config, s.rollout_batch, layout, s.text_tokens, s.compute_dtype, False,
                                          family=family)
    return max(rollout, _vae_decode(vae_config, s, layout, family)[1])


# ---------------------------------------------------------------- the arithmetic
def static_components(prof: ModelProfile, s: MemoryShape) -> dict[str, int]:
    """Bytes held on the device across phases (gradients only during the update)."""
    m = s.master_bytes
    on_device = 0 if s.cpu_offload else 1  # CPU offload keeps shards, gradients and AdamW in host memory
    fsdp = s.strategy != "none" and s.shards > 1
    lora = s.lora_rank > 0
    trainable = prof.adapter_params if lora else prof.params - prof.frozen_params
    shard = math.ceil(trainable / s.shards) * on_device  # this rank's trainable elements
    out = {"parameters": shard * m, "gradients": shard * m, "adamw_states": 2 * shard * m,
           "ema": shard * 4 if s.use_ema else 0}  # the EMA shadow is float32 (training/ema.py)
    if prof.frozen_params and not lora:  # sharded with the model in the master dtype, no gradient or state
        frozen = math.ceil(prof.frozen_params / s.shards) if fsdp else prof.frozen_params
        out["frozen_parameters"] = frozen * m * on_device
    if s.old_policy:
        out["old_policy"] = shard * 4  # NFT: training.ema.WeightCopy, float32
    if s.update_copy:
        out["update_copy"] = shard * 4  # AWM's EMA (--awm_ema_kl_beta): training.ema.WeightCopy, float32
    base_sharded = lora and fsdp and not s.lora_replicate_base
    if lora:
        whole = prof.params * s.lora_base_bytes
        out["frozen_base"] = math.ceil(prof.params / s.shards) * s.lora_base_bytes * on_device if base_sharded else whole
    elif s.kl_reference:  # a frozen copy of the initial weights, wrapped like the model (builders.build_kl_reference)
        out["kl_reference"] = math.ceil(prof.params / s.shards) * m * on_device if fsdp else prof.params * m
    if not fsdp:
        out["ddp_buckets"] = trainable * m if s.world_size > 1 else 0
        return out
    # Two blocks gathered (limit_all_gathers) + the root unit, and one block's unsharded gradients.
    if lora:
        out["fsdp_unsharded"] = (2 * prof.largest_block_adapter_params + prof.root_adapter_params) * m
        if base_sharded:  # the blocks' frozen base is gathered with them
            out["fsdp_unsharded"] += (2 * prof.largest_block_params + prof.root_params) * s.lora_base_bytes
        out["fsdp_unsharded_grads"] = prof.largest_block_adapter_params * m
    else:
        # Two blocks gathered (limit_all_gathers) + the root unit, and one block's unsharded gradients;
        # zero2 keeps every unit gathered from its forward to its backward: the whole model.
        gathered = prof.params if s.strategy == "zero2" else 2 * prof.largest_block_params + prof.root_params
        out["fsdp_unsharded"] = gathered * m
        out["fsdp_unsharded_grads"] = prof.largest_block_params * m
    if s.grads_unsharded:  # FSDP1 no_sync: every unit's gradients accumulate unsharded, fp32 (the master dtype)
        out["fsdp_unsharded_grads"] = trainable * m
    return out


def rollout_gathered_copy(prof: ModelProfile, s: MemoryShape) -> dict[str, int]:
    """--rollout_weights gathered: the rollout holds every unit gathered (at the gather dtype) in
    place of the units in flight: {"fsdp_unsharded": bytes}, or {} when it changes nothing (one
    shard, DDP, zero2, which already keeps them)."""
    if not s.rollout_gathered or s.strategy in ("none", "zero2") or s.shards <= 1:
        return {}
    lora = s.lora_rank > 0
    gathered = (prof.adapter_params if lora else prof.params) * s.gather_bytes
    if lora and not s.lora_replicate_base:
        gathered += prof.params * s.lora_base_bytes
    return {"fsdp_unsharded": gathered}


def checkpoint_host_peak(prof: ModelProfile, s: MemoryShape) -> dict[str, int]:
    """Rank 0's peak host memory (bytes) while it writes a checkpoint, per --checkpoint_format.

    gathered: every trainable tensor's whole state passes through rank 0, one component at a time
    (the model, then AdamW's two moments in the master dtype, the float32 EMA, NFT's float32 old
    policy): the largest component, AdamW's moments, is the peak. sharded
    (training/checkpoint/shards.py): the model file is streamed one FSDP unit at a time (the largest
    unit; under LoRA the whole, small adapter file), then each rank writes its own slice of the
    AdamW state and the weight copies: the larger of the two."""
    m = s.master_bytes
    lora = s.lora_rank > 0
    trainable = prof.adapter_params if lora else prof.params
    copies = 4 * (int(s.use_ema) + int(s.old_policy) + int(s.update_copy))  # float32 bytes per element
    gathered = trainable * max(2 * m, 4 if copies else 0)
    unit = trainable * m if lora else max(prof.largest_block_params, prof.root_params) * m
    own = math.ceil(trainable / s.shards) * (2 * m + copies)
    return {"gathered": gathered, "sharded": max(unit, own)}


def trajectory_bytes(prof_config: dict, s: MemoryShape, family=None) -> int:
    """Latents of every step [B, N+1, L, C] fp32 (none when the rollout keeps only x0:
    s.keeps_latents False), the clean latents x0 [B, L, C] fp32, log-probs [B, N] fp32 (none when
    s.keeps_log_probs is False), the Conditioning fp32 and decoded images fp32."""
    family = _family(family)
    tokens, channels = family.nominal_layout(s.height, s.width, prof_config).tokens
    b = s.samples_per_rank
    states = (s.sampling_steps + 1 if s.keeps_latents else 0) + 1  # + x0
    latents = b * states * tokens * channels * 4
    embeds = b * family.cond_numel_at(prof_config, s.text_tokens, s.height, s.width) * 4
    log_probs = b * s.sampling_steps * 4 if s.keeps_log_probs else 0
    return latents + log_probs + embeds + decoded_images_bytes(s)


def decoded_images_bytes(s: MemoryShape) -> int:
    """The rollout's decoded images, float32 [B, 3, H, W] (part of the trajectory)."""
    return s.samples_per_rank * 3 * s.height * s.width * 4


def held_in_every_phase(config: dict, s: MemoryShape, family=None, over: int | None = None) -> int:
    """Bytes every phase after set-up holds whatever the transformer (the trajectory with its decoded
    images, the reward models' weights): a lower bound of :func:`estimate`'s peak that needs no
    profiling, cheap enough for the launcher's pre-flight (fastvideo/preflight.py). When the images
    and reward weights alone pass ``over``, their sum is returned: the latents' layout is not built
    (for a huge image, its position ids alone would not fit)."""
    floor = decoded_images_bytes(s) + sum(REWARD_PARAMS.get(r, 0) for r in s.rewards) * s.reward_bytes
    if over is not None and floor > over:
        return floor
    return floor - decoded_images_bytes(s) + trajectory_bytes(config, s, family)


def estimate(config: dict, vae_config: dict, s: MemoryShape, prof: ModelProfile | None = None,
             family=None) -> MemoryEstimate:
    """family: the ModelFamily whose transformer ``config`` describes (default: the default family)."""
    prof = prof or profile_model(config, vae_config, s, family)
    static = static_components(prof, s)
    common = {
        "reward_model": sum(REWARD_PARAMS.get(r, 0) for r in s.rewards) * s.reward_bytes,
        "vae_weights": prof.vae_params * s.vae_bytes,
        "trajectory": trajectory_bytes(config, s, family),
        "hccl_buffers": s.communicators * 2 * s.hccl_buffsize_mb * 2**20,
    }
    # DDP's buckets are allocated when the model is wrapped, so they are held in every phase.
    held = {k: v for k, v in static.items() if k not in ("gradients", "fsdp_unsharded_grads")}
    # Set-up: FSDP loads unit by unit (a unit read, then flattened: two copies of it at once) on top
    # of the shards made so far; DDP / one process holds the whole model.
    if "fsdp_unsharded" in static:
        loading = 2 * max(prof.largest_block_params, prof.root_params) * s.master_bytes
    else:
        loading = 0
    frozen = {k: static[k] for k in ("frozen_base", "kl_reference") if k in static}
    phases = {
        "setup": {"parameters": static["parameters"], **frozen, "loading": loading,
                  "reward_model": common["reward_model"], "vae_weights": common["vae_weights"],
                  "hccl_buffers": common["hccl_buffers"]},
        # A weight copy sampled with (NFT's old policy) is swapped in: the trained shards wait in a backup
        # (training.ema.EMA.swapped_in). In the update it is swapped in only for the no-grad v_old forwards.
        "rollout": {**held, **common, "activations": prof.rollout_activations,
                    "swap_backup": static["parameters"] if s.old_policy else 0, **rollout_gathered_copy(prof, s)},
        "vae_decode": {**held, **common, "activations": prof.vae_decode},
        "update": {**static, **common, "activations": prof.update_activations},
    }
    if not s.grads_held:
        # Activations peak at the start of the backward, before any gradient exists; the gradients
        # peak at its end, when the activations are gone.
        at_activation_peak = {**phases["update"], "gradients": 0}
        at_gradient_peak = {**phases["update"], "activations": 0}
        phases["update"] = max(at_activation_peak, at_gradient_peak, key=lambda p: sum(p.values()))
    totals = {name: sum(parts.values()) for name, parts in phases.items()}
    peak_phase = max(totals, key=totals.get)
    return MemoryEstimate(components=phases[peak_phase], phases=totals, peak_phase=peak_phase,
                          peak_bytes=totals[peak_phase])
