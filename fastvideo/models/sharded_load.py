"""Load the FLUX transformer for FSDP without a full copy per device.

The transformer is built on the meta device (no memory) and FSDP fills it unit by unit: for each
transformer block it wraps, FSDP calls ``UnitLoader`` on the block's modules, which allocates their
parameters on the device and reads their values from the safetensors files (memory-mapped, so the
page cache holds one copy per node whatever the rank count); FSDP then flattens and shards the unit
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
    return world_size > 1 and strategy in ("full", "hybrid")


class SafetensorsSource:
    """Tensor name -> its file, for a single or an indexed (sharded) diffusers checkpoint."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        if (folder / INDEX_NAME).is_file():
            weight_map = json.loads((folder / INDEX_NAME).read_text())["weight_map"]
            self.files = {name: folder / f for name, f in weight_map.items()}
        elif (folder / SINGLE_NAME).is_file():
            from safetensors import safe_open

            with safe_open(folder / SINGLE_NAME, framework="pt") as f:
                self.files = {name: folder / SINGLE_NAME for name in f.keys()}
        else:
            raise FileNotFoundError(
                f"{folder} has neither {SINGLE_NAME} nor {INDEX_NAME}: sharded FSDP loading reads safetensors "
                "only; convert the checkpoint (python -m fastvideo.tools.export) or use --fsdp_sharding_strategy none"
            )
        self._open: dict[Path, object] = {}

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.files:
            raise KeyError(f"the checkpoint has no tensor {name!r} that the model needs")
        path = self.files[name]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="pt", device="cpu")
        return self._open[path].get_tensor(name)

    def close(self) -> None:
        self._open.clear()


class UnitLoader:
    """FSDP ``param_init_fn``: give a module its own (non-recursive) parameters on ``device``, filled
    from the checkpoint. FSDP calls it for every module of a unit just before flattening that unit."""

    def __init__(self, model: nn.Module, source: SafetensorsSource, device: torch.device):
        self.source = source
        self.device = torch.device(device)
        # Module objects survive wrapping (FSDP wraps them, it does not copy them), so names taken
        # now still identify them when FSDP hands them over.
        self.prefix = {id(m): (f"{n}." if n else "") for n, m in model.named_modules()}
        self.expected = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        self.loaded: set[str] = set()

    @torch.no_grad()
    def __call__(self, module: nn.Module) -> None:
        own = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        if not any(t.is_meta for _, t in own):
            return
        module.to_empty(device=self.device, recurse=False)
        prefix = self.prefix[id(module)]
        for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            full = prefix + name
            value = self.source.get(full)
            if value.shape != tensor.shape:
                raise ValueError(f"checkpoint tensor {full} has shape {tuple(value.shape)}, the model expects "
                                 f"{tuple(tensor.shape)}: the config.json does not match the weights")
            tensor.copy_(value)
            self.loaded.add(full)

    def check_complete(self) -> None:
        """Every parameter and buffer was read (none is left as garbage from to_empty)."""
        missing = sorted(self.expected - self.loaded)
        self.source.close()
        if missing:
            raise RuntimeError(f"sharded load left {len(missing)} tensors unread, e.g. {missing[:3]}")


def meta_transformer(root: str | Path, subfolder: str | None, dtype: torch.dtype,
                     device: torch.device) -> tuple[nn.Module, UnitLoader]:
    """FluxTransformer2DModel from ``root/subfolder`` built on the meta device in ``dtype``, and the
    loader that fills it unit by unit on ``device`` (pass it to wrap_model as param_init_fn)."""
    from diffusers import FluxTransformer2DModel

    folder = Path(root) / subfolder if subfolder else Path(root)
    config = FluxTransformer2DModel.load_config(folder)
    with torch.device("meta"):
        model = FluxTransformer2DModel.from_config(config)
    model.to(dtype)
    return model, UnitLoader(model, SafetensorsSource(folder), device)
