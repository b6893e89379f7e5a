"""Optimizer state, EMA and an objective's weight copies written by every rank as its own shard,
read back on any world size (--checkpoint_format sharded).

    shards/rank-NNNNN.safetensors   this rank's slice of every trainable tensor's state:
                                    optimizer.<i>.<key> (exp_avg, exp_avg_sq ...), ema.<i>,
                                    <weight set>.<i> (NFT's old_policy.<i>)
    shards.json                     the index (rank 0): per trainable tensor <i> the parameters it
                                    concatenates (diffusers names and shapes), per rank the element
                                    range [start, stop) of each tensor its file holds, the optimizer's
                                    scalars (AdamW's step) and hyper-parameters

A trainable tensor is what the optimizer and the EMA see (fsdp.trainable_parameters): an FSDP1
flat parameter (its unit's parameters flattened and concatenated, without padding, in a fixed
order: use_orig_params=False adds no alignment) of which a rank holds one contiguous slice, or a
whole parameter (DDP, one process). Any target layout is again slices of the same concatenations,
so loading is reading, for each local tensor, the element ranges of the named parameters it
covers from whichever rank files hold them: no gather, no rank holding more than its own shard,
and a checkpoint of 2 FSDP ranks resumes on 1 process (plain parameters) or on 4.
Replicas write once: ranks holding the same element ranges (hybrid sharding's other nodes,
NO_SHARD, DDP) leave the file to the lowest of them, so there is one file per shard position.
Tensors go to safetensors and everything else to JSON: nothing is unpickled.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from fastvideo import devices
from fastvideo.distributed import fsdp
from fastvideo.training.checkpoint.state_io import CheckpointError, _read_json, _write_json, _write_tensors

INDEX = "shards.json"
SHARD_DIR = "shards"
SHARD_FORMAT = 1


def shard_file(rank: int) -> str:
    return f"{SHARD_DIR}/rank-{rank:05d}.safetensors"


@dataclass(frozen=True)
class FlatTensor:
    """One trainable tensor of this rank: the parameters it concatenates and its element range."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    start: int  # first element of the unpadded concatenation this rank holds
    stop: int

    @property
    def numels(self) -> list[int]:
        return [math.prod(s) for s in self.shapes]


def _flat_handles(model: nn.Module) -> dict[int, tuple[str, object]]:
    """id(flat parameter) -> (its unit's name in the unwrapped model, its FlatParamHandle)."""
    if not fsdp.is_fsdp(model):
        return {}
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    out = {}
    for name, module in model.named_modules():
        handle = getattr(module, "_handle", None) if isinstance(module, FSDP) else None
        if handle is not None:
            out[id(handle.flat_param)] = (fsdp._clean_name(name), handle)
    return out


def flat_layout(model: nn.Module) -> list[FlatTensor]:
    """The trainable tensors of this rank, in fsdp.trainable_parameters' order (the optimizer's
    and the EMA's), as FlatTensors."""
    handles = _flat_handles(model)
    names = {id(p): n for n, p in fsdp.unwrap_model(model).named_parameters()}
    out = []
    for p in fsdp.trainable_parameters(model):
        if id(p) not in handles:
            out.append(FlatTensor((names[id(p)],), (tuple(p.shape),), 0, p.numel()))
            continue
        prefix, handle = handles[id(p)]
        full = [f"{prefix}.{fqn}" if prefix else fqn for fqn in p._fqns]
        shapes = tuple(tuple(s) for s in p._shapes)
        out.append(FlatTensor(tuple(fsdp._clean_name(n) for n in full), shapes, *_held_range(handle, p, shapes)))
    return out


def _held_range(handle, p: torch.Tensor, shapes) -> tuple[int, int]:
    """[start, stop) of the unpadded concatenation that flat parameter ``p`` holds on this rank.
    handle.rank is the rank in the SHARD group (HYBRID_SHARD: within the node; replicas across
    nodes hold the same range). NO_SHARD (hybrid with one rank per node) holds it all: its handle
    still has a rank, which must not offset the range."""
    total = sum(math.prod(s) for s in shapes)
    if not handle.uses_sharded_strategy:
        return 0, total
    start = min(handle.rank * p.numel(), total)
    return start, start + p.numel() - p._shard_numel_padded


# ======================================================================== save
def _valid(t: torch.Tensor, ft: FlatTensor) -> torch.Tensor:
    return t.detach().reshape(-1)[: ft.stop - ft.start]


def _optimizer_entries(optimizer, params, layout) -> tuple[dict, list[dict]]:
    """(this rank's tensors, per trainable tensor its scalar state, e.g. {"step": 3.0})."""
    tensors, scalars = {}, []
    for i, (p, ft) in enumerate(zip(params, layout)):
        state, plain = optimizer.state.get(p, {}), {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.numel() == p.numel() and value.dim() > 0:
                tensors[f"optimizer.{i}.{key}"] = _valid(value, ft)
            else:
                plain[key] = float(value)
        scalars.append(plain)
    return tensors, scalars


def _param_groups(optimizer) -> list[dict]:
    return [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups]


def layout_piece(model: nn.Module) -> dict:
    """What every rank tells the others before writing: its element ranges and the tensors' names."""
    layout = flat_layout(model)
    return {"rank": devices.rank(), "file": shard_file(devices.rank()),
            "ranges": [[ft.start, ft.stop] for ft in layout],
            "tensors": [{"names": list(ft.names), "shapes": [list(s) for s in ft.shapes]} for ft in layout]}


def writers(pieces: list[dict]) -> list[dict]:
    """The ranks that write a shard file: each distinct set of element ranges once, by its lowest
    rank. Replicas (hybrid sharding's other nodes, NO_SHARD, DDP) hold the same ranges of the same
    state, so they write nothing: one file per shard position, not per rank."""
    seen, out = set(), []
    for piece in pieces:
        key = repr(piece["ranges"])
        if key not in seen:
            seen.add(key)
            out.append(piece)
    return out


def write_shards(folder: Path, model: nn.Module, optimizer=None, ema=None, weight_sets=None) -> list:
    """This rank's shard file (a writer rank, in parallel with the others); returns the optimizer's
    scalars per trainable tensor (None without an optimizer)."""
    params, layout = fsdp.trainable_parameters(model), flat_layout(model)
    tensors, scalars = _optimizer_entries(optimizer, params, layout) if optimizer is not None else ({}, None)
    for name, copy in copies(ema, weight_sets).items():
        for i, (shadow, ft) in enumerate(zip(copy.shadow, layout)):
            tensors[f"{name}.{i}"] = _valid(shadow, ft)
    (folder / SHARD_DIR).mkdir(exist_ok=True)
    _write_tensors(folder / shard_file(devices.rank()), tensors)
    return scalars


def copies(ema, weight_sets) -> dict:
    """The weight copies a checkpoint holds by name: "ema" and an objective's weight sets."""
    return ({"ema": ema} if ema is not None else {}) | dict(weight_sets or {})


def check_layouts(pieces: list[dict]) -> None:
    first = pieces[0]
    for piece in pieces[1:]:
        if piece["tensors"] != first["tensors"]:
            raise CheckpointError("ranks disagree on the trainable tensors' layout; cannot write a sharded checkpoint")


def write_index(folder: Path, pieces: list[dict], scalars, optimizer=None, sets: tuple[str, ...] = ()) -> None:
    """Rank 0: shards.json from every rank's layout_piece (ranks in order; only writers' files are
    listed) and rank 0's optimizer scalars (AdamW's step: the same on every rank)."""
    _write_json(folder / INDEX, {
        "format": SHARD_FORMAT, "world_size": len(pieces), "tensors": pieces[0]["tensors"], "sets": list(sets),
        "shards": [{"rank": p["rank"], "file": p["file"], "ranges": p["ranges"]} for p in writers(pieces)],
        "optimizer": None if optimizer is None else {"scalars": scalars, "param_groups": _param_groups(optimizer)},
    })


def gather_pieces(piece: dict) -> list[dict]:
    """Collective: every rank's write_shards result, on every rank (small: ranges and names)."""
    if devices.world_size() == 1:
        return [piece]
    out = [None] * devices.world_size()
    dist.all_gather_object(out, piece)
    return out


# ======================================================================== load
class ShardReader:
    """Element ranges of the saved concatenations, read from whichever rank files hold them."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.index = _read_json(self.path / INDEX)
        if not isinstance(self.index, dict) or self.index.get("format") != SHARD_FORMAT:
            raise CheckpointError(f"{self.path / INDEX} is not a shard index of format {SHARD_FORMAT}")
        self.where: dict[str, tuple[int, int, int]] = {}  # name -> (tensor, offset, numel)
        for i, t in enumerate(self.index["tensors"]):
            offset = 0
            for name, shape in zip(t["names"], t["shapes"]):
                self.where[name] = (i, offset, math.prod(shape))
                offset += math.prod(shape)
        self._open: dict[str, object] = {}

    def _file(self, name: str):
        from safetensors import safe_open

        if name not in self._open:
            self._open[name] = safe_open(str(self.path / name), framework="pt")
        return self._open[name]

    def read(self, key: str, i: int, a: int, b: int) -> torch.Tensor:
        """Elements [a, b) of saved tensor i's ``key`` state ("optimizer.<i>.exp_avg" style keys)."""
        parts, at = [], a
        for shard in self.index["shards"]:
            s, e = shard["ranges"][i]
            lo, hi = max(at, s), min(b, e)
            if lo >= hi or lo != at:
                continue
            parts.append(self._file(shard["file"]).get_slice(key.format(i=i))[lo - s:hi - s])
            at = hi
        if at != b:
            raise CheckpointError(f"{self.path}: no shard holds elements [{at}, {b}) of {key.format(i=i)}")
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def local(self, key: str, ft: FlatTensor, like: torch.Tensor) -> torch.Tensor:
        """This rank's tensor of state ``key`` for layout ``ft``, shaped and typed like ``like``
        (zero where FSDP pads the last shard)."""
        out = torch.zeros(like.numel(), dtype=like.dtype)
        at, lo = 0, ft.start
        for name, n in zip(ft.names, ft.numels):
            a, b = max(lo, at), min(ft.stop, at + n)
            if a < b:
                if name not in self.where:
                    raise CheckpointError(f"{self.path} holds no state for parameter {name}")
                i, offset, _ = self.where[name]
                out[a - lo:b - lo] = self.read(key, i, offset + a - at, offset + b - at).to(like.dtype)
            at += n
        return out.view_as(like).to(like.device)

    def close(self) -> None:
        self._open.clear()


def _step_device(group: dict, param: torch.Tensor):
    # as torch.optim.Optimizer.load_state_dict places it: on the parameter's device for the fused
    # and capturable kernels, on the host otherwise
    return param.device if group.get("fused") or group.get("capturable") else torch.device("cpu")


def load_optimizer(reader: ShardReader, model: nn.Module, optimizer) -> None:
    saved = reader.index.get("optimizer")
    if saved is None:
        raise CheckpointError(f"{reader.path} has no optimizer state in its shards")
    params, layout = fsdp.trainable_parameters(model), flat_layout(model)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    keys = _saved_keys(reader, "optimizer")
    for p, ft in zip(params, layout):
        i = reader.where[ft.names[0]][0]
        scalars, state = saved["scalars"][i], {}
        for key in keys.get(i, ()):
            state[key] = reader.local(f"optimizer.{{i}}.{key}", ft, p.detach())  # AdamW keeps p's dtype
        for key, value in scalars.items():
            state[key] = torch.tensor(value, dtype=torch.float32, device=_step_device(group_of[id(p)], p))
        if state:
            optimizer.state[p] = state
    for group, hyper in zip(optimizer.param_groups, saved["param_groups"]):
        group.update({k: (tuple(v) if isinstance(group.get(k), tuple) else v) for k, v in hyper.items()})


def _saved_keys(reader: ShardReader, prefix: str) -> dict[int, list[str]]:
    """Saved tensor index -> its state keys, from rank 0's file header."""
    out: dict[int, list[str]] = {}
    for key in reader._file(reader.index["shards"][0]["file"]).keys():
        parts = key.split(".")
        if parts[0] == prefix and len(parts) == 3:
            out.setdefault(int(parts[1]), []).append(parts[2])
    return out


def load_copy(reader: ShardReader, model: nn.Module, copy, name: str) -> None:
    """An EMA / weight copy's shadows (name: "ema" or the weight set's name)."""
    if name not in reader.index["sets"]:
        raise CheckpointError(f"{reader.path} holds no {name} weights in its shards (saved without it?)")
    with torch.no_grad():
        for shadow, ft in zip(copy.shadow, flat_layout(model)):
            shadow.copy_(reader.local(f"{name}.{{i}}", ft, shadow))


def read_full(path: Path, name: str) -> dict[str, torch.Tensor]:
    """A weight set ("ema", "old_policy") as a full state dict by parameter name, from the shards
    (export, evaluation); trainable parameters only."""
    reader = ShardReader(path)
    if name not in reader.index["sets"]:
        raise CheckpointError(f"{path} holds no {name} weights in its shards")
    out = {}
    for i, t in enumerate(reader.index["tensors"]):
        total = sum(math.prod(s) for s in t["shapes"])
        flat = reader.read(f"{name}.{{i}}", i, 0, total)
        for pname, shape, (_, offset, n) in zip(t["names"], t["shapes"], (reader.where[x] for x in t["names"])):
            out[pname] = flat[offset:offset + n].reshape(shape).clone()
    reader.close()
    return out


# ======================================================================== the model file, unit by unit
_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}


def _unit_entries(model: nn.Module) -> tuple[list, list]:
    """([(FSDP unit, [(name, shape, dtype, name in the unit)])], [(name, tensor)]) in file order: each unit's
    parameters in its flat parameter's order, then what every rank holds whole (persistent
    buffers, parameters outside FSDP)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = []
    for name, module in model.named_modules():
        handle = getattr(module, "_handle", None) if isinstance(module, FSDP) else None
        if handle is not None:
            flat, prefix = handle.flat_param, fsdp._clean_name(name)
            units.append((module, [(fsdp._clean_name(f"{prefix}.{fqn}" if prefix else fqn), tuple(shape), flat.dtype,
                                    fqn) for fqn, shape in zip(flat._fqns, flat._shapes)]))
    inner, whole = fsdp.unwrap_model(model), []
    for name, p in inner.named_parameters():
        if not hasattr(p, "_fqns"):  # not a flat parameter: an ignored (replicated) one
            whole.append((fsdp._clean_name(name), p))
    for mod_name, mod in inner.named_modules():
        for b, buf in mod._buffers.items():
            if buf is not None and b not in mod._non_persistent_buffers_set:
                whole.append((fsdp._clean_name(f"{mod_name}.{b}" if mod_name else b), buf))
    return units, whole


def _header(entries: list[tuple[str, tuple, torch.dtype]]) -> bytes:
    """A safetensors header (little-endian u64 length + JSON, padded to 8 bytes) for tensors laid
    out back to back in ``entries`` order."""
    import json
    import struct

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, dtype in entries:
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob


def _raw(t: torch.Tensor):
    """The tensor's bytes (a copy: numpy() on FSDP's gathered storage would pin it, and FSDP must
    free it after the unit)."""
    return t.detach().to("cpu").reshape(-1).view(torch.uint8).clone().numpy()


def write_model_by_unit(path: Path, model: nn.Module, run) -> None:
    """Collective (FSDP1 models). The full model as one safetensors file (diffusers names, the
    gathered format's content), gathered one FSDP unit at a time: rank 0 holds one unit's full
    parameters beyond its own shard, never the whole model. ``run(fn)`` runs rank 0's file work
    (the checkpoint writer: keeps the first failure, while every rank still takes part in each
    unit's gather)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._runtime_utils import _lazy_init

    units, whole = _unit_entries(model)
    main = devices.rank() == 0
    _lazy_init(model, model)  # as a forward would, before summoning a nested unit (fsdp.load_trainable_state_dict)
    entries = [e[:3] for _, unit_entries in units for e in unit_entries] + [(n, tuple(t.shape), t.dtype)
                                                                            for n, t in whole]
    box = {}
    if main:
        run(lambda: box.update(f=open(path, "wb")))
        run(lambda: box["f"].write(_header(entries)))
    offload = fsdp._offload_to_cpu(model)
    for module, unit_entries in units:
        with FSDP.summon_full_params(module, recurse=False, writeback=False, rank0_only=True, offload_to_cpu=offload):
            if main:  # the unit's parameters are views of its gathered flat parameter here
                for *_, fqn in unit_entries:
                    run(lambda fqn=fqn: box["f"].write(_raw(functools.reduce(getattr, fqn.split("."), module.module))))
    if main:
        for _, t in whole:
            run(lambda t=t: box["f"].write(_raw(t)))
        if "f" in box:
            run(lambda: (box["f"].flush(), os.fsync(box["f"].fileno())))
            box["f"].close()


# ======================================================================== the checkpointer's entry points
def save_sharded(w, is_main: bool, model: nn.Module, optimizer, ema, weight_sets) -> None:
    """Collective. Every rank writes its shard file at once; rank 0 the index and the file list
    (``w``: the checkpoint writer, whose first failure every rank learns before publishing)."""
    box: dict = {}
    w.run(lambda: box.update(piece=layout_piece(model)))
    pieces = gather_pieces(box.get("piece"))  # before writing: replicas then know they write nothing
    if not all(pieces):
        return  # a rank failed: w holds the error (or another rank's writer does); nothing to write
    w.run(lambda: check_layouts(pieces))
    if any(p["rank"] == devices.rank() for p in writers(pieces)):
        w.run(lambda: box.update(scalars=write_shards(w.folder, model, optimizer, ema, weight_sets)))
    if is_main and "scalars" in box:  # rank 0 is always a writer (the lowest rank of its ranges)
        w.run(lambda: write_index(w.folder, pieces, box["scalars"], optimizer, tuple(copies(ema, weight_sets))))
        w.files += [INDEX] + [p["file"] for p in writers(pieces)]


def load_sharded(path: Path, model: nn.Module, optimizer, ema, weight_sets) -> BaseException | None:
    """Every rank reads its own slices (no collective); returns the error instead of raising, so
    the caller can make every rank learn of any rank's failure first."""
    try:
        reader = ShardReader(path)
        try:
            if optimizer is not None:
                load_optimizer(reader, model, optimizer)
            for name, copy in copies(ema, weight_sets).items():
                load_copy(reader, model, copy, name)
        finally:
            reader.close()
    except (CheckpointError, OSError, KeyError, ValueError, RuntimeError) as exc:
        return exc
    return None


def is_sharded(path: Path) -> bool:
    return (Path(path) / INDEX).is_file()
