"""Where checkpoints are and whether they are whole: the folder layout's names, finding the
latest complete checkpoint, and checking one before anything is read from it (no collectives)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from fastvideo.training.state_io import CheckpointError, _read_json

PREFIX = "checkpoint-"
MARKER = "COMPLETE.json"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "transformer_config.json"
EMA_FILE = "ema.safetensors"
LORA_FILE = "lora.safetensors"
_FINAL_RE = re.compile(r"^checkpoint-(\d+)$")
_SCRATCH_RE = re.compile(r"^checkpoint-\d+\.(tmp|old|deleting)-")


class NoCheckpointError(CheckpointError, FileNotFoundError):
    """No (complete) checkpoint where one was asked for."""


# ======================================================================== finding checkpoints
def checkpoint_dir(output_dir: str | os.PathLike, iteration: int) -> Path:
    return Path(output_dir) / f"{PREFIX}{iteration}"


def is_complete(path: str | os.PathLike) -> bool:
    path = Path(path)
    if not path.is_dir() or not (path / MARKER).is_file():
        return False
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(marker, dict) and "files" in marker


def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``output_dir`` as (iteration, path), oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _FINAL_RE.match(child.name)
        if m and is_complete(child):
            found.append((int(m.group(1)), child))
    return sorted(found)


def find_latest(output_dir: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest iteration, or None. Temporary folders of
    interrupted saves and folders without the completion marker are ignored."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def verify_checkpoint(path: str | os.PathLike) -> dict:
    """Check that ``path`` is a complete checkpoint (marker present, every file at its recorded
    size). Returns the marker. Raises NoCheckpointError / CheckpointError naming the problem."""
    path = Path(path)
    if not path.exists():
        raise NoCheckpointError(f"checkpoint {str(path)!r} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{str(path)!r} is a file, not a checkpoint folder ({PREFIX}N)")
    if not (path / MARKER).is_file():
        hint = ""
        if list_checkpoints(path):
            hint = " It holds checkpoint folders: pass one of them, or 'latest' with this folder as output_dir."
        elif _SCRATCH_RE.match(path.name):
            hint = " It is the temporary folder of a save that did not finish."
        raise CheckpointError(
            f"{str(path)!r} is not a complete checkpoint: {MARKER} is missing (the save was interrupted, or this "
            f"is not a checkpoint folder).{hint} Resume from an earlier checkpoint or from 'latest'."
        )
    marker = _read_json(path / MARKER)
    files = marker.get("files", {}) if isinstance(marker, dict) else {}
    for name, size in files.items():
        f = path / name
        if not f.is_file() or f.stat().st_size != size:
            raise CheckpointError(f"checkpoint {str(path)!r} is damaged: {name} is missing or has the wrong size")
    return marker


def resolve_checkpoint(spec: str | os.PathLike, output_dir: str | os.PathLike | None = None) -> Path:
    """'latest' -> the newest complete checkpoint in output_dir; a path -> that checkpoint, checked."""
    if str(spec) == "latest":
        if output_dir is None:
            raise ValueError("resume 'latest' needs the output directory to search")
        latest = find_latest(output_dir)
        if latest is None:
            raise NoCheckpointError(
                f"--resume_from_checkpoint latest: no complete {PREFIX}N folder in {str(output_dir)!r}. Start "
                "without --resume_from_checkpoint, or pass a checkpoint folder"
            )
        return latest
    path = Path(spec)
    verify_checkpoint(path)
    return path


# ======================================================================== which model family
def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def recorded_family(folder: str | os.PathLike) -> str | None:
    """The model family a checkpoint (or an exported transformer folder) was trained as: the run's
    OUTPUT_DIR/config.json beside it names it (model.family; runs from before the key: the default
    family), else the transformer config's _class_name does (through the registry); None when
    neither says."""
    from fastvideo.models.base import DEFAULT_FAMILY, family_for_class_name

    folder = Path(folder)
    run = _json_or_none(folder.parent / "config.json")
    if isinstance(run, dict) and isinstance(run.get("model"), dict) and "rollout" in run:
        return run["model"].get("family", DEFAULT_FAMILY)
    for name in (CONFIG_FILE, "config.json"):
        config = _json_or_none(folder / name)
        if isinstance(config, dict) and isinstance(config.get("_class_name"), str):
            return family_for_class_name(config["_class_name"])
    return None
