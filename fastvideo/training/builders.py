"""Build each piece of a training run from the typed config (models, data, rewards, optimiser...)."""

from __future__ import annotations

from pathlib import Path

import torch

from fastvideo import devices
from fastvideo.config import TrainConfig
from fastvideo.models import sharded_load


def build_family(cfg: TrainConfig):
    """The model family of --model_family, carrying the rollout's forward settings, and a plugin
    family's own settings (its section of cfg.plugins) as ``settings``."""
    from fastvideo.models.registry import family_factory

    factory = family_factory(cfg.model.family)
    own = getattr(getattr(factory, "settings", None), "section", None)
    extra = {"settings": cfg.plugins[own]} if own in cfg.plugins else {}
    return factory(guidance_scale=cfg.rollout.guidance_scale, quantize_timestep=cfg.rollout.quantize_timestep,
                   **extra, **recorded_family_settings(cfg.data_json_path))


def recorded_family_settings(data_json_path: str) -> dict:
    """What the preprocessing recorded beside the embeddings that the family must share (an editing
    family's --source_vae_size area, as ``vae_area``: the evaluation's held-out sources are encoded at
    it too); {} for folders without it (text-to-image, upstream DanceGRPO's)."""
    from fastvideo.data_preprocess.embeddings import META_NAME
    from fastvideo.utils import read_json_or_none

    meta = read_json_or_none(Path(data_json_path).parent / META_NAME)
    area = meta.get("settings", {}).get("source_vae_area") if isinstance(meta, dict) else None
    return {} if area is None else {"vae_area": int(area)}


def _transformer_root(cfg: TrainConfig, family) -> tuple[Path, str | None]:
    """(folder, subfolder) holding the transformer: --dit_model_name_or_path may name a model
    folder or a transformer folder itself."""
    dit = cfg.model.dit_model_name_or_path
    if dit is None:
        return Path(cfg.model.pretrained_model_name_or_path), "transformer"
    dit = Path(dit)
    if (dit / "transformer" / "config.json").is_file():
        return dit, "transformer"
    if (dit / "config.json").is_file():
        return dit, None
    raise family.folder_error(
        f"--dit_model_name_or_path {str(dit)!r} holds neither transformer/config.json nor config.json; "
        f"point it at a {family.name} folder or at an exported transformer folder (python -m fastvideo.tools.export)"
    )


def _load_transformer(cfg: TrainConfig, device: torch.device, dtype: torch.dtype, family):
    root, sub = _transformer_root(cfg, family)
    loader = None
    if sub is not None and cfg.model.dit_model_name_or_path is None:
        family.check_folder(root, family.training_components)
    # LoRA adds adapters that are not in the files, and its base is cast before wrapping: it keeps
    # the plain load (its frozen base is what it saves memory on).
    if sharded_load.uses_sharded_load(cfg.fsdp_strategy, devices.world_size()) and not cfg.lora.enabled:
        # FSDP: built on meta, each unit read from the files onto the device as it is sharded.
        init_device = torch.device("cpu") if cfg.cpu_offload else device
        model, loader = sharded_load.meta_transformer(root, sub, dtype, init_device, family)
        family.adapt_for_device(model, device)
    else:
        model = family.load_transformer(root, sub, device, dtype)
    return model, loader


def check_sequence_parallel(cfg: TrainConfig, family, world_size: int) -> None:
    """--sp_size against the family, the world, the transformer's heads and the image tokens of
    --h/--w, from config.json alone: one line (ConfigError) before any model loads."""
    if cfg.sp_size == 1:
        return
    from fastvideo.distributed.sequence_parallel import check_sizes
    from fastvideo.models.file_check import read_config

    root, sub = _transformer_root(cfg, family)
    config, _ = read_config(root / sub / "config.json" if sub else root / "config.json")
    config = config or {}  # an unreadable config is check_model_files' to report: heads and tokens unchecked
    plan = family.sequence_parallel_plan()
    heads = config.get(plan.heads_key) if plan is not None else None
    tokens = None  # unknown (a family without a nominal layout): its split refuses at the first forward
    if config:
        tokens = family.sequence_tokens(cfg.rollout.height, cfg.rollout.width, config, _cond_dims(cfg, family))
    check_sizes(cfg.sp_size, world_size, heads, tokens, family.name, plan is not None)


def _cond_dims(cfg: TrainConfig, family) -> tuple | None:
    """The embeddings' dims of prompt 0 (check_record's tuple: an editing family's source tokens),
    or None when they cannot be read (the data checks report that, one line, later)."""
    from fastvideo.data.dataset import PromptEmbeddingDataset
    from fastvideo.errors import UserError

    try:
        return PromptEmbeddingDataset(cfg.data_json_path, family=family).dims()
    except (UserError, OSError, ValueError, RuntimeError, KeyError):
        return None


def install_sequence_parallel(models, family, dims) -> None:
    """The family's sequence-parallel plan on each of ``models`` (wrapped; None skipped), one shard
    each (its token split is per forward); nothing while --sp_size 1."""
    from fastvideo.distributed.sequence_parallel import install, sequence_shard

    if dims is None or dims.sp == 1:
        return
    for model in models:
        if model is not None:
            install(model, family.sequence_parallel_plan(), sequence_shard(dims))


def build_models(cfg: TrainConfig, device: torch.device, family=None):
    """Transformer (master weights in --master_weight_type, wrapped for FSDP) and frozen VAE.
    With --use_lora: a frozen base in the compute dtype with trainable adapters (training/lora.py).
    family: the ModelFamily (default: build_family(cfg))."""
    from fastvideo.distributed.fsdp import wrap_model

    family = family if family is not None else build_family(cfg)
    dtype = torch.float32 if cfg.model.master_weight_type == "fp32" else torch.bfloat16
    model, loader = _load_transformer(cfg, device, dtype, family)
    # JSON-safe copy (diffusers keeps the load path as a Path under _name_or_path).
    transformer_config = {k: v for k, v in dict(model.config).items() if not k.startswith("_")}
    # a model of several diffusers transformers (Wan2.2-A14B's experts) names their class
    transformer_config["_class_name"] = getattr(model, "diffusers_class_name", type(model).__name__)
    extra_units = None
    if cfg.lora.enabled:
        from fastvideo.training import lora

        model.requires_grad_(False)
        for part in family.trained_parts(model):  # the family's trained modules (both experts of Wan2.2-A14B)
            lora.apply_lora(part, cfg.lora, base_dtype=lora_base_dtype(cfg), adapter_dtype=dtype, seed=cfg.optim.seed)
        # One FSDP unit per block holding its adapters, the frozen base replicated (never gathered);
        # with CPU offload the base stays sharded (an adapter unit per Linear, nested in its block).
        extra_units = None if _replicate_frozen(cfg) else lora.is_adapter_unit
    else:
        extra_units = _select_trainable(cfg, model, family)
    model = wrap_model(
        model,
        strategy=cfg.fsdp_strategy,
        device=device,
        cpu_offload=cfg.cpu_offload,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        block_classes=family.block_classes(),
        checkpoint_fraction=cfg.model.selective_checkpointing,
        extra_units=extra_units,
        param_init_fn=loader,
        mixed_precision=fsdp_precision(cfg),
        forward_prefetch=cfg.fsdp_forward_prefetch,
        replicate_frozen=_replicate_frozen(cfg),
        version=cfg.fsdp_version,
    )
    if loader is not None:
        loader.check_complete()
    compile_model(cfg, model, device, family)
    vae_dtype = vae_dtype_for(cfg.model.vae_precision, device)
    vae = family.load_vae(cfg.model.vae_model_path, device=device, dtype=vae_dtype)
    return transformer_config, model, vae


def _select_trainable(cfg: TrainConfig, model: torch.nn.Module, family):
    """--trainable_modules on the full model (training/trainable.py); FSDP1's extra units for a
    partial selection (each trained module its own unit), None otherwise (all: as before)."""
    from fastvideo.training.trainable import select_trainable, trainable_units

    trained, total = select_trainable(model, cfg.model.trainable_modules, cfg.model.family)
    parts = family.trained_parts(model)
    if parts != (model,):  # the family's frozen parts (a Wan2.2-A14B expert --train_experts leaves out)
        kept = {id(p) for part in parts for p in part.parameters()}
        for p in model.parameters():
            p.requires_grad_(p.requires_grad and id(p) in kept)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trained == total:
        return None
    if devices.rank() == 0:
        print(f"--trainable_modules {cfg.model.trainable_modules}: training {trained} of {total} transformer "
              f"parameters ({100.0 * trained / total:.1f}%)", flush=True)
    fsdp1 = cfg.fsdp_strategy != "none" and cfg.fsdp_version == 1 and devices.world_size() > 1
    return trainable_units(model) if fsdp1 else None


def compile_model(cfg: TrainConfig, model: torch.nn.Module, device: torch.device, family) -> None:
    """--compile: the family's block classes compiled in place, after wrapping (models/compile.py),
    with the device layer's backend; nothing without the flag."""
    if not cfg.model.compile:
        return
    from fastvideo.models.compile import compile_blocks

    try:
        backend = devices.compile_backend(device, cfg.model.compile_backend)
    except ValueError as err:
        from fastvideo.errors import ConfigError

        raise ConfigError(str(err)) from None
    compile_blocks(model, family.block_classes(), backend)


def lora_base_dtype(cfg: TrainConfig) -> torch.dtype:
    """The frozen base's dtype under LoRA (--lora_base_precision): the master dtype by default, as
    upstream's LoRA script keeps it (float32, computed under bf16 autocast), or bf16 (half the
    memory; nothing trains the base, so no master copy is needed)."""
    if cfg.lora.base_precision == "bf16":
        return torch.bfloat16
    return torch.float32 if cfg.model.master_weight_type == "fp32" else torch.bfloat16


def build_kl_reference(cfg: TrainConfig, model: torch.nn.Module, device: torch.device, family=None):
    """The frozen reference policy of a KL term (None when the objective needs none; GRPO's and
    NFT's --kl_coef): the model itself with its adapters off under LoRA (no copy); for full
    fine-tuning a frozen copy of the initial weights in the master dtype (so that the KL is exactly
    0 before the first update), sharded like the model under FSDP (one more model's worth of
    parameters / world size per rank), a replica under DDP or on one process."""
    if not cfg.objective_needs().reference:
        return None
    from fastvideo.training.kl_reference import AdapterOffReference, FrozenCopyReference

    if cfg.lora.enabled:
        return AdapterOffReference(model)
    from fastvideo.distributed.fsdp import wrap_model

    family = family if family is not None else build_family(cfg)
    dtype = torch.float32 if cfg.model.master_weight_type == "fp32" else torch.bfloat16
    ref, loader = _load_transformer(cfg, device, dtype, family)
    ref.requires_grad_(False).eval()
    if cfg.fsdp_strategy != "none" and devices.world_size() > 1:
        ref = wrap_model(ref, strategy=cfg.fsdp_strategy, device=device, cpu_offload=cfg.cpu_offload,
                         block_classes=family.block_classes(), param_init_fn=loader,
                         mixed_precision=fsdp_precision(cfg), forward_prefetch=cfg.fsdp_forward_prefetch,
                         version=cfg.fsdp_version)
    if loader is not None:
        loader.check_complete()
    compile_model(cfg, ref, device, family)
    return FrozenCopyReference(ref)


def build_dataset(cfg: TrainConfig, family=None):
    from fastvideo.data.dataset import PromptEmbeddingDataset

    return PromptEmbeddingDataset(cfg.data_json_path, family=family if family is not None else build_family(cfg),
                                  cache_bytes=cfg.embedding_cache_mb * 2**20)


def build_sampler(cfg: TrainConfig, num_prompts: int, dims, data_randomness=None):
    """The prompt sampler over the data-parallel ranks (``dims``: distributed.parallel.ParallelDims);
    with --dump/--load_randomness its epoch order comes from (and is captured by or replayed from)
    ``data_randomness``."""
    from fastvideo.data.sampler import GroupDistributedSampler

    order_fn = data_randomness.data_order if data_randomness is not None else None
    return GroupDistributedSampler(
        num_prompts=num_prompts, rank=dims.dp_rank, world_size=dims.dp_size,
        prompts_per_rank=cfg.prompts_per_rank, sampler_seed=cfg.optim.sampler_seed, order_fn=order_fn,
    )


def vae_dtype_for(precision: str, device: torch.device) -> torch.dtype:
    """--vae_precision -> the VAE weights' dtype. auto keeps bf16 to accelerators; on CPU fp32 is
    the exact reference (bf16 is faster on CPUs with AMX, see bench/decode.py, but changes pixels)."""
    if precision == "auto":
        return torch.bfloat16 if devices.is_accelerator(device) else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]


def overlap_reward_scoring(setting: str, train_device: torch.device, reward_device: torch.device) -> bool:
    """--reward_overlap -> whether to score rollout chunks on a worker thread during sampling.

    auto overlaps only when rollout and reward run on different devices (an accelerator and the
    CPU): on one CPU the two compete for the same cores (an iteration ran at 0.74x with overlap,
    bench/iteration.py --overlap_ab), and on one accelerator the reward is a tiny share of an
    iteration (docs/performance.md)."""
    if setting == "auto":
        return torch.device(train_device).type != torch.device(reward_device).type
    return setting == "on"


def reward_device_for(cfg: TrainConfig, device: torch.device) -> torch.device:
    return device if cfg.reward.device == "train" else torch.device("cpu")


def reward_dtype(precision: str) -> torch.dtype | None:
    """--reward_precision -> the rewards' autocast dtype; None (auto) lets each reward pick float16
    on an accelerator, as upstream scores HPS, and float32 on the CPU."""
    return {"auto": None, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]


def rank_reward_specs(specs: list, rank: int) -> list:
    """The specs one data-parallel rank builds: a spec listing several servers joined with ``|``
    (MixGRPO's comma-separated --unified_reward_url) asks server ``rank mod n``, as MixGRPO spreads
    its ranks."""
    from dataclasses import replace

    out = []
    for spec in specs:
        urls = spec.url.split("|") if spec.url else []
        out.append(replace(spec, url=urls[rank % len(urls)]) if len(urls) > 1 else spec)
    return out


def check_reward_endpoints(cfg: TrainConfig) -> None:
    """remote:/vlm: rewards must answer at start-up (rewards/remote.py), every listed server of
    them, and a served reward that needs source images must have them (a family that edits;
    ``cfg.model`` absent: not checked); nothing to do otherwise."""
    if any(s.url for s in cfg.reward.spec):
        from fastvideo.rewards.remote import check_reward_endpoints as check

        most = max(len(s.url.split("|")) if s.url else 1 for s in cfg.reward.spec)
        served = [pair for r in range(most) for pair in check(rank_reward_specs(cfg.reward.spec, r))]
        model = getattr(cfg, "model", None)
        if model is not None:
            cfg.reward.check_served_sources(model.family, served)


def reward_build_kwargs(cfg: TrainConfig, device: torch.device, family=None) -> tuple[dict, dict]:
    """(per-reward keyword arguments, arguments every reward takes) from the reward flags. A clip
    reward without its clips' frame rate (--videoalign_clip_fps) gets ``family``'s video_fps (the
    rate its clips are written at; models.base.ModelFamily, set once the folder loaded)."""
    from fastvideo.rewards.flags import RewardExtras, model_reward_kwargs

    r = cfg.reward
    per_reward = model_reward_kwargs(r, r.extras or RewardExtras())
    if getattr(family, "video_fps", None):
        per_reward["videoalign"].setdefault("clip_fps", float(family.video_fps))
    return per_reward, {"device": reward_device_for(cfg, device), "batch_size": r.batch_size,
                        "dtype": reward_dtype(r.precision)}


def build_rewards(cfg: TrainConfig, device: torch.device, rank: int = 0, family=None):
    """The run's rewards as data-parallel rank ``rank`` builds them (rank_reward_specs); ``family``:
    see reward_build_kwargs."""
    from fastvideo.rewards.combine import build_multi_reward
    from fastvideo.rewards.flags import RewardExtras
    from fastvideo.rewards.frames import parse_frame_selection

    r = cfg.reward
    per_reward, common = reward_build_kwargs(cfg, device, family)
    return build_multi_reward(rank_reward_specs(r.spec, rank), reward_kwargs=per_reward, common_kwargs=common,
                              normalize=r.group_norm, num_generations=cfg.rollout.num_generations,
                              mix=(r.extras or RewardExtras()).multi_reward_mix,
                              frames=parse_frame_selection((r.extras or RewardExtras()).video_reward_frames))


def fsdp_precision(cfg: TrainConfig):
    """FSDP's MixedPrecision for --fsdp_param_dtype: None for fp32 gathers (upstream); bf16 gathers
    with fp32 gradient reduction into the fp32 master shards, inputs left to autocast. On one
    process there is no FSDP (the plain module; wrap_model warns)."""
    if cfg.fsdp_param_dtype == "fp32":
        return None
    from fastvideo.distributed.fsdp import PrecisionPolicy

    return PrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_inputs=False)


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module, dims=None):
    from diffusers.optimization import get_scheduler

    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    # The fused AdamW kernel (one kernel for all state updates) where torch has it: on CPU it cut the
    # time outside model compute of a small-preset iteration from 13.1% to 7.7% (bench/iteration.py,
    # docs/performance.md). Elsewhere the multi-tensor (foreach) path.
    # --adamw_kernel chooses another (devices.adamw_kernel_kwargs).
    kernel = devices.adamw_kernel_kwargs(next(iter(params)).device, o.adamw_kernel)
    optimizer = torch.optim.AdamW(params, lr=o.learning_rate, betas=(0.9, 0.999), weight_decay=o.weight_decay,
                                  eps=1e-8, **kernel)
    # Iterations x optimizer steps per iteration is what the schedule counts.
    steps_per_iteration = cfg.derived(dims.dp_size if dims is not None else devices.world_size())[
        "optimizer_steps_per_iteration"]
    scheduler = get_scheduler(
        o.lr_scheduler, optimizer=optimizer, num_warmup_steps=o.lr_warmup_steps,
        num_training_steps=o.max_train_steps * steps_per_iteration, num_cycles=o.lr_num_cycles, power=o.lr_power,
    )
    return optimizer, scheduler


def build_ema(cfg: TrainConfig, model: torch.nn.Module):
    if not cfg.optim.use_ema:
        return None
    from fastvideo.training.ema import EMA

    return EMA(model, decay=cfg.optim.ema_decay, warmup=cfg.optim.ema_warmup)


def build_randomness(cfg: TrainConfig, info: devices.DistInfo, kind: str = "train"):
    from fastvideo.sampling.randomness import RandomSource

    source = RandomSource(cfg.optim.seed if kind == "train" else cfg.optim.sampler_seed)
    sub = "" if kind == "train" else "data"
    if cfg.output.dump_randomness:
        source.capture(Path(cfg.output.dump_randomness) / sub, rank=info.rank, world_size=info.world_size)
    elif cfg.output.load_randomness:
        source.replay(Path(cfg.output.load_randomness) / sub)
    return source


def build_checkpointer(cfg: TrainConfig):
    from fastvideo.training.checkpoint import Checkpointer

    return Checkpointer(cfg.output.output_dir, keep_last=cfg.output.checkpoints_total_limit,
                        trainable_only=cfg.lora.enabled, sharded=cfg.output.checkpoint_format == "sharded")


def _replicate_frozen(cfg) -> bool:
    """LoRA's frozen base outside FSDP (one unit per block holding its adapters), for every
    objective: a weight copy swapped into the adapters (NFT's old policy) is seen by the forward and
    resumes bit for bit under it (tests/training/test_nft_training.py). Not with CPU offload (the
    base then stays sharded and offloaded, an adapter unit per Linear)."""
    return cfg.lora.enabled and not cfg.cpu_offload
