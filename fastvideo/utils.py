"""Small shared helpers: optional imports, atomic writes, rank-0 logging."""

from __future__ import annotations

import importlib
import json
import os
import sys
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


class LogFileError(UserError, ValueError):
    """A log file (metrics.jsonl, eval.jsonl, BEST.json) damaged before its last line."""


def read_jsonl(path: str | os.PathLike, warn: bool = True) -> list[dict]:
    """The records of a JSON-lines log; [] when the file is missing.

    A torn last line (a crash or a full disk mid-write: no newline, or not JSON) is dropped,
    saying which file and what was dropped; damage on an earlier line raises LogFileError naming
    the file and the line (it is not something a crash leaves)."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < last:
                raise LogFileError(f"{path} line {i + 1} is not JSON ({line[:60]!r}): the file is damaged "
                                   "before its last line; repair or remove that line") from None
            if warn:
                print(f"[warning] {path}: dropped its torn last line {i + 1} ({len(line)} characters: "
                      f"{line[:60]!r}...); the write was cut short (crash or full disk)", file=sys.stderr, flush=True)
    return records


def read_json_or_none(path: str | os.PathLike) -> Any:
    """A small JSON file (a marker), or None when missing or torn (saying so)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        print(f"[warning] {path} is not valid JSON (torn write?): ignored", file=sys.stderr, flush=True)
        return None


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
