"""Pickle-free state files: nested Python state as JSON plus one safetensors file of its tensors.

Used by checkpoint.py. Nothing here ever unpickles (foreign .pt/.bin weight files go through
fastvideo.rewards.base.load_weights_only, torch.load with weights_only=True).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastvideo.errors import CheckpointError  # noqa: F401  (re-exported: one class for every checkpoint)

FORMAT_VERSION = 1


# ======================================================================== pickle-free trees
_TAGS = ("__tensor__", "__tuple__", "__dict__", "__ndarray__", "__bytes__", "__dtype__")


def encode_tree(obj: Any, tensors: dict[str, torch.Tensor], where: str = "state") -> Any:
    """JSON-able form of ``obj``; tensors move to ``tensors`` and are referenced by key.

    Supports dict (any JSON-scalar keys), list, tuple, str, int, float, bool, None, torch tensors,
    torch dtypes, numpy arrays and scalars, bytes. Anything else is refused with its location:
    a checkpoint must never need pickle to be read back.
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach()
        return {"__tensor__": key}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_tree(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_tree(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode_tree(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        pairs = []
        for k, v in obj.items():
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise TypeError(f"{where}: dict key {k!r} of type {type(k).__name__} cannot be stored")
            pairs.append([k, encode_tree(v, tensors, f"{where}[{k!r}]")])
        return {"__dict__": pairs}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"{where}: numpy arrays of Python objects cannot be stored")
        data = base64.b64encode(np.ascontiguousarray(obj).tobytes()).decode("ascii")
        return {"__ndarray__": data, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return encode_tree(obj.item(), tensors, where)
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(obj)).decode("ascii")}
    raise TypeError(
        f"{where}: a {type(obj).__module__}.{type(obj).__name__} cannot be stored in a checkpoint without "
        "pickle; convert it to tensors, numbers, strings, lists and dicts (e.g. its state_dict())"
    )


def decode_tree(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of encode_tree."""
    if isinstance(obj, list):
        return [decode_tree(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    tag = next((t for t in _TAGS if t in obj), None)
    if tag == "__tensor__":
        try:
            return tensors[obj["__tensor__"]]
        except KeyError as exc:
            raise CheckpointError(f"tensor {obj['__tensor__']!r} is missing from the checkpoint") from exc
    if tag == "__tuple__":
        return tuple(decode_tree(v, tensors) for v in obj["__tuple__"])
    if tag == "__dict__":
        return {k: decode_tree(v, tensors) for k, v in obj["__dict__"]}
    if tag == "__dtype__":
        return getattr(torch, obj["__dtype__"])
    if tag == "__ndarray__":
        raw = base64.b64decode(obj["__ndarray__"])
        return np.frombuffer(raw, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
    if tag == "__bytes__":
        return base64.b64decode(obj["__bytes__"])
    return {k: decode_tree(v, tensors) for k, v in obj.items()}


# ======================================================================== files
def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _owned_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors with no two sharing storage (safetensors refuses shared memory)."""
    out, seen = {}, set()
    for key, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if t.numel() and ptr in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[key] = t
    return out


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(_owned_tensors(tensors), str(path), metadata={"format": "pt"})
    _fsync_path(path)


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt or foreign files
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({exc}); checkpoints are loaded without pickle"
        ) from exc


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not a JSON file ({exc}); checkpoints are loaded without pickle") from exc


def save_tree(folder: Path, stem: str, obj: Any) -> list[str]:
    """Write ``obj`` as stem.json (+ stem.safetensors when it holds tensors). Returns file names."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = encode_tree(obj, tensors, stem)
    names = []
    if tensors:
        _write_tensors(folder / f"{stem}.safetensors", tensors)
        names.append(f"{stem}.safetensors")
    _write_json(folder / f"{stem}.json", {"format_version": FORMAT_VERSION, "tree": encoded})
    names.append(f"{stem}.json")
    return names


def load_tree(folder: Path, stem: str) -> Any:
    doc = _read_json(folder / f"{stem}.json")
    if not isinstance(doc, dict) or "tree" not in doc:
        raise CheckpointError(f"{folder / (stem + '.json')} is not a checkpoint state file")
    tensor_file = folder / f"{stem}.safetensors"
    tensors = _read_tensors(tensor_file) if tensor_file.exists() else {}
    return decode_tree(doc["tree"], tensors)
