"""Full (unsharded) state dicts of a wrapped model, and what a wrapper is: the state-dict side of
fastvideo/distributed/fsdp.py, which re-exports every name here (callers keep using fsdp.X).

Rank 0 holds full state dicts keyed by the unwrapped model's parameter names (diffusers' names
for FLUX), whatever the world size and wrapping; the other ranks hold {}. Trainable-only state
(LoRA adapters) is gathered and loaded one trainable FSDP unit at a time, so a frozen base that
FSDP shards is never gathered.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from fastvideo import devices


# ---------------------------------------------------------------- what the wrapper is
def is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return isinstance(model, FSDP)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside an FSDP / DDP wrapper (its .config, its block lists)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if is_fsdp(model) or isinstance(model, DDP):
        return model.module
    return model


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


def _free_fsdp2(model: nn.Module) -> None:
    """FSDP2 leaves the root's parameters gathered after a forward, and while they are the modules
    hold plain tensors instead of the DTensor shards the optimizer was built on: free them first."""
    from fastvideo.distributed import fsdp2

    if fsdp2.is_fsdp2(model):
        fsdp2.reshard_all(model)


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
    options = _options(model, load=False, ignore_frozen_params=trainable_only)  # FSDP2: fine with a gathered root
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

    _free_fsdp2(model)
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


def _init_from_root(model: nn.Module) -> None:
    """Initialise FSDP1 from the real root before summoning one unit's parameters: summoning a
    nested unit first would make it believe it is a root (FSDP1 initialises lazily from whichever
    unit is used first), as a forward would not. Private helper, unchanged from torch 2.7 to 2.14
    (like fsdp.py's use of _reshard)."""
    from torch.distributed.fsdp._runtime_utils import _lazy_init

    _lazy_init(model, model)


def _gathered_trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective (FSDP1). The trainable parameters on rank 0 (host copies; {} elsewhere), gathered
    one trainable unit at a time: a frozen base that FSDP shards (LoRA under CPU offload) is never
    gathered. torch's get_model_state_dict(ignore_frozen_params=True) gathers the whole model
    first, and with rank0_only (cpu_offload) it fails on the other ranks, whose dicts lack the
    frozen entries it then pops (KeyError, measured on torch 2.14)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    _init_from_root(model)
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
        _init_from_root(model)
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
                    buf = torch.empty(param.shape, dtype=param.dtype, device=param.device)
                if distributed:
                    dist.broadcast(buf, src=0)
                _copy_full(param, buf)
    extra = set(state_dict) - seen if devices.rank() == 0 else set()
    if extra:
        raise KeyError(f"state dict entries that are not trainable parameters of the model: {sorted(extra)[:5]}")


def _copy_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Write ``full`` (the parameter's whole value, on every rank) into ``param``: a plain tensor, or
    under FSDP2 a DTensor, whose local shard takes its rows of ``full`` (no collective: every rank holds it)."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        param.copy_(full.view_as(param))
        return
    local = full.view(param.shape)
    for dim_mesh, placement in enumerate(param.placements):
        if isinstance(placement, Shard):  # fully_shard's torch.chunk rows on this mesh dim's coordinate
            size, index = param.device_mesh.size(dim_mesh), param.device_mesh.get_local_rank(dim_mesh)
            chunks = torch.chunk(local, size, dim=placement.dim)
            local = chunks[index] if index < len(chunks) else local.narrow(placement.dim, 0, 0)
    param.to_local().copy_(local.reshape(param.to_local().shape))


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Collective. {"state": {param name: {"step", "exp_avg", ...}}, "param_groups": [...]} keyed
    by the unwrapped model's parameter names, independent of the world size; {} on ranks != 0."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    _free_fsdp2(model)
    return _rank0_only(get_optimizer_state_dict(model, optimizer, options=_options(model, load=False)))


def load_full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Collective. Inverse of full_optimizer_state_dict (rank 0's dict is used). Consumes ``state``."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    _free_fsdp2(model)
    tuples = [{k for k, v in group.items() if isinstance(v, tuple)} for group in optimizer.param_groups]
    set_optimizer_state_dict(model, optimizer, _rank0_only(state), options=_options(model, load=True))
    # The setter hands back hyper-parameters like AdamW's betas as lists; keep the optimizer's own types.
    for group, keys in zip(optimizer.param_groups, tuples):
        for key in keys:
            if isinstance(group.get(key), list):
                group[key] = tuple(group[key])
