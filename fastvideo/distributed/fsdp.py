"""Data parallelism applied to a built model from outside: FSDP per transformer block, DDP, or nothing.

    model = wrap_model(model, "full", device, gradient_checkpointing=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], ...)
    ...loss.backward()...
    norm = clip_grad_norm(model, max_grad_norm)   # same value on every rank
    optimizer.step()

Strategies: "full" shards parameters, gradients and optimizer state over all ranks; "zero2" the
same but keeps the gathered parameters from forward to backward (SHARD_GRAD_OP: a rollout gathers
once, the whole model then sits unsharded on each device); "hybrid" shards
within a node and replicates across nodes (a 2-D mesh); "hybrid_zero2" the same but keeps the
gathered parameters from forward to backward (ZeRO-2); "none" keeps a full replica per rank and
averages gradients with DDP. One process (no process group) always gets the plain module.

Why FSDP1 (``FullyShardedDataParallel``) and not FSDP2 (``fully_shard``)
-------------------------------------------------------------------------
Both exist as public API in torch 2.7.1 (FSDP2 moved to ``torch.distributed.fsdp`` in 2.6) and in
2.14, and both run on gloo/CPU in both versions (checked while writing this). FSDP1 is chosen because:

* Ascend: the Ascend PyTorch extension's API support table for 2.7.1 lists FullyShardedDataParallel,
  its clip_grad_norm_, ShardingStrategy, MixedPrecision and CPUOffload as supported (device_id
  recommended), and the Ascend DanceGRPO recipe this project ports runs FSDP1 on exactly torch 2.7.1
  with extension 2.7.1 over HCCL. The extension supports FSDP2 only from 2.6, with user reports on
  2.7.1 of CPU offload not taking effect. No Ascend device is available here to test on, so we take
  the path already proven there.
* Checkpoints: the torch.distributed.checkpoint.state_dict API (get/set_model_state_dict,
  get/set_optimizer_state_dict with full_state_dict=True, broadcast_from_rank0=True on load) gives
  exact full model and AdamW state round trips for FSDP1 (use_orig_params=False), DDP and plain
  modules on both torch versions (checked). With use_orig_params=True the broadcast load came back
  wrong on torch 2.14, so we keep flat parameters. The checkpoint code only calls that API, so moving
  to FSDP2 later changes this file only.
* EMA: with flat parameters each rank holds one flat shard per FSDP unit; the EMA shadows exactly
  those tensors and updates them with a handful of foreach kernels, without any gathering.

LoRA (frozen base, fp32 or bf16 with --lora_base_precision bf16, + trainable fp32 adapters): FSDP1 flat parameters must be uniform in
requires_grad and dtype. ``replicate_frozen`` leaves the frozen parameters out of FSDP (each rank
keeps the whole frozen base, never gathered), so each block's unit holds exactly its adapters: one
unit per block, not one per adapter Linear (~380 for FLUX), and no gather of the base per forward.
``extra_units`` (training/lora.is_adapter_unit) is the layout with a sharded base: each adapter
Linear its own unit nested in its block's unit of frozen weights (with CPU offload). Adapter-only
checkpoints load through load_trainable_state_dict, which gathers one trainable unit at a time.

"none" uses DDP rather than a manual all-reduce after backward: DDP buckets and overlaps the
all-reduce with backward, works with gloo and HCCL, is understood by the state-dict API, and needs no
extra call in the training loop (a forgotten manual sync would silently train diverging replicas).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from fastvideo import devices
from fastvideo.distributed.checkpointing import (  # noqa: F401  (re-exported: their former home)
    _blocks_in_order,
    _no_blocks_message,
    apply_activation_checkpointing,
    default_block_classes,
    is_checkpointed,
)

STRATEGIES = ("full", "zero2", "hybrid", "hybrid_zero2", "none")
HYBRID = ("hybrid", "hybrid_zero2")  # upstream's hybrid_full (HYBRID_SHARD) and hybrid_zero2
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"


@dataclass(frozen=True)
class PrecisionPolicy:
    """FSDP mixed precision: parameters are all-gathered and computed in ``param_dtype``;
    gradients are reduced in ``reduce_dtype``. The sharded master weights keep their own dtype."""

    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = torch.float32
    # Cast the root's forward inputs to param_dtype (FSDP's default). False leaves them to autocast:
    # the trainer's sigma / timestep and position ids stay float32.
    cast_inputs: bool = True


def hybrid_mesh_shape(world_size: int, local_world_size: int | None) -> tuple[int, int]:
    """(replicate, shard) sizes of the hybrid-sharding mesh: shard within a node of
    ``local_world_size`` ranks, replicate across the ``world_size / local_world_size`` nodes."""
    if local_world_size is None:
        raise ValueError(
            f"hybrid sharding needs the number of ranks per node: set {ENV_LOCAL_WORLD_SIZE} "
            "(torchrun sets it) or use --fsdp_sharding_strategy full"
        )
    if local_world_size < 1 or local_world_size > world_size or world_size % local_world_size:
        raise ValueError(
            f"hybrid sharding cannot form a (nodes x ranks-per-node) mesh from world size {world_size} and "
            f"{ENV_LOCAL_WORLD_SIZE}={local_world_size}: the world size must be a multiple of the ranks per "
            "node. Launch the same number of processes on every node, or use --fsdp_sharding_strategy full"
        )
    return world_size // local_world_size, local_world_size


def _local_world_size_from_env() -> int | None:
    value = os.environ.get(ENV_LOCAL_WORLD_SIZE)
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"{ENV_LOCAL_WORLD_SIZE}={value!r} is not an integer") from exc


# ---------------------------------------------------------------- wrapping
def _as_policy(mixed_precision) -> PrecisionPolicy | None:
    if mixed_precision is None or isinstance(mixed_precision, PrecisionPolicy):
        return mixed_precision
    if isinstance(mixed_precision, (tuple, list)) and len(mixed_precision) == 2:
        return PrecisionPolicy(*mixed_precision)
    raise TypeError(
        f"mixed_precision must be None, a PrecisionPolicy or (param_dtype, reduce_dtype), not {mixed_precision!r}"
    )


def wrap_model(
    model: nn.Module,
    strategy: str = "full",
    device: torch.device | str | None = None,
    mixed_precision: PrecisionPolicy | tuple[torch.dtype, torch.dtype] | None = None,
    cpu_offload: bool = False,
    gradient_checkpointing: bool = False,
    block_classes: Sequence[type[nn.Module]] | None = None,
    checkpoint_fraction: float = 1.0,
    extra_units=None,
    param_init_fn=None,
    forward_prefetch: bool = False,
    replicate_frozen: bool = False,
) -> nn.Module:
    """Wrap ``model`` for data-parallel training; returns the module to call, optimise and checkpoint.

    strategy: "full" (FSDP FULL_SHARD over all ranks), "hybrid" (FSDP HYBRID_SHARD on a
      (nodes, LOCAL_WORLD_SIZE) mesh: shard within a node, replicate across nodes; one node is full
      sharding, one rank per node is NO_SHARD replication), "hybrid_zero2" (_HYBRID_SHARD_ZERO2 on
      that mesh; one node: SHARD_GRAD_OP), "none" (DDP, gradients averaged).
      Each block of ``block_classes`` (default: the model's ``_no_split_modules``, see
      default_block_classes) becomes one FSDP unit.
    mixed_precision: FSDP compute/reduce dtypes (FSDP strategies only). The trainer normally leaves
      this None and uses devices.autocast over fp32 master weights instead.
    cpu_offload: keep the FSDP shards (and so the optimizer step) in host memory.
    gradient_checkpointing / checkpoint_fraction: recompute that fraction of the blocks (evenly spaced).

    extra_units: optional predicate (module -> bool) naming more modules to make FSDP units of
      their own, nested inside the blocks (LoRA adapters: training/lora.is_adapter_unit).
    param_init_fn: for a model built on the meta device (FSDP strategies on > 1 rank only): called by
      FSDP on each module of a unit to materialise and fill it just before that unit is sharded
      (fastvideo.models.sharded_load.UnitLoader).
    forward_prefetch: FSDP issues the next unit's all-gather before the current unit's forward
      (FSDP strategies only; --fsdp_forward_prefetch).
    replicate_frozen: keep the parameters that do not require grad out of FSDP, whole on every rank
      and on ``device`` (a LoRA base): the units then hold only trainable parameters.

    Build the optimizer from the returned module's parameters, after this call. Every rank must call
    this with the same model weights (all ranks load the same files).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sharding strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    policy = _as_policy(mixed_precision)
    device = torch.device(device) if device is not None else devices.get_device(devices.dist_env()[1])
    classes = tuple(block_classes or default_block_classes(model))
    if not _blocks_in_order(model, classes):
        raise ValueError(_no_blocks_message(model, classes))
    if strategy == "none" and (policy is not None or cpu_offload):
        raise ValueError(
            "strategy 'none' (DDP) supports neither mixed_precision nor cpu_offload; use strategy 'full' or "
            "'hybrid', or devices.autocast for mixed precision"
        )
    if cpu_offload and not devices.is_accelerator(device):
        warnings.warn("cpu_offload has no effect on a CPU device: parameters already live in host memory",
                      stacklevel=2)
        cpu_offload = False
    if gradient_checkpointing:
        apply_activation_checkpointing(model, classes, checkpoint_fraction)

    world = devices.world_size()
    if param_init_fn is not None and (world == 1 or strategy == "none"):
        raise ValueError("param_init_fn (a meta-device model filled unit by unit) needs an FSDP strategy on more "
                         "than one rank; load the model normally for DDP or a single process")
    if world == 1:
        # Sharding over one rank would only add copies; the plain module is the same computation.
        if policy is not None:
            warnings.warn("mixed_precision is an FSDP setting and is not applied to a single process; use autocast",
                          stacklevel=2)
        if cpu_offload:
            warnings.warn("cpu_offload is an FSDP setting and is not applied to a single process", stacklevel=2)
        return model.to(device)
    if strategy == "none":
        return _wrap_ddp(model, device)
    ignored = _replicated_frozen(model, device, cpu_offload or param_init_fn is not None) if replicate_frozen else None
    return _wrap_fsdp(model, strategy, device, policy, cpu_offload, classes, world, extra_units, param_init_fn,
                      forward_prefetch, ignored)


def _replicated_frozen(model: nn.Module, device: torch.device, offloaded: bool) -> list[nn.Parameter]:
    """The frozen parameters FSDP is to ignore (replicate_frozen), moved to ``device`` (FSDP does
    not move what it ignores)."""
    if offloaded:
        raise ValueError("replicate_frozen keeps the frozen parameters on the device: it takes neither cpu_offload "
                         "nor param_init_fn")
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.data = p.data.to(device)
    return frozen


def _wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model.to(device)
    device_ids = [device] if devices.is_accelerator(device) else None
    return DDP(model, device_ids=device_ids)


def _wrap_policy(classes, extra_units):
    from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

    if extra_units is None:
        return ModuleWrapPolicy(set(classes))
    return CustomPolicy(lambda m: isinstance(m, classes) or bool(extra_units(m)))


def _wrap_fsdp(model, strategy, device, policy, cpu_offload, classes, world, extra_units=None,
               param_init_fn=None, forward_prefetch=False, ignored=None) -> nn.Module:
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    kwargs = {}
    sharding = ShardingStrategy.FULL_SHARD
    if strategy in HYBRID:
        zero2 = strategy == "hybrid_zero2"
        replicate, shard = hybrid_mesh_shape(world, _local_world_size_from_env())
        if shard == 1:
            # One rank per node: pure replication. FSDP1 given a (W, 1) mesh silently switches to
            # NO_SHARD over the size-1 shard group and then never averages gradients across nodes
            # (measured: each rank trained its own replica), so ask for NO_SHARD over all ranks.
            sharding = ShardingStrategy.NO_SHARD
        elif replicate > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, (replicate, shard), mesh_dim_names=("replicate", "shard"))
            kwargs["device_mesh"] = mesh
            sharding = ShardingStrategy._HYBRID_SHARD_ZERO2 if zero2 else ShardingStrategy.HYBRID_SHARD
        elif zero2:  # a single node: ZeRO-2 over all ranks
            sharding = ShardingStrategy.SHARD_GRAD_OP
        # replicate == 1 (a single node): hybrid is exactly full sharding.
    elif strategy == "zero2":
        # SHARD_GRAD_OP over all ranks: a unit's gathered parameters stay until its backward, so a
        # rollout (forwards only) gathers each unit once instead of at every denoising step, at
        # the price of the whole unsharded model in device memory ("for rollouts that fit")
        sharding = ShardingStrategy.SHARD_GRAD_OP
    if policy is not None:
        kwargs["mixed_precision"] = MixedPrecision(param_dtype=policy.param_dtype, reduce_dtype=policy.reduce_dtype,
                                                   cast_root_forward_inputs=policy.cast_inputs)
    if cpu_offload:
        kwargs["cpu_offload"] = CPUOffload(offload_params=True)
        if param_init_fn is None:
            model.to("cpu")  # FSDP shards on the host; each unit is copied to device_id for its compute
    if param_init_fn is not None:
        kwargs["param_init_fn"] = param_init_fn
    if ignored:
        kwargs["ignored_states"] = ignored
    return FSDP(
        model,
        auto_wrap_policy=_wrap_policy(classes, extra_units),
        sharding_strategy=sharding,
        device_id=device,
        use_orig_params=False,  # flat parameters: see the module docstring
        limit_all_gathers=True,  # bounds the all-gathers in flight, which bounds peak memory
        forward_prefetch=forward_prefetch,
        **kwargs,
    )


# ---------------------------------------------------------------- helpers for the training loop
def is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return isinstance(model, FSDP)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside an FSDP / DDP wrapper (its .config, its block lists)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if is_fsdp(model) or isinstance(model, DDP):
        return model.module
    return model


def free_unsharded_params(model: nn.Module) -> None:
    """Drop gathered (unsharded) parameters that FSDP1 still holds.

    FSDP1 keeps the root unit's all-gathered parameters after a forward (expecting a backward) and
    reuses them at the next forward without gathering again. Code that writes the local shards
    outside the optimizer (the EMA swap) must call this first, or the next forward and state dict
    silently see the old weights (measured). No-op for DDP and plain modules. Uses FSDP1's own
    reshard routine (private, unchanged from torch 2.7 to 2.14).
    """
    if not is_fsdp(model):
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._runtime_utils import _reshard

    for module in FSDP.fsdp_modules(model):
        handle = getattr(module, "_handle", None)
        # Before FSDP's lazy initialisation (a swap ahead of the first forward: NFT's old-policy
        # rollout) no unsharded buffer exists, so nothing is gathered and needs_unshard would fail.
        if handle is None or not hasattr(handle.flat_param, "_full_param_padded"):
            continue
        if handle.uses_sharded_strategy and not handle.needs_unshard():
            _reshard(module, handle, True)


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Clip the global gradient norm to ``max_norm`` (None or <= 0: measure only) and return the
    total norm before clipping as a 0-d float tensor on the gradients' device (no host sync).

    FSDP: the root's clip_grad_norm_ reduces the per-shard norms across ranks. DDP / plain: the
    gradients are already identical on every rank, so torch.nn.utils.clip_grad_norm_ is global.
    Every rank returns the same value, so a decision taken on it (skip a non-finite step) agrees.
    """
    limit = math.inf if max_norm is None or max_norm <= 0 else float(max_norm)
    if is_fsdp(model):
        norm = model.clip_grad_norm_(limit)
    else:
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor norm (per-parameter sharding)
    return full_tensor() if callable(full_tensor) else norm


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The tensors the optimizer and the EMA see: FSDP flat shards, DDP / plain parameters."""
    return [p for p in model.parameters() if p.requires_grad]


# ---------------------------------------------------------------- full (unsharded) state dicts
def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _offload_to_cpu(model: nn.Module) -> bool:
    """Gather to host memory on rank 0 only when the parameters live on an accelerator (or FSDP
    offloads them there). With CPU-resident parameters offloading buys nothing, and FSDP1's
    offload_to_cpu path breaks on them in torch 2.7.1 (storage of size 0 error)."""
    offload = getattr(getattr(model, "cpu_offload", None), "offload_params", False)
    return bool(offload) or any(devices.is_accelerator(p.device) for p in model.parameters())


def _options(model: nn.Module, *, load: bool, **extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if not _distributed():
        return StateDictOptions(full_state_dict=True, **extra)
    if load:
        # Only rank 0 reads the files; the tensors reach the other ranks by broadcast, so host memory
        # holds one full copy per node instead of one per rank.
        return StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, **extra)
    return StateDictOptions(full_state_dict=True, cpu_offload=_offload_to_cpu(model), **extra)


def _rank0_only(state: dict) -> dict:
    return state if devices.rank() == 0 else {}


def full_model_state_dict(model: nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """Collective. The full, unsharded state dict with the unwrapped model's parameter names
    (diffusers' names for FLUX) on rank 0; {} on the other ranks. Values may alias live parameters
    on a single process: copy them before changing the model. trainable_only: only the parameters
    that require grad (LoRA adapters), no buffers."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if trainable_only and is_fsdp(model):
        return _rank0_only(_gathered_trainable(model))
    options = _options(model, load=False, ignore_frozen_params=trainable_only)
    state = _rank0_only(get_model_state_dict(model, options=options))
    if trainable_only:
        # ignore_frozen_params keeps persistent buffers (SD3's pos_embed.pos_embed): drop them
        buffers = {_clean_name(n) for n, _ in unwrap_model(model).named_buffers()}
        state = {k: v for k, v in state.items() if k not in buffers}
    return state


def load_full_model_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Collective. Load a full state dict that rank 0 holds (other ranks may pass {}); the wrapper
    shards it. Consumes ``state_dict``. strict=False: rank 0's dict holds exactly the trainable
    parameters (LoRA adapters) and the frozen ones are left as they are (load_trainable_state_dict)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    if not strict:
        load_trainable_state_dict(model, state_dict)
        return

    set_model_state_dict(model, _rank0_only(state_dict), options=_options(model, load=True, strict=strict))


def _clean_name(name: str) -> str:
    """A wrapped module's name as in the unwrapped model (no FSDP / DDP / checkpoint prefixes)."""
    return ".".join(p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module"))


def _trainable_leaves(model: nn.Module):
    """(module name in the unwrapped model, module) of every module that directly owns trainable
    parameters; FSDP1 units of trainable parameters stand for their wrapped module."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    root = unwrap_model(model) if not is_fsdp(model) else model
    out = []
    for name, module in root.named_modules():
        if isinstance(module, FSDP):
            flat = getattr(getattr(module, "_handle", None), "flat_param", None)
            if flat is not None and flat.requires_grad:
                out.append((_clean_name(name), module))
        elif not is_fsdp(model) and any(p.requires_grad for p in module.parameters(recurse=False)):
            out.append((name, module))
    return out


def _unit_trainable(inner: nn.Module, unit: bool):
    """(name, parameter) of the trainable parameters ``inner`` owns: directly, or for an FSDP unit
    anywhere below it except inside nested units (a block unit holding its adapters)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not unit:
        return list(inner.named_parameters(recurse=False))
    nested = [n + "." for n, m in inner.named_modules() if n and isinstance(m, FSDP)]
    return [(_clean_name(n), p) for n, p in inner.named_parameters()
            if p.requires_grad and not any(n.startswith(prefix) for prefix in nested)]


def _gathered_trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective (FSDP1). The trainable parameters on rank 0 (host copies; {} elsewhere), gathered
    one trainable unit at a time: a frozen base that FSDP shards (LoRA under CPU offload) is never
    gathered. torch's get_model_state_dict(ignore_frozen_params=True) gathers the whole model
    first, and with rank0_only (cpu_offload) it fails on the other ranks, whose dicts lack the
    frozen entries it then pops (KeyError, measured on torch 2.14)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._runtime_utils import _lazy_init

    _lazy_init(model, model)  # as load_trainable_state_dict: initialise from the real root
    offload, out = _offload_to_cpu(model), {}
    for name, module in _trainable_leaves(model):
        with FSDP.summon_full_params(module, recurse=False, writeback=False, rank0_only=True,
                                     offload_to_cpu=offload):
            if devices.rank() == 0:
                for pname, param in _unit_trainable(module.module, True):
                    out[f"{name}.{pname}" if name else pname] = param.detach().to("cpu", copy=True)
    return out


def load_trainable_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Collective. Copy rank 0's trainable parameters (names as the unwrapped model's) into every
    rank's model, leaving frozen ones alone: each tensor is broadcast and written into its
    parameter, under FSDP1 by gathering that adapter unit alone (summon_full_params with
    writeback), so no rank ever holds the full frozen base. torch's set_model_state_dict with
    strict=False cannot do this for FSDP1 flat parameters: it mixes the frozen units' local shards
    into the full dict it loads (size mismatch, measured on torch 2.14)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    distributed = _distributed() and devices.world_size() > 1
    if is_fsdp(model):
        # Summoning a nested unit first would make it believe it is a root (FSDP1 initialises
        # lazily from whichever unit is used first); initialise from the real root, as a forward
        # would. Private helper, unchanged from torch 2.7 to 2.14 (like _reshard above).
        from torch.distributed.fsdp._runtime_utils import _lazy_init

        _lazy_init(model, model)
    seen = set()
    for name, module in _trainable_leaves(model):
        inner = module.module if isinstance(module, FSDP) else module
        ctx = FSDP.summon_full_params(module, recurse=False, writeback=True) if isinstance(module, FSDP) \
            else contextlib.nullcontext()
        with ctx, torch.no_grad():
            for pname, param in _unit_trainable(inner, isinstance(module, FSDP)):
                key = f"{name}.{pname}" if name else pname
                seen.add(key)
                if devices.rank() == 0:
                    if key not in state_dict:
                        raise KeyError(f"trainable parameter {key} is missing from the state dict")
                    buf = state_dict[key].to(device=param.device, dtype=param.dtype)
                else:
                    buf = torch.empty_like(param)
                if distributed:
                    dist.broadcast(buf, src=0)
                param.copy_(buf.view_as(param))
    extra = set(state_dict) - seen if devices.rank() == 0 else set()
    if extra:
        raise KeyError(f"state dict entries that are not trainable parameters of the model: {sorted(extra)[:5]}")


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Collective. {"state": {param name: {"step", "exp_avg", ...}}, "param_groups": [...]} keyed
    by the unwrapped model's parameter names, independent of the world size; {} on ranks != 0."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return _rank0_only(get_optimizer_state_dict(model, optimizer, options=_options(model, load=False)))


def load_full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Collective. Inverse of full_optimizer_state_dict (rank 0's dict is used). Consumes ``state``."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    tuples = [{k for k, v in group.items() if isinstance(v, tuple)} for group in optimizer.param_groups]
    set_optimizer_state_dict(model, optimizer, _rank0_only(state), options=_options(model, load=True))
    # The setter hands back hyper-parameters like AdamW's betas as lists; keep the optimizer's own types.
    for group, keys in zip(optimizer.param_groups, tuples):
        for key in keys:
            if isinstance(group.get(key), list):
                group[key] = tuple(group[key])
