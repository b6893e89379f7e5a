"""Where checkpoints are and whether they are whole: the folder layout's names (this layout's and
the one before it), finding the latest complete checkpoint, and checking one before anything is
read from it (no collectives)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastvideo.training.checkpoint.state_io import CheckpointError, _read_json, _read_tensors

PREFIX = "checkpoint-"
MARKER = "COMPLETE.json"
# Upstream DanceGRPO's names: FluxTransformer2DModel.from_pretrained(checkpoint-N) loads the weights,
# and FluxPipeline.load_lora_weights(checkpoint-N) the adapters of a LoRA run.
MODEL_FILE = "diffusion_pytorch_model.safetensors"
CONFIG_FILE = "config.json"
LORA_FILE = "pytorch_lora_weights.safetensors"
EMA_FILE = "ema.safetensors"
# The names of the layout before upstream's (model.safetensors + transformer_config.json): read, never written.
LEGACY_NAMES = {MODEL_FILE: "model.safetensors", CONFIG_FILE: "transformer_config.json", LORA_FILE: "lora.safetensors"}
_FINAL_RE = re.compile(r"^checkpoint-(\d+)$")
_SCRATCH_RE = re.compile(r"^checkpoint-\d+\.(tmp|old|deleting)-")


class NoCheckpointError(CheckpointError, FileNotFoundError):
    """No (complete) checkpoint where one was asked for."""


# ======================================================================== files of a checkpoint
def stored_file(path: str | os.PathLike, name: str) -> Path:
    """``path/name`` (name: one of this layout's names), else the file of the older layout that held
    the same content when only that one exists (so old checkpoints still resume)."""
    path = Path(path)
    legacy = LEGACY_NAMES.get(name)
    if legacy is not None and not (path / name).is_file() and (path / legacy).is_file():
        return path / legacy
    return path / name


def has_file(path: str | os.PathLike, name: str) -> bool:
    return stored_file(path, name).is_file()


# A LoRA checkpoint's adapters in diffusers' LoRA file format, values unchanged (exact resume):
# transformer.<module>.lora_A|B.weight plus transformer.<module>.alpha, which diffusers'
# load_lora_weights reads as peft's lora_alpha (scale alpha / rank), as upstream's trainer applies.
_IN_MODEL = re.compile(r"^(?P<module>.+)\.(?P<ab>lora_[AB])\.default\.weight$")
_IN_FILE = re.compile(r"^transformer\.(?P<module>.+)\.(?P<ab>lora_[AB])\.weight$")
_ALPHA = re.compile(r"^transformer\.(?P<module>.+)\.alpha$")


def lora_file_entries(adapters: dict, alpha: float | None) -> dict:
    """In-model adapter names (peft: <module>.lora_A.default.weight) -> the file's entries; alpha
    None writes no alpha entries (diffusers then applies scale 1)."""
    import torch

    out = {}
    for key, value in adapters.items():
        m = _IN_MODEL.match(key)
        if m is None:
            raise ValueError(f"{key!r} is not a LoRA adapter weight ('<module>.lora_A|B.default.weight')")
        out[f"transformer.{m['module']}.{m['ab']}.weight"] = value
        if alpha is not None:
            out[f"transformer.{m['module']}.alpha"] = torch.tensor(float(alpha), dtype=torch.float32)
    return out


def adapters_from_lora_file(entries: dict, where: str = "the LoRA file") -> dict:
    """Inverse of lora_file_entries (alpha entries dropped): in-model adapter names, values as stored."""
    out = {}
    for key, value in entries.items():
        if _ALPHA.match(key):
            continue
        m = _IN_FILE.match(key)
        if m is None:
            raise CheckpointError(f"{where}: {key!r} is not a FLUX transformer LoRA entry "
                                  "('transformer.<module>.lora_A|B.weight')")
        out[f"{m['module']}.{m['ab']}.default.weight"] = value
    return out


def read_weights(path: str | os.PathLike, lora: bool = False) -> dict:
    """A checkpoint's transformer weights (lora: its adapters, in-model peft names), either layout."""
    path = Path(path)
    if not lora:
        return _read_tensors(stored_file(path, MODEL_FILE))
    weights = stored_file(path, LORA_FILE)
    if weights.name == LORA_FILE:  # diffusers' LoRA format; the older lora.safetensors holds peft names
        return adapters_from_lora_file(_read_tensors(weights), str(weights))
    return _read_tensors(weights)


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


class DamagedCheckpointWarning(UserWarning):
    """'latest' skipped a checkpoint whose files do not match COMPLETE.json."""


# ======================================================================== digests
DIGEST = "sha256"  # hashlib's, OpenSSL's implementation: about 1.3 GB/s per core (docs/checkpoints.md)
_verified: dict[str, tuple] = {}  # folder -> (name, size, mtime) of its files when their digests matched


def file_digest(path: str | os.PathLike) -> str:
    """The hex sha256 of a file, read in a stream (memory stays flat whatever its size)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, DIGEST).hexdigest()


def folder_digests(folder: Path, names: list[str]) -> dict[str, str]:
    """{name: digest} of files in ``folder``, hashed in parallel threads (hashlib releases the GIL)."""
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(4, len(names))) as pool:
        return dict(zip(names, pool.map(lambda n: file_digest(folder / n), names)))


def _fingerprint(path: Path, names) -> tuple:
    try:
        stats = [(n, (path / n).stat()) for n in sorted(names)]
    except OSError as exc:  # a digest recorded for a file the marker's sizes do not list
        raise CheckpointError(f"checkpoint {str(path)!r} is damaged: {exc}") from exc
    return tuple((n, st.st_size, st.st_mtime_ns) for n, st in stats)


def _check_digests(path: Path, recorded: dict) -> None:
    """Raise CheckpointError naming the first file whose content does not match its digest. A folder
    checked before in this process, its files unchanged since, is not read again."""
    key = str(path.resolve())
    fingerprint = _fingerprint(path, recorded)
    if _verified.get(key) == fingerprint:
        return
    actual = folder_digests(path, sorted(recorded))
    for name in sorted(recorded):
        if actual[name] != recorded[name]:
            raise CheckpointError(
                f"checkpoint {str(path)!r} is damaged: {name} does not match its {DIGEST} in {MARKER} (its bytes "
                "changed after the save). Resume from an earlier checkpoint, or with 'latest', which skips "
                "damaged checkpoints")
    _verified[key] = fingerprint


def verify_checkpoint(path: str | os.PathLike, digests: bool = True) -> dict:
    """Check that ``path`` is a complete checkpoint: marker present, every file at its recorded
    size and (digests, when the marker records them: checkpoints written before digests do not)
    with its recorded sha256. Returns the marker. Raises NoCheckpointError / CheckpointError
    naming the problem and the damaged file."""
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
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, dict):  # as is_complete: a marker without its file list vouches for nothing
        raise CheckpointError(f"{str(path)!r} is not a complete checkpoint: its {MARKER} lists no files (a damaged "
                              "marker). Resume from an earlier checkpoint or from 'latest'.")
    for name, size in files.items():
        f = path / name
        if not f.is_file() or f.stat().st_size != size:
            raise CheckpointError(f"checkpoint {str(path)!r} is damaged: {name} is missing or has the wrong size")
    recorded = marker.get(DIGEST) if isinstance(marker, dict) else None
    if digests and isinstance(recorded, dict):
        _check_digests(path, recorded)
    return marker


def _latest_valid(output_dir: str | os.PathLike) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint whose files match its marker, and the problems of the newer
    ones it skipped (each also warned about with a DamagedCheckpointWarning naming the file)."""
    problems = []
    for _, path in reversed(list_checkpoints(output_dir)):
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            warnings.warn(f"skipping a damaged checkpoint: {exc}", DamagedCheckpointWarning, stacklevel=4)
            problems.append(str(exc))
            continue
        return path, problems
    return None, problems


def resolve_checkpoint(spec: str | os.PathLike, output_dir: str | os.PathLike | None = None) -> Path:
    """'latest' -> the newest complete, undamaged checkpoint in output_dir; a path -> that
    checkpoint, checked (a damaged one is refused)."""
    if str(spec) == "latest":
        if output_dir is None:
            raise ValueError("resume 'latest' needs the output directory to search")
        latest, problems = _latest_valid(output_dir)
        if latest is None and problems:
            raise CheckpointError(f"--resume_from_checkpoint latest: every checkpoint in {str(output_dir)!r} is "
                                  f"damaged; the newest: {problems[0]}")
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
    from fastvideo.models.registry import UNRECORDED_RUN_FAMILY, family_for_class_name

    folder = Path(folder)
    run = _json_or_none(folder.parent / "config.json")
    if isinstance(run, dict) and isinstance(run.get("model"), dict) and "rollout" in run:
        return run["model"].get("family", UNRECORDED_RUN_FAMILY)
    for name in (CONFIG_FILE, LEGACY_NAMES[CONFIG_FILE]):
        config = _json_or_none(folder / name)
        if isinstance(config, dict) and isinstance(config.get("_class_name"), str):
            return family_for_class_name(config["_class_name"])
    return None


def recorded_export_ema(folder: str | os.PathLike) -> bool:
    """Whether the run that wrote this checkpoint asked for its EMA weights as the export
    (--export_ema, OUTPUT_DIR/config.json's optim.export_ema); False when nothing says so."""
    run = _json_or_none(Path(folder).parent / "config.json")
    optim = run.get("optim") if isinstance(run, dict) else None
    return isinstance(optim, dict) and optim.get("export_ema") is True


# ======================================================================== older extra state
def legacy_states(extra: dict) -> dict:
    """The stateful parts of a checkpoint written before they were saved by name (919d5af and
    earlier): the trainer's counters and the sampler at the top level of extra_state."""
    states = {"trainer": {"iteration": int(extra["iteration"]),
                          "consecutive_nonfinite": int(extra.get("consecutive_nonfinite", 0))},
              "objective": {}}
    if "seed" in extra:
        states["randomness"] = {"seed": int(extra["seed"])}
    if "sampler" in extra:
        states["sampler"] = extra["sampler"]
    return states


# ======================================================================== model config
def _config_value(value):
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"transformer config value {value!r} ({type(value).__name__}) is not JSON-serialisable")


def clean_config(config: dict | None, class_name: str) -> dict | None:
    """A diffusers config as plain JSON, without the entries that describe where it was loaded from;
    class_name: the _class_name it gets when it names none (the saved model's class)."""
    if config is None:
        return None
    cfg = json.loads(json.dumps(dict(config), default=_config_value))
    for key in ("_use_default_values", "_name_or_path"):
        cfg.pop(key, None)
    cfg.setdefault("_class_name", class_name)
    if "_diffusers_version" not in cfg:  # what diffusers' from_pretrained records of the folder it reads
        import diffusers

        cfg["_diffusers_version"] = diffusers.__version__
    return cfg


# ======================================================================== before loading
def _check_safetensors(path: Path) -> None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as exc:  # safetensors raises its own error types for corrupt or foreign files
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({exc}); checkpoints are loaded without pickle"
        ) from exc


def _check_loadable(path: Path, optimizer, lr_scheduler, ema, trainable_only=False, weight_sets=()) -> None:
    """Everything rank 0 will read, checked before the first collective: marker, sizes, headers."""
    verify_checkpoint(path)
    if trainable_only and not has_file(path, LORA_FILE) and has_file(path, MODEL_FILE):
        raise CheckpointError(f"{path} is a full fine-tuning checkpoint; resume it without --use_lora (or start the "
                              "LoRA run from its exported weights with --dit_model_name_or_path)")
    if not trainable_only and has_file(path, LORA_FILE):
        raise CheckpointError(f"{path} is a LoRA checkpoint (adapters only); resume it with --use_lora")
    weights = stored_file(path, LORA_FILE if trainable_only else MODEL_FILE).name
    wanted = {weights: "model weights", "extra_state.json": "extra state", "meta.json": "metadata"}
    sharded = (path / "shards.json").is_file()  # checkpoint_shards.INDEX: optimizer and weight copies in shards
    if optimizer is not None:
        wanted["shards.json" if sharded else "optimizer.json"] = "optimizer state"
    if lr_scheduler is not None:
        wanted["scheduler.json"] = "LR scheduler state"
    if ema is not None:
        wanted.update({EMA_FILE: "EMA weights (saved without --use_ema?)", "ema.json": "EMA counters"})
    for name in weight_sets:
        wanted[f"{name}.safetensors"] = f"{name} weights (saved by another --algorithm?)"
    if sharded:  # the shard index names what it holds; verify_checkpoint checked every shard file
        wanted = {k: v for k, v in wanted.items() if k != EMA_FILE and k not in {f"{n}.safetensors" for n in weight_sets}}
        _check_shard_sets(path, ["ema"] * (ema is not None) + list(weight_sets))
    for name, what in wanted.items():
        if not (path / name).is_file():
            raise CheckpointError(f"{path} has no {what} ({name})")
    for name in sorted({*wanted, "optimizer.safetensors", "scheduler.safetensors", "extra_state.safetensors"}):
        if not (path / name).is_file():
            continue
        if name.endswith(".safetensors"):
            _check_safetensors(path / name)
        else:
            _read_json(path / name)


def _check_shard_sets(path: Path, names: list[str]) -> None:
    index = _read_json(path / "shards.json")
    missing = [n for n in names if n not in (index.get("sets") or [])]
    if missing:
        raise CheckpointError(f"{path} holds no {', '.join(missing)} weights in its shards (saved without --use_ema, "
                              "or by another --algorithm?)")
