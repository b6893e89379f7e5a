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

Why FSDP1 (``FullyShardedDataParallel``) by default, FSDP2 (``fully_shard``) with --fsdp_version 2
-------------------------------------------------------------------------------------------------
Both exist as public API in torch 2.7.1 (FSDP2 moved to ``torch.distributed.fsdp`` in 2.6) and in
2.14, and both run on gloo/CPU in both versions (checked while writing this). FSDP2 is
distributed/fsdp2.py (what differs is said there). FSDP1 stays the default because:

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
from torch import nn

from fastvideo import devices
from fastvideo.distributed.checkpointing import (  # noqa: F401  (re-exported: their former home)
    _blocks_in_order,
    _no_blocks_message,
    apply_activation_checkpointing,
    default_block_classes,
    is_checkpointed,
)
from fastvideo.distributed.full_state import (  # noqa: F401  (re-exported: their former home)
    _clean_name,
    _gathered_trainable,
    _offload_to_cpu,
    full_model_state_dict,
    full_optimizer_state_dict,
    is_fsdp,
    load_full_model_state_dict,
    load_full_optimizer_state_dict,
    load_trainable_state_dict,
    unwrap_model,
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
    version: int = 1,
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
    version: 1 (FullyShardedDataParallel, flat parameters) or 2 (fully_shard, DTensor parameters;
      distributed/fsdp2.py says what differs). FSDP strategies only; DDP and one process ignore it.

    Build the optimizer from the returned module's parameters, after this call. Every rank must call
    this with the same model weights (all ranks load the same files).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sharding strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if version not in (1, 2):
        raise ValueError(f"unknown FSDP version {version!r}; choose 1 (FullyShardedDataParallel) or 2 (fully_shard)")
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
        return _single_process(model, device, policy, cpu_offload)
    if strategy == "none":
        return _wrap_ddp(model, device)
    ignored = _replicated_frozen(model, device, cpu_offload or param_init_fn is not None) if replicate_frozen else None
    if version == 2:
        return _wrap_fsdp2(model, strategy, device, policy, cpu_offload, classes, world, extra_units, param_init_fn,
                           forward_prefetch, ignored)
    return _wrap_fsdp(model, strategy, device, policy, cpu_offload, classes, world, extra_units, param_init_fn,
                      forward_prefetch, ignored)


def _single_process(model: nn.Module, device: torch.device, policy, cpu_offload: bool) -> nn.Module:
    """Sharding over one rank would only add copies; the plain module is the same computation."""
    if policy is not None:
        warnings.warn("mixed_precision is an FSDP setting and is not applied to a single process; use autocast",
                      stacklevel=3)
    if cpu_offload:
        warnings.warn("cpu_offload is an FSDP setting and is not applied to a single process", stacklevel=3)
    return model.to(device)


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


def _wrap_fsdp2(model, strategy, device, policy, cpu_offload, classes, world, extra_units, param_init_fn,
                forward_prefetch, ignored) -> nn.Module:
    """FSDP2 (distributed/fsdp2.py); a meta-device model is sharded first, then ``param_init_fn``
    (a models.sharded_load.UnitLoader) fills each rank's rows from the files."""
    from fastvideo.distributed import fsdp2

    hybrid = hybrid_mesh_shape(world, _local_world_size_from_env()) if strategy in HYBRID else None
    mesh = fsdp2.shard_mesh(device, world, hybrid)
    model = fsdp2.wrap_fsdp2(model, strategy, device, policy, cpu_offload, classes, mesh, extra_units,
                             forward_prefetch, ignored)
    if param_init_fn is not None:
        param_init_fn.fill_sharded(model)
    return model


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
def free_unsharded_params(model: nn.Module) -> None:
    """Drop gathered (unsharded) parameters that FSDP1 still holds.

    FSDP1 keeps the root unit's all-gathered parameters after a forward (expecting a backward) and
    reuses them at the next forward without gathering again. Code that writes the local shards
    outside the optimizer (the EMA swap) must call this first, or the next forward and state dict
    silently see the old weights (measured). No-op for DDP and plain modules. Uses FSDP1's own
    reshard routine (private, unchanged from torch 2.7 to 2.14).
    """
    from fastvideo.distributed import fsdp2

    if fsdp2.is_fsdp2(model):
        fsdp2.reshard_all(model)
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


@contextlib.contextmanager
def gathered_forwards(model: nn.Module, enabled: bool = True):
    """No-grad forwards inside keep each FSDP unit's parameters gathered after their first gather
    (--rollout_weights gathered): a rollout of N steps gathers the model once instead of N times;
    on leaving, every gathered unit is freed. The same gathered values (FSDP's own gather, in its
    gather dtype) as gathering per forward, so the same numbers.

    How, in FSDP2: fsdp2.gathered_forwards (reshard_after_forward off for the pass). In FSDP1: for the pass, each full-shard unit's handle is given the
    strategy that does not free after a forward (FULL_SHARD -> SHARD_GRAD_OP, HYBRID_SHARD ->
    _HYBRID_SHARD_ZERO2, the mapping FSDP itself uses for zero2); a forward on a gathered unit
    finds nothing to gather. Only for forwards without backward: a backward would reduce-scatter
    as usual but the unit would stay gathered until the exit. No-op for DDP / plain modules, zero2
    and enabled=False."""
    from fastvideo.distributed import fsdp2

    if enabled and fsdp2.is_fsdp2(model):
        with fsdp2.gathered_forwards(model):
            yield
        return
    if not enabled or not is_fsdp(model):
        yield
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy as H

    keep = {H.FULL_SHARD: H.SHARD_GRAD_OP, H.HYBRID_SHARD: H._HYBRID_SHARD_ZERO2}
    changed = []
    for module in FSDP.fsdp_modules(model):
        handle = getattr(module, "_handle", None)
        if handle is not None and handle._sharding_strategy in keep:
            changed.append((handle, handle._sharding_strategy))
            handle._sharding_strategy = keep[handle._sharding_strategy]
    try:
        yield
    finally:
        for handle, strategy in changed:
            handle._sharding_strategy = strategy
        free_unsharded_params(model)


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Clip the global gradient norm to ``max_norm`` (None or <= 0: measure only) and return the
    total norm before clipping as a 0-d float tensor on the gradients' device (no host sync).

    FSDP: the root's clip_grad_norm_ reduces the per-shard norms across ranks. DDP / plain: the
    gradients are already identical on every rank, so torch.nn.utils.clip_grad_norm_ is global.
    Every rank returns the same value, so a decision taken on it (skip a non-finite step) agrees.
    """
    from fastvideo.distributed import fsdp2

    limit = math.inf if max_norm is None or max_norm <= 0 else float(max_norm)
    if fsdp2.is_fsdp2(model):
        return fsdp2.clip_grad_norm(model, limit)
    if is_fsdp(model):
        norm = model.clip_grad_norm_(limit)
    else:
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor norm (per-parameter sharding)
    return full_tensor() if callable(full_tensor) else norm


def grad_sync_paused(model: nn.Module):
    """A context in which backwards accumulate gradients without reducing them across ranks (the
    next backward outside reduces the sum): FSDP1 and DDP's no_sync(), FSDP2's
    set_requires_gradient_sync(False); nothing to pause on one process (a null context)."""
    from fastvideo.distributed import fsdp2

    if fsdp2.is_fsdp2(model):
        return fsdp2.grad_sync_paused(model)
    if hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def describe(model: nn.Module, strategy: str) -> str:
    """The wrapping on one line, for the start-up log: which wrapper, which strategy, its units."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fastvideo.distributed import fsdp2

    world = devices.world_size()
    if fsdp2.is_fsdp2(model):
        return f"FSDP2 (fully_shard), {strategy} sharding over {world} ranks, {len(fsdp2.fsdp2_modules(model))} units"
    if is_fsdp(model):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return (f"FSDP1 (FullyShardedDataParallel), {strategy} sharding over {world} ranks, "
                f"{len(FSDP.fsdp_modules(model))} units")
    if isinstance(model, DDP):
        return f"DDP over {world} ranks (a full replica each)"
    return "one process: the plain module"


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The tensors the optimizer and the EMA see: FSDP flat shards, DDP / plain parameters."""
    return [p for p in model.parameters() if p.requires_grad]
