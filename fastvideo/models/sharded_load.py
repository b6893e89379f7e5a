"""Load the FLUX transformer for FSDP without a full copy per device.

The transformer is built on the meta device (no memory) and FSDP fills it unit by unit: for each
transformer block it wraps, FSDP calls ``UnitLoader`` on the block's modules, which allocates their
parameters on the device and reads their values from the safetensors files (plain reads: the page
cache holds one copy per node whatever the rank count); FSDP then flattens and shards the unit
and frees the unsharded copy before it moves on. Peak memory per rank during set-up is therefore the
rank's shard plus about one unit, instead of the whole fp32 model (47.6 GB for FLUX.1-dev).

    model, loader = meta_transformer(root, "transformer", torch.float32, device)
    model = wrap_model(model, "full", device, param_init_fn=loader)
    loader.check_complete()

DDP and a single process keep the plain load (each needs the full model anyway).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"
SINGLE_NAME = "diffusion_pytorch_model.safetensors"


def uses_sharded_load(strategy: str, world_size: int) -> bool:
    """Meta build + per-unit fill applies to FSDP strategies on more than one rank."""
    return world_size > 1 and strategy in ("full", "zero2", "hybrid", "hybrid_zero2")


# safetensors dtype names -> torch dtypes (the ones a diffusers checkpoint can hold).
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def read_header(path: Path) -> tuple[dict, int]:
    """(tensor name -> {"dtype", "shape", "data_offsets"}, byte offset of the data) of a .safetensors file:
    an 8-byte little-endian header length, a JSON header, then the raw tensor bytes."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


class SafetensorsSource:
    """Reads named tensors of a single or indexed (sharded) diffusers safetensors checkpoint straight
    into given tensors with plain file reads: no memory map (whose touched pages would count in every
    rank's resident memory) and, for a CPU tensor of the file's dtype, no intermediate copy."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        if (folder / INDEX_NAME).is_file():
            files = sorted({folder / f for f in json.loads((folder / INDEX_NAME).read_text())["weight_map"].values()})
        elif (folder / SINGLE_NAME).is_file():
            files = [folder / SINGLE_NAME]
        else:
            raise FileNotFoundError(
                f"{folder} has neither {SINGLE_NAME} nor {INDEX_NAME}: sharded FSDP loading reads safetensors "
                "only; convert the checkpoint (python -m fastvideo.tools.export) or use --fsdp_sharding_strategy none"
            )
        self.entries: dict[str, tuple[Path, int, dict]] = {}
        for path in files:
            header, data_start = read_header(path)
            for name, meta in header.items():
                self.entries[name] = (path, data_start, meta)

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Fill ``out`` with tensor ``name`` (converted to out's dtype, moved to out's device)."""
        if name not in self.entries:
            raise KeyError(f"the checkpoint has no tensor {name!r} that the model needs")
        path, data_start, meta = self.entries[name]
        shape = tuple(meta["shape"])
        if shape != tuple(out.shape):
            raise ValueError(f"checkpoint tensor {name} has shape {shape}, the model expects {tuple(out.shape)}: "
                             "the config.json does not match the weights")
        dtype = _DTYPES[meta["dtype"]]
        begin, end = meta["data_offsets"]
        direct = out.device.type == "cpu" and out.dtype == dtype and out.is_contiguous() and out.numel() > 0
        buffer = out if direct else torch.empty(shape, dtype=dtype)
        with open(path, "rb") as f:
            f.seek(data_start + begin)
            got = f.readinto(buffer.view(-1).view(torch.uint8).numpy()) if buffer.numel() else 0
        if got != end - begin:
            raise ValueError(f"{path} is truncated: tensor {name} has {got} of {end - begin} bytes")
        if not direct:
            out.copy_(buffer)

    def close(self) -> None:
        self.entries = {}


class UnitLoader:
    """FSDP ``param_init_fn``: give a module its own (non-recursive) parameters on ``device``, filled
    from the checkpoint. FSDP calls it for every module of a unit just before flattening that unit."""

    def __init__(self, model: nn.Module, source: SafetensorsSource, device: torch.device):
        self.source = source
        self.device = torch.device(device)
        # Module objects survive wrapping (FSDP wraps them, it does not copy them), so names taken
        # now still identify them when FSDP hands them over.
        self.prefix = {id(m): (f"{n}." if n else "") for n, m in model.named_modules()}
        # Buffers the family built for real (a RoPE table the files do not hold: Wan's) are not read;
        # they follow the model to the device (``__call__``) and survive FSDP2's to_empty.
        self.real_buffers = {n: b for n, b in model.named_buffers() if not b.is_meta}
        self.expected = {n for n, _ in model.named_parameters()} | \
            {n for n, _ in model.named_buffers() if n not in self.real_buffers}
        self.loaded: set[str] = set()

    @torch.no_grad()
    def __call__(self, module: nn.Module) -> None:
        own = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        for name, buf in list(module.named_buffers(recurse=False)):  # a real buffer: to the device
            if not buf.is_meta and buf.device != self.device:
                module._buffers[name] = buf.to(self.device)
        if not any(t.is_meta for _, t in own):
            return
        module.to_empty(device=self.device, recurse=False)
        prefix = self.prefix[id(module)]
        for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            self.source.read_into(prefix + name, tensor)
            self.loaded.add(prefix + name)

    @torch.no_grad()
    def fill_sharded(self, model: nn.Module) -> None:
        """FSDP2 (--fsdp_version 2): ``model`` already sharded on meta by fully_shard; allocate it on
        the device and fill each parameter's local shard from the files. Each tensor is read whole
        into host memory (one tensor at a time) and this rank keeps its rows: distribute_tensor with
        src_data_rank=None cuts the local piece without any communication, as every rank read the
        same bytes. Buffers (never sharded) are read whole."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        model.to_empty(device=self.device)
        for module in model.modules():
            prefix = self.prefix[id(module)]
            for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
                if prefix + name in self.real_buffers:
                    tensor.copy_(self.real_buffers[prefix + name])
                    continue
                if isinstance(tensor, DTensor):
                    whole = torch.empty(tensor.shape, dtype=tensor.dtype)
                    self.source.read_into(prefix + name, whole)
                    local = tensor.to_local()
                    piece = distribute_tensor(whole.to(local.device), tensor.device_mesh, tensor.placements,
                                              src_data_rank=None)
                    local.copy_(piece.to_local())
                else:
                    self.source.read_into(prefix + name, tensor)
                self.loaded.add(prefix + name)

    def check_complete(self) -> None:
        """Every parameter and buffer was read (none is left as garbage from to_empty)."""
        missing = sorted(self.expected - self.loaded)
        self.source.close()
        if missing:
            raise RuntimeError(f"sharded load left {len(missing)} tensors unread, e.g. {missing[:3]}")


def meta_transformer(root: str | Path, subfolder: str | None, dtype: torch.dtype,
                     device: torch.device, family) -> tuple[nn.Module, UnitLoader]:
    """``family``'s transformer from ``root/subfolder`` built on the meta device in ``dtype``, and
    the loader that fills it unit by unit on ``device`` (pass it to wrap_model as param_init_fn)."""
    folder = Path(root) / subfolder if subfolder else Path(root)
    model, folders = family.meta_model(folder, dtype)
    source = SafetensorsSource(folders[""]) if list(folders) == [""] else PrefixedSources(folders)
    return model, UnitLoader(model, source, device)


class PrefixedSources:
    """Several checkpoints as one source: the names under each prefix ("transformer_2.") read, without
    it, from that prefix's folder (a model holding several diffusers transformers)."""

    def __init__(self, folders: dict[str, Path]):
        self.sources = {prefix: SafetensorsSource(folder) for prefix, folder in folders.items()}

    def read_into(self, name: str, out: torch.Tensor) -> None:
        prefix = max((p for p in self.sources if name.startswith(p)), key=len, default=None)
        if prefix is None:
            raise KeyError(f"the checkpoints have no tensor {name!r} that the model needs")
        self.sources[prefix].read_into(name[len(prefix):], out)

    def close(self) -> None:
        for source in self.sources.values():
            source.close()
