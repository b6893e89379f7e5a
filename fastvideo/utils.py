"""Small shared helpers: optional imports, atomic writes, rank-0 logging."""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from fastvideo.errors import UserError


class MissingExtraError(UserError, ImportError):
    """An optional feature was used without its pip extra installed."""


def require(module: str, extra: str, feature: str):
    """Import an optional dependency or raise an error naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs the optional package '{module}', which is not installed. "
            f"Install it with: pip install 'flux-grpo[{extra}]'"
        ) from exc


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write-then-rename: readers (and a crash) see the old or the new content, never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def main_print(*args, **kwargs) -> None:
    """print() on global rank 0 only."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs, flush=True)


def lazy_getattr(package: str, table: dict[str, str]):
    """A package's module ``__getattr__`` (PEP 562) that imports ``name`` from ``table[name]`` on
    first use and caches it in the package, so importing the package loads none of its modules."""
    def __getattr__(name: str):
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            setattr(importlib.import_module(package), name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def flatten_dict(d: dict, sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a<sep>b": 1}; non-dict values (lists included) stay values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_dict(v, sep, key + sep))
        else:
            out[key] = v
    return out
