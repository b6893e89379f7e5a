"""Save and resume the full training state, atomically and without pickle.

    ckpt = Checkpointer(output_dir, keep_last=3)
    ckpt.save(iteration, model=model, optimizer=opt, lr_scheduler=sched, ema=ema,
              extra={"iteration": iteration, "sampler": sampler.state_dict()},
              transformer_config=dict(unwrap_model(model).config))        # every rank calls it
    extra = ckpt.load("latest", model=model, optimizer=opt, lr_scheduler=sched, ema=ema)

Layout of ``OUTPUT_DIR/checkpoint-{iteration}/``:

    diffusion_pytorch_model.safetensors + config.json
                               full fp32 transformer weights (diffusers parameter names) and the
                               transformer's diffusers config, upstream DanceGRPO's names: the
                               folder is a transformer folder, FluxTransformer2DModel.from_pretrained
                               loads it (and export needs no base folder)
    pytorch_lora_weights.safetensors
                               instead, in a LoRA run (trainable_only): the adapters alone in
                               diffusers' LoRA format (transformer.<module>.lora_A|B.weight, values
                               as trained, plus transformer.<module>.alpha), so
                               FluxPipeline.load_lora_weights(folder) applies them at alpha / rank
                               (checkpoint_files.lora_file_entries); the EMA file then holds the
                               adapters' EMA in in-model peft names (training/lora.py)
    optimizer.json/.safetensors    full AdamW state keyed by parameter name (any world size)
    scheduler.json             LR scheduler state
    ema.safetensors, ema.json  full EMA weights (same names as the model) and its counters
    <name>.safetensors         an objective's own weight sets (Objective.weight_sets: NFT's old_policy), gathered like the EMA
    extra_state.json/.safetensors  the caller's dict (iteration, sampler, RNG states ...)
    rank_state/rank-NNNNN.*    optional per-rank dicts
    meta.json                  iteration, world size, torch version, library line (recipe|current), time
    COMPLETE.json              written last: every file with its size and its sha256

Checkpoints of the layout before (model.safetensors, lora.safetensors with peft names,
transformer_config.json; no sha256 in the marker) still resume: checkpoint_files.stored_file.

Full (unsharded) state dicts rather than torch.distributed.checkpoint shards: the model file is
directly a diffusers weight file, a checkpoint resumes on any number of ranks, and DCP's metadata
file is a pickle, which this project does not load. Tensors go to safetensors and everything else
to JSON; nothing is ever unpickled.

Atomicity: everything is written into ``checkpoint-{iteration}.tmp-XXXX`` and fsynced; the marker
is written last; the folder is then renamed into place (an atomic rename on POSIX file systems)
and the parent folder fsynced. A crash at any point leaves either the previous checkpoints only
or the new, complete one; find_latest() ignores temporary folders and folders without a marker.
Damage after the save (a flipped bit, a truncated file) is found before anything is read:
verify_checkpoint compares every file with its size and sha256, and 'latest' skips a damaged
checkpoint with a warning naming the file, resuming from the newest undamaged one.
Rank 0 writes the shared files; the output folder must be on a file system all ranks see when
per-rank state is saved.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from fastvideo import devices
from fastvideo.library_lines import installed_version, library_line
from fastvideo.distributed import fsdp
from fastvideo.errors import DiskFullError, is_disk_full
from fastvideo.training.checkpoint import shards
from fastvideo.training.checkpoint.state_io import (  # noqa: F401  (re-exported: part of this module's API)
    FORMAT_VERSION,
    CheckpointError,
    _fsync_path,
    _read_json,
    _read_tensors,
    _write_json,
    _write_tensors,
    decode_tree,
    encode_tree,
    load_tree,
    save_tree,
)
from fastvideo.training.checkpoint.files import (  # noqa: F401  (re-exported: part of this module's API)
    _SCRATCH_RE,
    CONFIG_FILE,
    DIGEST,
    EMA_FILE,
    LEGACY_NAMES,
    LORA_FILE,
    MARKER,
    MODEL_FILE,
    PREFIX,
    DamagedCheckpointWarning,
    NoCheckpointError,
    adapters_from_lora_file,
    checkpoint_dir,
    clean_config,
    file_digest,
    find_latest,
    folder_digests,
    has_file,
    is_complete,
    legacy_states,
    list_checkpoints,
    lora_file_entries,
    read_weights,
    recorded_family,
    resolve_checkpoint,
    stored_file,
    verify_checkpoint,
    _check_loadable,
)

# ======================================================================== collectives for control
def _broadcast_from_rank0(value):
    if devices.world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _describe(error: BaseException | None, path: Path | None = None) -> str | None:
    where = f" writing {path}" if path is not None else ""
    return None if error is None else f"rank {devices.rank()}{where}: {type(error).__name__}: {error}"


def _first_error(local: BaseException | None, path: Path | None = None) -> str | None:
    """Every rank learns whether any rank failed (so no rank waits forever in a collective)."""
    message = _describe(local, path)
    if devices.world_size() == 1:
        return message
    messages = [None] * devices.world_size()
    dist.all_gather_object(messages, message)
    return next((m for m in messages if m is not None), None)


class _Writer:
    """Rank-local writes into the temporary folder. The first failure is kept and later writes are
    skipped, while the caller keeps taking part in every collective (so no rank is left waiting)."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.files: list[str] = []
        self.error: Exception | None = None
        self.error_path: Path | None = None  # the file being written when it failed, when known

    def run(self, fn: Callable[[], Any], path: Path | None = None) -> None:
        if self.error is not None:
            return
        try:
            fn()
        except Exception as exc:  # re-raised once every rank knows
            self.error, self.error_path = exc, path

    def tensors(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        self.run(lambda: (_write_tensors(self.folder / name, tensors), self.files.append(name)), self.folder / name)

    def json(self, name: str, obj: Any) -> None:
        self.run(lambda: (_write_json(self.folder / name, obj), self.files.append(name)), self.folder / name)

    def tree(self, stem: str, obj: Any) -> None:
        self.run(lambda: self.files.extend(save_tree(self.folder, stem, obj)))


# ======================================================================== save
def _model_config(model: nn.Module, transformer_config: dict | None) -> dict | None:
    """transformer_config (else the model's own config) as saved, naming the model's class."""
    unwrapped = fsdp.unwrap_model(model)
    config = transformer_config if transformer_config is not None else getattr(unwrapped, "config", None)
    return clean_config(config, type(unwrapped).__name__) if config is not None else None


def _remove_scratch(output_dir: Path) -> None:
    for child in output_dir.iterdir():
        if child.is_dir() and _SCRATCH_RE.match(child.name):
            shutil.rmtree(child, ignore_errors=True)


def _discard(path: Path) -> None:
    """Rename first (atomic), then delete: a crash mid-delete never leaves a half checkpoint under
    its final name."""
    doomed = Path(tempfile.mkdtemp(prefix=f"{path.name}.deleting-", dir=path.parent))
    os.rmdir(doomed)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def prune_checkpoints(output_dir: str | os.PathLike, keep_last: int | None) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (None or <= 0 keeps all)."""
    if not keep_last or keep_last <= 0:
        return []
    doomed = [p for _, p in list_checkpoints(output_dir)[:-keep_last]]
    for path in doomed:
        _discard(path)
    return doomed


def _publish(tmp: Path, final: Path, files: list[str], iteration: int) -> None:
    sizes = {name: (tmp / name).stat().st_size for name in files}
    digests = folder_digests(tmp, sorted(files))  # read back from the page cache just written
    _write_json(tmp / MARKER, {"format_version": FORMAT_VERSION, "iteration": iteration, "files": sizes,
                               DIGEST: digests})
    for folder in {(tmp / name).parent for name in files} | {tmp}:
        _fsync_path(folder)
    if final.exists():  # a rerun reached the same iteration: the new state replaces the old
        _discard(final)
    os.replace(tmp, final)
    _fsync_path(final.parent)


def _open_temp(output_dir: Path, iteration: int) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    _remove_scratch(output_dir)  # leftovers of saves killed before they could clean up
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{iteration}.tmp-", dir=output_dir))


def _lora_alpha(extra_state: dict | None) -> float | None:
    """The run's lora_alpha (the trainer records its LoRA settings in extra_state["lora"])."""
    info = (extra_state or {}).get("lora")
    return float(info["alpha"]) if isinstance(info, dict) and "alpha" in info else None


def _write_components(w: _Writer, is_main: bool, iteration: int, model, optimizer, lr_scheduler, ema,
                      extra_state, transformer_config, trainable_only=False, weight_sets=None, sharded=False) -> None:
    """Gather one component at a time (every rank takes part), write it on rank 0 and drop it:
    rank 0 never holds the model, the optimizer state and the EMA in host memory at once.
    sharded: the model gathered one FSDP unit at a time, the rest as per-rank shards."""
    if sharded and not trainable_only and fsdp.is_fsdp(model):
        shards.write_model_by_unit(w.folder / MODEL_FILE if w.folder else None, model, w.run)
        if is_main:
            w.files.append(MODEL_FILE)
    else:
        state = fsdp.full_model_state_dict(model, trainable_only)
        if is_main and trainable_only:
            w.run(lambda: w.tensors(LORA_FILE, lora_file_entries(state, _lora_alpha(extra_state))))
        elif is_main:
            w.tensors(MODEL_FILE, state)
        del state
    if is_main:
        config = _model_config(model, transformer_config)
        if config is not None:
            w.json(CONFIG_FILE, config)
    if sharded:
        shards.save_sharded(w, is_main, model, optimizer, ema, weight_sets)
    else:
        _write_gathered_states(w, is_main, model, optimizer, ema, trainable_only, weight_sets)
    if is_main:
        if ema is not None:
            w.tree("ema", {"decay": ema.decay, "num_updates": ema.num_updates})
        if lr_scheduler is not None:
            w.tree("scheduler", lr_scheduler.state_dict())
        w.tree("extra_state", dict(extra_state or {}))
        w.json("meta.json", {"format_version": FORMAT_VERSION, "iteration": iteration,
                             "world_size": devices.world_size(), "torch": torch.__version__,
                             "library_line": library_line(), "diffusers": installed_version("diffusers"),
                             "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def _write_gathered_states(w: _Writer, is_main: bool, model, optimizer, ema, trainable_only, weight_sets) -> None:
    if optimizer is not None:
        state = fsdp.full_optimizer_state_dict(model, optimizer)
        if is_main:
            w.tree("optimizer", state)
        del state
    if ema is not None:
        state = ema.full_state_dict(model, trainable_only)
        if is_main:
            w.tensors(EMA_FILE, state)
        del state
    for name, weights in (weight_sets or {}).items():  # an objective's own weights (NFT's old policy)
        state = weights.full_state_dict(model, trainable_only)
        if is_main:
            w.tensors(f"{name}.safetensors", state)
        del state


def save_checkpoint(
    output_dir: str | os.PathLike,
    iteration: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler=None,
    ema=None,
    extra_state: dict | None = None,
    transformer_config: dict | None = None,
    rank_state: dict | None = None,
    keep_last: int | None = None,
    trainable_only: bool = False,
    weight_sets: dict | None = None,
    sharded: bool = False,
) -> Path:
    """Collective: every rank calls it. Writes OUTPUT_DIR/checkpoint-{iteration} atomically and
    returns its path; then keeps only the newest ``keep_last`` checkpoints. ``extra_state`` is saved
    once (from rank 0); ``rank_state`` once per rank. Both must be pickle-free trees (encode_tree).
    On failure nothing is published, the temporary folder is removed and every rank raises."""
    output_dir = Path(output_dir)
    is_main = devices.rank() == 0
    final = checkpoint_dir(output_dir, iteration)
    w = _Writer()
    if is_main:
        w.run(lambda: setattr(w, "folder", _open_temp(output_dir, iteration)))
    w.folder = _broadcast_from_rank0(w.folder)
    _write_components(w, is_main, iteration, model, optimizer, lr_scheduler, ema, extra_state, transformer_config,
                      trainable_only, weight_sets, sharded)
    if rank_state is not None and w.folder is not None:
        w.run(lambda: (w.folder / "rank_state").mkdir(exist_ok=True))
        w.tree(f"rank_state/rank-{devices.rank():05d}", rank_state)

    failure = _first_error(w.error, w.error_path)  # also a barrier: every rank has written its files
    if failure is None:
        if is_main:
            if rank_state is not None:
                w.files = [f for f in w.files if not f.startswith("rank_state/")]
                w.files += [f"rank_state/{p.name}" for p in sorted((w.folder / "rank_state").iterdir())]
            w.run(lambda: _publish(w.folder, final, w.files, iteration))
        failure = _broadcast_from_rank0(_describe(w.error, w.error_path) if is_main else None)
    if failure is not None:
        if is_main and w.folder is not None:
            shutil.rmtree(w.folder, ignore_errors=True)
        devices.barrier()  # every rank knows of the failure; return only once the folder is gone
        if is_disk_full(failure):  # the user's to fix: the same one line on every rank
            raise DiskFullError(f"no space left on device: saving {final} failed ({failure}); nothing was published")
        if w.error is not None:
            raise w.error
        raise CheckpointError(f"saving {final} failed ({failure}); nothing was published")
    if is_main:
        try:
            prune_checkpoints(output_dir, keep_last)
        except OSError as exc:  # the new checkpoint is safe; an old one lingering is not fatal
            warnings.warn(f"could not delete old checkpoints in {output_dir}: {exc}", stacklevel=2)
    devices.barrier()
    return final


# ======================================================================== load
@dataclass
class LoadedCheckpoint:
    path: Path
    iteration: int
    extra_state: dict = field(default_factory=dict)
    rank_state: dict | None = None
    meta: dict = field(default_factory=dict)


def _rank0_then_share(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 and hand its (small) result to every rank. If it raises a checkpoint
    problem, every rank raises (rank 0 the original error, the others its message) instead of the
    other ranks waiting forever in the next collective."""
    value, problem = None, None
    if devices.rank() == 0:
        try:
            value = fn()
        except (CheckpointError, ValueError) as exc:
            problem = exc
    value, message = _broadcast_from_rank0((value, None if problem is None else f"{type(problem).__name__}: {problem}"))
    if problem is not None:
        raise problem
    if message is not None:
        raise CheckpointError(message)
    return value


def load_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler=None,
    ema=None,
    trainable_only: bool = False,
    weight_sets: dict | None = None,
) -> LoadedCheckpoint:
    """Collective. Restore what is passed from a checkpoint folder; rank 0 reads the model,
    optimizer and EMA files and the wrapper distributes them, so it works for any world size.
    trainable_only: a LoRA checkpoint (its adapters only); the frozen base is left as built."""
    path = Path(path)
    is_main = devices.rank() == 0
    weight_sets = weight_sets or {}
    _rank0_then_share(lambda: _check_loadable(path, optimizer, lr_scheduler, ema, trainable_only, weight_sets))
    weights = read_weights(path, trainable_only) if is_main else {}
    fsdp.load_full_model_state_dict(model, weights, strict=not trainable_only)
    if _rank0_then_share(lambda: shards.is_sharded(path)):  # any world size: each rank reads its slices
        failure = _first_error(shards.load_sharded(path, model, optimizer, ema, weight_sets))
        if failure is not None:
            raise CheckpointError(f"resuming from {path} failed: {failure}")
    else:
        _load_gathered_states(path, is_main, model, optimizer, ema, trainable_only, weight_sets)
    if ema is not None:
        ema.num_updates = int(_rank0_then_share(lambda: load_tree(path, "ema")["num_updates"]))
    if lr_scheduler is not None:
        lr_scheduler.load_state_dict(_rank0_then_share(lambda: load_tree(path, "scheduler")))
    extra = _rank0_then_share(lambda: load_tree(path, "extra_state"))
    meta = _rank0_then_share(lambda: _read_json(path / "meta.json"))
    return LoadedCheckpoint(path=path, iteration=int(meta["iteration"]), extra_state=extra,
                            rank_state=_load_rank_state(path, meta), meta=meta)


def _load_gathered_states(path, is_main, model, optimizer, ema, trainable_only, weight_sets) -> None:
    if optimizer is not None:
        fsdp.load_full_optimizer_state_dict(model, optimizer, load_tree(path, "optimizer") if is_main else {})
    if ema is not None:
        ema.load_full_state_dict(model, _read_tensors(path / EMA_FILE) if is_main else {}, strict=not trainable_only)
    for name, weights in weight_sets.items():
        state = _read_tensors(path / f"{name}.safetensors") if is_main else {}
        weights.load_full_state_dict(model, state, strict=not trainable_only)


def _load_rank_state(path: Path, meta: dict) -> dict | None:
    folder = path / "rank_state"
    if not folder.is_dir():
        return None
    if int(meta.get("world_size", -1)) != devices.world_size():
        warnings.warn(
            f"{path} was saved by {meta.get('world_size')} ranks and is loaded by {devices.world_size()}: "
            "per-rank state is not restored",
            stacklevel=3,
        )
        return None
    return load_tree(folder, f"rank-{devices.rank():05d}")


def read_resume_point(spec: str | os.PathLike, output_dir: str | os.PathLike) -> tuple[str, dict]:
    """Collective and cheap (no weights read): the checkpoint ``spec`` resolves to and its extra
    state, so a resume can be checked before any model is built."""
    found = _rank0_then_share(lambda: str(resolve_checkpoint(spec, output_dir)))
    return found, _rank0_then_share(lambda: load_tree(Path(found), "extra_state"))


def recorded_line(path: str | os.PathLike) -> str | None:
    """Collective and cheap: the library line a checkpoint was written on (None before lines existed)."""
    return _rank0_then_share(lambda: _read_json(Path(path) / "meta.json").get("library_line"))


def resume_from_checkpoint(
    spec: str | os.PathLike, output_dir: str | os.PathLike, model: nn.Module, optimizer=None, lr_scheduler=None,
    ema=None, trainable_only: bool = False, weight_sets: dict | None = None,
) -> LoadedCheckpoint:
    """Collective. ``spec`` is 'latest' (newest complete checkpoint in output_dir) or a folder."""
    found = _rank0_then_share(lambda: str(resolve_checkpoint(spec, output_dir)))
    return load_checkpoint(found, model, optimizer, lr_scheduler, ema, trainable_only, weight_sets)


class Checkpointer:
    """The training loop's handle: where checkpoints go, how many are kept, and the mapping of
    stateful parts (anything with state_dict / load_state_dict returning a pickle-free tree) that
    is saved by name under extra_state["state"]."""

    def __init__(self, output_dir: str | os.PathLike, keep_last: int | None = None, trainable_only: bool = False,
                 sharded: bool = False):
        self.output_dir = Path(output_dir)
        self.keep_last = keep_last
        self.trainable_only = trainable_only  # LoRA: save and load the adapters only
        self.sharded = sharded  # --checkpoint_format sharded (checkpoint_shards.py); loading reads either

    def save(self, iteration: int, *, model, optimizer=None, lr_scheduler=None, ema=None, extra=None,
             transformer_config=None, rank_state=None, states: dict | None = None,
             weight_sets: dict | None = None) -> Path:
        extra = dict(extra or {})
        if states:
            extra.setdefault("iteration", iteration)
            extra["state"] = {name: part.state_dict() for name, part in states.items()}
        return save_checkpoint(self.output_dir, iteration, model, optimizer, lr_scheduler, ema, extra,
                               transformer_config, rank_state, self.keep_last, self.trainable_only, weight_sets,
                               self.sharded)

    def load(self, spec, *, model, optimizer=None, lr_scheduler=None, ema=None, states: dict | None = None,
             weight_sets: dict | None = None) -> dict:
        """Restore everything passed; returns the saved extra dict (with 'iteration' always set)."""
        loaded = resume_from_checkpoint(spec, self.output_dir, model, optimizer, lr_scheduler, ema,
                                        self.trainable_only, weight_sets)
        extra = dict(loaded.extra_state)
        extra.setdefault("iteration", loaded.iteration)
        saved = extra.get("state")
        if saved is None:
            saved = legacy_states(extra)
        for name, part in (states or {}).items():
            if name not in saved:
                raise CheckpointError(f"{loaded.path} holds no state for {name!r} (it has {sorted(saved)})")
            part.load_state_dict(saved[name])
        return extra

    def find_latest(self) -> Path | None:
        return find_latest(self.output_dir)
