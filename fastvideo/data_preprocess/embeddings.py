"""Encode a prompts file with a model family's text encoders into DanceGRPO's RL embedding layout.

Output for FLUX (the layout DanceGRPO's training reads, file names relative to each folder; the
folders and json keys are the family's ``storage``)::

    OUT/prompt_embed/{idx}.pt           T5 sequence embedding [L, D_t5]   (L = max_sequence_length)
    OUT/pooled_prompt_embeds/{idx}.pt   CLIP pooled embedding [D_clip]
    OUT/text_ids/{idx}.pt               zeros [3]: one row, as upstream writes it (the reader also
                                        takes the [L, 3] files of this project's older folders)
    OUT/videos2caption.json             [{"prompt_embed_path": "{idx}.pt", "text_ids": "{idx}.pt",
                                          "pooled_prompt_embeds_path": "{idx}.pt", "caption": ...}]
    OUT/preprocess_meta.json            what the files were made from (model, length, dtype, captions)

``idx`` is the prompt's index in the cleaned prompt list. Work is split into a fixed grid of
batches (batch k holds prompts k*B .. k*B+B-1) dealt round-robin to ranks, so every prompt is
encoded inside the same batch whatever the number of ranks and whether the run was resumed: the
files are the same bit for bit. A rerun skips prompts whose files are all present, loadable and
of the expected shape and dtype; files made from other settings or another caption, or of unknown
origin (no preprocess_meta.json, as upstream's folders), are refused unless ``--overwrite`` lets
them be removed first (see ``prepare_output``), so a resumed directory never mixes two runs and
nothing is deleted unasked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo import devices
from fastvideo.data.prompts import PromptList, load_prompts
from fastvideo.data_preprocess.sources import add_sources, record_images, record_keys
from fastvideo.errors import ConfigError
from fastvideo.models.base import ModelFamily
from fastvideo.models.registry import DEFAULT_FAMILY, family_of_folder, get_model_family
from fastvideo.utils import atomic_write_json

JSON_NAME = "videos2caption.json"
META_NAME = "preprocess_meta.json"
META_FORMAT = 1


def subdirs(family: ModelFamily) -> tuple[str, ...]:
    """The folders of one prompt's stored tensors, in the family's storage order."""
    return tuple(s.folder for s in family.storage)


@dataclass(frozen=True)
class PreprocessConfig:
    model_path: str
    prompt_file: str
    output_dir: str
    max_sequence_length: int = 512
    max_prompts: int = 50000
    batch_size: int = 8
    dataloader_num_workers: int = 1
    model_family: str = DEFAULT_FAMILY
    overwrite: bool = False  # delete files made from other settings or captions (else refuse)
    # (height, width) whose area an editing family resizes each source to before its VAE (its vae_area);
    # None: the family's default (Qwen-Image-Edit: the pipeline's 1024 x 1024)
    source_vae_size: tuple[int, int] | None = None
    # A video family that encodes a first frame per prompt (wan_i2v): the clips' frames its condition is
    # made for (the training's --num_frames); None: the family's default
    num_frames: int | None = None

    def family(self) -> ModelFamily:
        """The family, with --source_vae_size's area as its vae_area and --num_frames when given."""
        from fastvideo.data_preprocess.sources import source_vae_family, with_frames

        return with_frames(source_vae_family(self.model_family, self.source_vae_size), self.num_frames)

    def validate(self) -> None:
        """Bad flags fail here, as one ConfigError line, before torch.distributed or the encoders start."""
        self.family()  # --source_vae_size checked
        limit = get_model_family(self.model_family).max_sequence_length_limit
        try:  # a given family is checked against a folder that names one (a plugin's folder may name none)
            folder = family_of_folder(self.model_path) if ":" not in self.model_family else None
        except ConfigError:
            folder = None
        # a family that runs on another's checkpoint (FLUX.2 [klein] editing on klein's) says so: runs_on
        if folder is not None and folder not in (self.model_family, self.family().runs_on):
            raise ConfigError(f"--model_family {self.model_family}: --model_path {self.model_path} holds a {folder} "
                              f"model (its model_index.json); pass --model_family {folder}, or leave the flag out")
        if not 1 <= self.max_sequence_length <= limit:
            raise ConfigError(
                f"--max_sequence_length must be in 1..{limit} (the {self.model_family} text encoder's limit), "
                f"got {self.max_sequence_length}"
            )
        for flag, low in (("max_prompts", 1), ("batch_size", 1), ("dataloader_num_workers", 0)):
            if getattr(self, flag) < low:
                raise ConfigError(f"--{flag} must be at least {low}, got {getattr(self, flag)}")
        from fastvideo.data_preprocess.sources import check_prompt_sources

        check_prompt_sources(self.prompt_file, self.max_prompts, self.family())
        out = Path(self.output_dir)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--output_dir {self.output_dir} is a file, not a folder: choose a folder for the "
                              "embeddings")


@dataclass(frozen=True)
class EmbeddingSpec:
    """What one prompt's files must look like: ``record_shapes`` (the family's storage order,
    FLUX: [L, D] / [P] / [L, 3]), all of ``dtype``."""

    record_shapes: tuple[tuple[int, ...], ...]
    dtype: torch.dtype

    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """Expected shapes in the family's storage order."""
        return self.record_shapes


@dataclass(frozen=True)
class PreprocessResult:
    num_prompts: int  # M: prompts in the cleaned, capped list
    num_already_encoded: int  # N: found complete on entry (all ranks)
    num_encoded: int  # prompts written by this run (all ranks)
    seconds: float  # wall time of the encoding loop
    json_path: Path


# ---------------------------------------------------------------- layout


def embedding_paths(output_dir: str | Path, idx: int, family: ModelFamily) -> tuple[Path, ...]:
    """The files of prompt ``idx`` (FLUX: prompt_embed, pooled_prompt_embeds, text_ids)."""
    out = Path(output_dir)
    return tuple(out / sub / f"{idx}.pt" for sub in subdirs(family))


def caption_entries(prompts: list[str], family: ModelFamily) -> list[dict]:
    """videos2caption.json's content, ordered by prompt index; keys in the family's json_keys order."""
    keys = family.json_keys
    return [{k: (caption if k == "caption" else f"{idx}.pt") for k in keys} for idx, caption in enumerate(prompts)]


def batch_grid(num_prompts: int, batch_size: int, num_available: int | None = None) -> list[list[int]]:
    """Consecutive batches covering prompts 0..num_prompts-1.

    Batches are filled from the ``num_available`` usable prompts of the file (default: just
    ``num_prompts``), so the batch holding a prompt is the same whatever --max_prompts cut the
    list at: a run capped at 5 prompts and a later full run encode prompt 4 in the same batch.
    Indices >= num_prompts are encoded only as batch mates and never written.
    """
    last = max(num_prompts, num_available or 0)
    return [list(range(s, min(s + batch_size, last))) for s in range(0, num_prompts, batch_size)]


def rank_batches(batches: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
    """Round-robin deal: rank r encodes batches r, r + W, r + 2W, ... (disjoint, covering)."""
    return batches[rank::world_size]


# ---------------------------------------------------------------- files


# The temporaries atomic_torch_save writes for an embedding file N.pt: .N.pt.PID.tmp (nothing else is
# taken for a killed writer's leftover).
WRITER_TMP = re.compile(r"^\.\d+\.pt\.\d+\.tmp$")


def atomic_torch_save(tensor: torch.Tensor, path: Path) -> None:
    """torch.save through a temporary file and os.replace: a reader never sees half a file.

    No fsync: a file cut short by a crash fails the loadability check on the rerun and is
    re-encoded, which is cheaper than syncing tens of thousands of files.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(tensor, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _load_ok(path: Path, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    if not path.is_file():
        return False
    try:
        # mmap: reads the archive's index, not the data, so checking 50k prompts stays cheap.
        t = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # any unreadable file means "encode again"
        return False
    return isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype == dtype


def is_encoded(output_dir: str | Path, idx: int, spec: EmbeddingSpec, family: ModelFamily) -> bool:
    """All files of prompt ``idx`` present, loadable, and of the expected shape and dtype."""
    paths = embedding_paths(output_dir, idx, family)
    return all(_load_ok(p, s, spec.dtype) for p, s in zip(paths, spec.shapes()))


def save_prompt_record(output_dir: str | Path, idx: int, record, family: ModelFamily) -> None:
    """Write one prompt's stored tensors (record: Conditioning name -> tensor, in the family's
    stored_record form; FLUX: [L, D], [P], [3]) as plain CPU tensors with their own storage."""
    record = family.stored_record(record)
    names = [s.name for s in family.storage]
    for path, name in zip(embedding_paths(output_dir, idx, family), names):
        # copy=True: a row of the batch would otherwise pickle the whole batch's storage.
        atomic_torch_save(record[name].detach().to("cpu", copy=True), path)


def _indices_on_disk(output_dir: Path, family: ModelFamily) -> set[int]:
    found: set[int] = set()
    for sub in subdirs(family):
        folder = output_dir / sub
        if folder.is_dir():
            found.update(int(p.stem) for p in folder.glob("*.pt") if p.stem.isdigit())
    return found


def caption_hash(caption: str) -> str:
    return hashlib.sha256(caption.encode("utf-8")).hexdigest()[:16]


def settings_fingerprint(cfg: PreprocessConfig, spec: EmbeddingSpec) -> dict:
    """What, besides the caption, determines a prompt's files. Weight files are identified by
    name and size (hashing gigabytes of T5 weights on every run would cost minutes)."""
    family = cfg.family()
    root = Path(cfg.model_path).resolve()
    files = {}
    for comp in family.text_components:  # a component the folder lacks (Wan2.2-I2V-A14B's CLIP) counts as absent
        for p in sorted((root / comp).iterdir()) if (root / comp).is_dir() else ():
            if p.is_file():
                files[f"{comp}/{p.name}"] = p.stat().st_size
    configs = {comp: json.loads((root / comp / "config.json").read_text())
               for comp in family.text_encoder_components if (root / comp).is_dir()}
    settings = {
        "model_path": str(root),
        "files": files,
        "configs": configs,
        "max_sequence_length": cfg.max_sequence_length,
        "dtype": str(spec.dtype).removeprefix("torch."),
        "shapes": [list(s) for s in spec.shapes()],
    }
    if family.vae_area is not None:  # the area the sources were resized to before the VAE
        settings["source_vae_area"] = family.vae_area
    return settings


def prepare_output(output_dir: str | Path, settings: dict, prompts: list[str], family: ModelFamily,
                   overwrite: bool = False) -> int:
    """Rank 0, before anyone writes: create the folders, find the files that cannot be trusted for
    this run, delete them only with ``overwrite`` (else raise a ConfigError saying what differs),
    then record the run in preprocess_meta.json. Returns how many prompts' files were deleted.

    Untrusted: every file when there is no readable meta (unknown origin: upstream DanceGRPO's
    folders have none) or the settings changed; otherwise the files of indices whose caption
    changed. Files of indices past this run's prompt list (a --max_prompts cap) are kept, and so
    are their captions in the meta, for a later full run. Deleting before the meta is rewritten
    keeps an interruption at any point safe: the rerun deletes the same files again. The old
    videos2caption.json goes when the prompt list changed; the run writes it again at the end.
    """
    out = Path(output_dir)
    for sub in subdirs(family):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for tmp in (out / sub).glob(".*.tmp"):  # left by a killed writer; a user's own .*.tmp stays
            if WRITER_TMP.match(tmp.name):
                tmp.unlink(missing_ok=True)
    new_hashes = [caption_hash(c) for c in prompts]
    old = _read_meta(out / META_NAME)
    on_disk = _indices_on_disk(out, family)
    old_hashes = old.get("caption_sha256_16", []) if old is not None else []
    if old is None or old.get("settings") != settings:
        stale = on_disk
    else:
        stale = {i for i in on_disk if i < len(new_hashes) and (i >= len(old_hashes) or old_hashes[i] != new_hashes[i])}
    if stale and not overwrite:
        raise ConfigError(_refusal(out, old, settings, stale, family))
    for idx in stale:
        for path in embedding_paths(out, idx, family):
            path.unlink(missing_ok=True)
    kept_tail = [] if old is None or old.get("settings") != settings else old_hashes[len(new_hashes):]
    hashes = new_hashes + kept_tail
    if stale or old is None or old.get("caption_sha256_16") != hashes:
        # An index describing other prompts must not outlive this run if it is interrupted.
        (out / JSON_NAME).unlink(missing_ok=True)
    atomic_write_json(
        out / META_NAME, {"format": META_FORMAT, "settings": settings, "caption_sha256_16": hashes}, indent=None
    )
    return len(stale)


def _refusal(out: Path, old: dict | None, settings: dict, stale: set[int], family) -> str:
    """Why the files of ``stale`` cannot be reused, and the ways out."""
    ways = "pass --overwrite to replace them, or choose another --output_dir"
    if old is None:
        shape = _shape_report(out, sorted(stale), family)
        return (f"{out} holds the embeddings of {len(stale)} prompts but no {META_NAME} (written by upstream "
                f"DanceGRPO or another tool), so what they encode is unknown; they are left as they are "
                f"({shape}): train on them directly with --data_json_path {out / JSON_NAME}, or {ways}")
    changed = sorted(k for k in set(settings) | set(old.get("settings", {}))
                     if settings.get(k) != old.get("settings", {}).get(k))
    if changed:
        return (f"{out} holds the embeddings of {len(stale)} prompts made with other settings "
                f"(differing: {', '.join(changed)}); refusing to delete them: {ways}")
    first = min(stale)
    return (f"{out} holds the embeddings of {len(stale)} prompts whose captions differ from this prompt list "
            f"(first: prompt {first}); refusing to delete them: {ways}")


def _shape_report(out: Path, indices: list[int], family) -> str:
    """'their shapes check: (L, D, P) = ...' or the first file whose shape does not (header reads)."""
    fam, dims = family, None
    for idx in indices:
        paths = embedding_paths(out, idx, family)
        try:
            raw = {s.name: torch.load(p, map_location="cpu", weights_only=True, mmap=True)
                   for s, p in zip(fam.storage, paths)}
            _, dims = fam.check_record(idx, raw, dims, str(out))
        except Exception as exc:  # a missing, unreadable or wrong-shaped file: name it
            return f"prompt {idx}'s files do not pass the shape check: {type(exc).__name__}: {str(exc)[:200]}"
    return f"all pass the shape check, {fam.name} dims {dims}"


def _read_meta(path: Path) -> dict | None:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == META_FORMAT else None


def missing_files(output_dir: str | Path, num_prompts: int, family: ModelFamily) -> list[str]:
    """Paths (relative to output_dir) of expected files that are absent."""
    out = Path(output_dir)
    return [
        str(p.relative_to(out)) for idx in range(num_prompts) for p in embedding_paths(out, idx, family)
        if not p.is_file()
    ]


def write_caption_json(output_dir: str | Path, prompts: list[str], family: ModelFamily) -> Path:
    out = Path(output_dir)
    missing = missing_files(out, len(prompts), family)
    if missing:
        raise RuntimeError(
            f"{len(missing)} embedding files are missing in {str(out)!r} (first: {missing[0]}); "
            "a rank did not finish — run the preprocessing again, it resumes"
        )
    path = out / JSON_NAME
    atomic_write_json(path, caption_entries(prompts, family), indent=4)
    return path


# ---------------------------------------------------------------- the run


def _identity(x):
    return x


class _BatchList(torch.utils.data.Dataset):
    """Items are whole batches (indices, captions): the grid, not the DataLoader, decides
    batch composition, which keeps the output independent of the number of ranks."""

    def __init__(self, batches: list[list[int]], prompts: list[str]):
        self.batches = batches
        self.prompts = prompts

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> tuple[list[int], list[str]]:
        idx = self.batches[i]
        return idx, [self.prompts[j] for j in idx]


def encoding_dtype(device: torch.device) -> torch.dtype:
    """bf16 on accelerators (as upstream encodes), fp32 on CPU (exact, and CPU bf16 is slow)."""
    return torch.bfloat16 if devices.is_accelerator(device) else torch.float32


def _log(info: devices.DistInfo, msg: str) -> None:
    if info.is_main:
        print(msg, flush=True)


def _count_global(n: int, device: torch.device) -> int:
    # float32 (exact below 2**24): every backend reduces it, not every one reduces int64.
    t = torch.tensor([n], dtype=torch.float32, device=device)
    return int(round(devices.all_reduce_sum(t).item()))


def _encode_batches(
    cfg: PreprocessConfig, encoders, batches: list[list[int]], prompts: list[str], todo: set[int], info,
    images: list[Path] | None = None,
) -> int:
    """Encode this rank's batches that hold a missing prompt; write only the missing prompts."""
    from fastvideo.progress import Progress

    family = cfg.family()
    loader = torch.utils.data.DataLoader(
        _BatchList(batches, prompts), batch_size=None, shuffle=False,
        num_workers=cfg.dataloader_num_workers, collate_fn=_identity,
    )
    total = sum(1 for b in batches for i in b if i in todo)
    bar = Progress(total, f"encoding (rank 0 of {info.world_size})", unit="prompt", enabled=info.is_main)
    written = 0
    for indices, captions in loader if batches else ():
        # The whole batch is encoded even when only part of it is missing, so that each prompt
        # always goes through the same batch (same kernels, same bits).
        cond = family.encode_prompts(encoders, captions, cfg.max_sequence_length)
        cond = add_sources(family, encoders, cond, images, indices)  # an editing family's source images
        new = [(row, idx) for row, idx in enumerate(indices) if idx in todo]
        for row, idx in new:
            save_prompt_record(cfg.output_dir, idx, cond.record(row), family)
        written += len(new)
        bar.update(len(new))
    bar.close()
    return written


def run_preprocess(cfg: PreprocessConfig) -> PreprocessResult:
    """Encode ``cfg.prompt_file`` into ``cfg.output_dir``; one process or one rank of torchrun."""
    cfg.validate()
    family = cfg.family()
    info = devices.init_distributed()
    try:
        plist: PromptList = load_prompts(cfg.prompt_file, cfg.max_prompts)
        prompts = plist.prompts
        _log(info, f"read {plist.summary()}")
        dtype = encoding_dtype(info.device)
        encoders = family.load_text_encoders(cfg.model_path, info.device, dtype)
        dims = family.encoder_dims(encoders)
        if plist.images is not None:  # checked (one size) by cfg.validate
            from fastvideo.data.sources import open_rgb, reference_count, references

            width, height = open_rgb(references(plist.images[0])[0]).size  # as decoded: its EXIF orientation applied
            dims.update(source_width=width, source_height=height, source_references=reference_count(plist.images[0]))
        spec = EmbeddingSpec(family.record_shapes(cfg.max_sequence_length, dims), dtype)
        if info.is_main:
            removed = prepare_output(cfg.output_dir, settings_fingerprint(cfg, spec), record_keys(plist), family,
                                     cfg.overwrite)
            if removed:
                _log(info, f"removed the files of {removed} prompts made from other settings or captions")
        devices.barrier()

        usable = prompts + plist.spare  # batch mates beyond the cap (see batch_grid)
        grid = batch_grid(len(prompts), cfg.batch_size, len(usable))
        batches = rank_batches(grid, info.rank, info.world_size)
        mine = [i for b in batches for i in b if i < len(prompts)]
        todo = {i for i in mine if not is_encoded(cfg.output_dir, i, spec, family)}
        already = _count_global(len(mine) - len(todo), info.device)
        remaining = len(prompts) - already
        if already:
            _log(info, f"{already} of {len(prompts)} prompts already encoded, encoding the remaining {remaining}")
        work = [b for b in batches if any(i in todo for i in b)]
        _log(
            info,
            f"encoding {remaining} prompts on {info.world_size} x {info.device.type} ({dtype}), "
            f"batch {cfg.batch_size}, max_sequence_length {cfg.max_sequence_length}",
        )
        start = time.perf_counter()
        written = _encode_batches(cfg, encoders, work, usable, todo, info,
                                  record_images(plist) if plist.images is not None else None)
        devices.synchronize(info.device)
        total_written = _count_global(written, info.device)  # also the barrier before the json
        seconds = time.perf_counter() - start
        json_path = Path(cfg.output_dir) / JSON_NAME
        if info.is_main:
            json_path = write_caption_json(cfg.output_dir, prompts, family)
            rate = total_written / seconds if seconds > 0 else 0.0
            _log(info, f"wrote {total_written} prompts in {seconds:.1f} s ({rate:.1f} prompts/s); index: {json_path}")
        devices.barrier()
        return PreprocessResult(len(prompts), already, total_written, seconds, json_path)
    finally:
        devices.destroy_distributed()
