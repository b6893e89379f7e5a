"""FSDP2 (``torch.distributed.fsdp.fully_shard``): the second wrapper behind fsdp.wrap_model
(--fsdp_version 2), and the training loop's helpers for it.

    model = wrap_model(model, "full", device, version=2)      # fsdp.py; lands in wrap_fsdp2 here

What differs from FSDP1 (fsdp.py), and why it matters to the callers:

* Parameters stay the model's own, each a DTensor sharded on dim 0 over the shard mesh (no flat
  parameters, no wrapper module: the model's names, class and ``.config`` are unchanged). The EMA
  shadows each DTensor's local shard (training/ema.py); the optimizer sees DTensors.
* Units are the same: one per block of ``block_classes`` (plus ``extra_units`` nested inside), and
  the root holding the rest. The root keeps its gathered parameters after a forward, as FSDP1's
  root does and as FSDP2 chooses for a root by default (they are needed again by the backward).
* Strategies map to ``reshard_after_forward`` and the mesh: full (True, 1-D mesh), zero2 (False),
  hybrid / hybrid_zero2 (a 2-D (replicate, shard) mesh: HSDP).
* Gradient accumulation without a reduce-scatter per micro-batch is
  ``set_requires_gradient_sync(False)`` (FSDP1 and DDP: ``no_sync()``): see grad_sync_paused.
* Keeping the weights gathered over a no-grad pass is ``set_reshard_after_forward(False)`` for its
  duration, then ``reshard()``: see gathered_forwards.
* A model built on the meta device is sharded first and filled afterwards, parameter by parameter,
  each rank writing only its own rows (models/sharded_load.UnitLoader.fill_sharded); FSDP1 instead
  calls the loader unit by unit while it wraps.

Not offered under FSDP2 (refused at start-up, one line): --checkpoint_format sharded (its files are
FSDP1's flat shards). The gathered checkpoint is wrapper-independent: a run saved under FSDP1
resumes under FSDP2 and back.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch
from torch import nn

# Marks each module fully_shard was applied to with the reshard_after_forward it was given, so
# that gathered_forwards can put it back (FSDP2 exposes a setter, not a getter).
_RESHARD_ATTR = "_fastvideo_reshard_after_forward"


def is_fsdp2(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def fsdp2_modules(model: nn.Module) -> list[nn.Module]:
    """Every module of ``model`` that fully_shard was applied to (the root included), in
    module order."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_mesh(device: torch.device, world: int, hybrid: tuple[int, int] | None):
    """The DeviceMesh FSDP2 shards over: 1-D over all ranks (full, zero2), or for hybrid strategies
    ``hybrid`` = (replicate, shard) sizes (fsdp.hybrid_mesh_shape: shard within a node) as a 2-D
    mesh; hybrid on one node (replicate 1) is full sharding."""
    from torch.distributed.device_mesh import init_device_mesh

    if hybrid is not None and hybrid[0] > 1:
        return init_device_mesh(device.type, hybrid, mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))


def _policies(policy, cpu_offload: bool) -> dict:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs = {}
    if policy is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=policy.param_dtype, reduce_dtype=policy.reduce_dtype,
                                                   cast_forward_inputs=policy.cast_inputs)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def _units(model: nn.Module, classes: tuple, extra_units) -> list[nn.Module]:
    """The modules to shard, innermost first (fully_shard must see a nested unit before the unit
    around it): the extra units, then the blocks."""
    blocks = [m for m in model.modules() if isinstance(m, classes)]
    extra = [m for m in model.modules() if extra_units is not None and not isinstance(m, classes) and extra_units(m)]
    return extra + blocks


def wrap_fsdp2(model: nn.Module, strategy: str, device: torch.device, policy, cpu_offload: bool,
               classes: Sequence[type[nn.Module]], mesh, extra_units=None, forward_prefetch: bool = False,
               ignored: list[nn.Parameter] | None = None) -> nn.Module:
    """fully_shard on every unit, then on the root; returns ``model`` itself (now an FSDPModule).
    A meta-device model stays on meta: fill it with UnitLoader.fill_sharded afterwards."""
    from torch.distributed.fsdp import fully_shard

    if not any(p.is_meta for p in model.parameters()) and not cpu_offload:
        model.to(device)
    reshard = strategy not in ("zero2", "hybrid_zero2")
    common = dict(mesh=mesh, **_policies(policy, cpu_offload))
    if ignored:
        common["ignored_params"] = set(ignored)
    blocks = []
    for unit in _units(model, tuple(classes), extra_units):
        fully_shard(unit, reshard_after_forward=reshard, **common)
        setattr(unit, _RESHARD_ATTR, reshard)
        if isinstance(unit, tuple(classes)):
            blocks.append(unit)
    fully_shard(model, reshard_after_forward=False, **common)
    setattr(model, _RESHARD_ATTR, False)
    if forward_prefetch:
        # The next block's all-gather is issued before this block's forward (FSDP1's forward_prefetch).
        for block, following in zip(blocks, blocks[1:]):
            block.set_modules_to_forward_prefetch([following])
    return model


def reshard_all(model: nn.Module) -> None:
    """Free every gathered parameter (fsdp.free_unsharded_params under FSDP2: the root keeps its
    parameters gathered after a forward; code that writes the local shards must free them first)."""
    for module in fsdp2_modules(model):
        module.reshard()


@contextlib.contextmanager
def gathered_forwards(model: nn.Module):
    """Each unit, once gathered by a forward inside, stays gathered until the exit, where all are
    freed (fsdp.gathered_forwards under FSDP2). For no-grad forwards only."""
    modules = fsdp2_modules(model)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for module in modules:
            module.set_reshard_after_forward(getattr(module, _RESHARD_ATTR, True), recurse=False)
        reshard_all(model)


@contextlib.contextmanager
def grad_sync_paused(model: nn.Module):
    """Backwards inside accumulate unsharded gradients without reducing them; the first backward
    after the exit reduces the accumulated sum (FSDP1 / DDP: ``no_sync()``)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def clip_grad_norm(model: nn.Module, limit: float) -> torch.Tensor:
    """The global gradient norm over the DTensor gradients (every shard, every rank), then clipped
    to ``limit``; a plain 0-d tensor, the same on every rank."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_([p for p in model.parameters() if p.grad is not None], limit, norm)
    return norm
