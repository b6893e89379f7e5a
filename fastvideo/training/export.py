"""Export a training checkpoint's transformer as a diffusers folder (the library under
``python -m fastvideo.tools.export``, whose help shows the command line).

A checkpoint folder itself already loads as upstream's do (FluxTransformer2DModel.from_pretrained, or
FluxPipeline.load_lora_weights for a LoRA run); export writes a clean folder, the EMA weights, a
chosen dtype or a whole pipeline.

- :func:`export_checkpoint`: a full fine-tuning checkpoint -> a transformer folder
  (config.json + diffusion_pytorch_model.safetensors, the family's transformer class
  ``.from_pretrained``), or with ``base`` a complete pipeline folder: every component of the base folder (hard-linked
  when the file system allows, else copied) with its transformer/ replaced by the checkpoint's. The
  transformer config comes from the checkpoint itself; ``ema`` exports the EMA weights.
- :func:`export_lora`: a LoRA checkpoint (adapters only) -> a diffusers LoRA file for
  ``pipe.load_lora_weights`` (the scale alpha / rank is folded into lora_B: diffusers 0.32 loads a
  file at scale 1).
- :func:`export_merged` / :func:`merged_transformer`: a LoRA checkpoint merged into its base
  transformer (base + scale * B @ A); the base is the one the run trained on (recorded in the
  checkpoint) unless ``base`` names a model folder.

The model family is the one the checkpoint records (its run's config.json, else its transformer
config's _class_name; fastvideo.training.checkpoint.files.recorded_family); a checkpoint that
says neither is refused.

Every folder appears atomically (written next to OUT, then renamed into place).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from fastvideo.training import checkpoint as ckpt_lib
from fastvideo.training.checkpoint import shards
from fastvideo.errors import UserError

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ExportError(UserError, ValueError):
    """The export cannot be done as asked."""


def checkpoint_family(ckpt: str | os.PathLike, **settings):
    """The ModelFamily a checkpoint was trained as (recorded_family); ExportError when nothing says."""
    from fastvideo.models.registry import get_model_family

    name = ckpt_lib.recorded_family(ckpt)
    if name is None:
        raise ExportError(f"cannot tell which model family {str(ckpt)!r} is: neither its run's config.json beside "
                          "it nor a transformer config.json naming a registered family's class; export it from its "
                          "run's OUTPUT_DIR")
    return get_model_family(name, **settings)


def _transformer_config(ckpt: Path, base: Path | None, family) -> dict:
    own = ckpt_lib.stored_file(ckpt, ckpt_lib.CONFIG_FILE)
    if own.is_file():
        config = json.loads(own.read_text(encoding="utf-8"))
    elif base is not None and (base / "transformer" / "config.json").is_file():
        config = json.loads((base / "transformer" / "config.json").read_text(encoding="utf-8"))
    else:
        raise ExportError(
            f"{ckpt} holds no {ckpt_lib.CONFIG_FILE} (saved without a transformer config); pass --base with the "
            f"{family.name} folder the run started from"
        )
    config.setdefault("_class_name", family.export_class_name)
    if "_diffusers_version" not in config:
        import diffusers

        config["_diffusers_version"] = diffusers.__version__
    return config


def _write_transformer(folder: Path, weights: Path | dict, config: dict, dtype: torch.dtype | None) -> None:
    """weights: a checkpoint's weight file, or a state dict (the EMA of a sharded checkpoint)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if dtype is None and not isinstance(weights, dict):
        shutil.copyfile(weights, folder / WEIGHTS_NAME)  # the checkpoint's bytes, unchanged
        return
    from safetensors.torch import load_file, save_file

    state = weights if isinstance(weights, dict) else load_file(str(weights))
    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v) for k, v in state.items()}
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})


LINK_MIN_BYTES = 1 << 20


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link large weight files (no extra disk for text encoders and VAE); copy small ones, so
    editing a config in OUT never edits the base folder through a shared inode."""
    if os.path.getsize(src) >= LINK_MIN_BYTES:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


# The state-dict prefixes of a model holding several diffusers transformers under their folder names
# (fastvideo.models.wan.experts.WanExperts: transformer = the high-noise expert, transformer_2 the low).
TRANSFORMER_PARTS = ("transformer", "transformer_2")


def _split_parts(names, at_least: int = 2) -> dict[str, list[str]] | None:
    """{part: its names} when every name is ``<part>.<name>`` of at least ``at_least`` of
    TRANSFORMER_PARTS; None otherwise (one transformer's names: no family's module is named
    ``transformer`` or ``transformer_2``, their blocks are ``transformer_blocks`` / ``blocks``)."""
    names = list(names)
    split = {part: [n for n in names if n.startswith(part + ".")] for part in TRANSFORMER_PARTS}
    if not names or sum(len(v) for v in split.values()) != len(names) or sum(bool(v) for v in split.values()) < at_least:
        return None
    return {part: got for part, got in split.items() if got}


def _transformer_parts(weights: Path | dict) -> dict[str, dict] | None:
    """{sub-folder: its state dict} when every name of ``weights`` is ``<part>.<name>`` of several
    TRANSFORMER_PARTS (a two-expert checkpoint); None for one transformer's weights."""
    from fastvideo.models.sharded_load import read_header

    split = _split_parts(list(weights) if isinstance(weights, dict) else list(read_header(Path(weights))[0]))
    if split is None:
        return None
    if not isinstance(weights, dict):
        from safetensors.torch import load_file

        weights = load_file(str(weights))
    return {part: {n[len(part) + 1:]: weights[n] for n in got} for part, got in split.items()}


def _copy_base(base: Path, out: Path, family, skip: tuple[str, ...] = ("transformer",)) -> None:
    family.check_folder(base)
    for entry in base.iterdir():
        if entry.name in skip:
            continue
        if entry.is_dir():
            shutil.copytree(entry, out / entry.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(entry), str(out / entry.name))


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    ema: bool = False,
    base: str | os.PathLike | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the transformer folder (or, with ``base``, the whole pipeline folder) to ``out``.
    The folder appears atomically: it is written next to ``out`` and renamed into place."""
    ckpt = Path(checkpoint)
    ckpt_lib.verify_checkpoint(ckpt)
    out = Path(out)
    base_dir = Path(base) if base is not None else None
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if ckpt_lib.has_file(ckpt, ckpt_lib.LORA_FILE):
        raise ExportError(f"{ckpt} is a LoRA checkpoint (adapters only): export it with --lora (a diffusers LoRA "
                          "file) or --merge (a full transformer folder)")
    weights = ckpt / ckpt_lib.EMA_FILE if ema else ckpt_lib.stored_file(ckpt, ckpt_lib.MODEL_FILE)
    if ema and not weights.is_file() and shards.is_sharded(ckpt):
        # --checkpoint_format sharded keeps the EMA of the trainable parameters in shards; the
        # rest (buffers) is the model file's, as the gathered EMA file holds it
        weights = {**ckpt_lib.read_weights(ckpt), **_sharded_ema(ckpt)}
    elif not weights.is_file():
        raise ExportError(f"{ckpt} has no {weights.name}" + (" (the run did not use --use_ema)" if ema else ""))
    family = checkpoint_family(ckpt)
    config = _transformer_config(ckpt, base_dir, family)

    def fill(tmp: Path) -> None:
        parts = _transformer_parts(weights)  # several transformers (Wan2.2-A14B's experts): one sub-folder each
        if base_dir is not None:
            _copy_base(base_dir, tmp, family, skip=tuple(parts or ("transformer",)))
        if parts is None:
            _write_transformer(tmp / "transformer" if base_dir is not None else tmp, weights, config, DTYPES.get(dtype))
        for name, state in (parts or {}).items():
            _write_transformer(tmp / name, state, config, DTYPES.get(dtype))

    return _atomic_folder(out, overwrite, fill)


def _lora_info(ckpt: Path) -> dict:
    if not ckpt_lib.has_file(ckpt, ckpt_lib.LORA_FILE):
        raise ExportError(f"{ckpt} is not a LoRA checkpoint (no {ckpt_lib.LORA_FILE}); --lora and --merge are for "
                          "runs with --use_lora. Export a full fine-tuning checkpoint without them")
    info = ckpt_lib.load_tree(ckpt, "extra_state").get("lora")
    if not isinstance(info, dict):
        raise ExportError(f"{ckpt}/extra_state.json records no LoRA settings; was it written by this trainer?")
    return info


def _adapters(ckpt: Path, ema: bool) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not ema:
        return ckpt_lib.read_weights(ckpt, lora=True)
    if not (ckpt / ckpt_lib.EMA_FILE).is_file() and shards.is_sharded(ckpt):
        return _sharded_ema(ckpt)
    if not (ckpt / ckpt_lib.EMA_FILE).is_file():
        raise ExportError(f"{ckpt} has no {ckpt_lib.EMA_FILE} (the run did not use --use_ema)")
    return load_file(str(ckpt / ckpt_lib.EMA_FILE))


def _sharded_ema(ckpt: Path) -> dict[str, torch.Tensor]:
    try:
        return shards.read_full(ckpt, "ema")
    except ckpt_lib.CheckpointError as err:
        raise ExportError(f"{err} (the run did not use --use_ema?)") from None


def _atomic_folder(out: Path, overwrite: bool, fill) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ExportError(f"{out} exists and is not empty; choose another folder or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        fill(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# The diffusers LoRA file of each transformer: WanPipeline.load_lora_weights(OUT, weight_name=...,
# load_into_transformer_2=True) puts the second file's adapters into the low-noise expert.
LORA_PART_FILES = {"transformer": "pytorch_lora_weights.safetensors",
                   "transformer_2": "pytorch_lora_weights_transformer_2.safetensors"}


def export_lora(checkpoint, out, ema: bool = False, overwrite: bool = False) -> Path:
    """OUT/pytorch_lora_weights.safetensors in diffusers' LoRA format (scale folded in); a
    two-expert run's (Wan2.2-A14B) adapters: one file per trained expert (LORA_PART_FILES)."""
    from safetensors.torch import save_file

    from fastvideo.training import lora

    ckpt = Path(checkpoint)
    ckpt_lib.verify_checkpoint(ckpt)
    info = _lora_info(ckpt)
    adapters = _adapters(ckpt, ema)
    parts = _split_parts(adapters, at_least=1)
    files = ({LORA_PART_FILES[part]: {n[len(part) + 1:]: adapters[n] for n in got} for part, got in parts.items()}
             if parts else {lora.LORA_WEIGHTS_NAME: adapters})
    scale = float(info["alpha"]) / float(info["rank"])

    def fill(tmp: Path) -> None:
        for name, state in files.items():
            save_file(lora.to_diffusers(state, scale), str(tmp / name), metadata={"format": "pt"})
        (tmp / "lora_settings.json").write_text(json.dumps(
            {**info, "note": "lora_B already includes the scale lora_alpha / lora_rank; load at scale 1"},
            indent=2) + "\n", encoding="utf-8")

    return _atomic_folder(Path(out), overwrite, fill)


def lora_load_lines(out: Path) -> list[str]:
    """How an exported LoRA folder loads in the stock pipeline: one call per file it holds."""
    lines = []
    for part, name in LORA_PART_FILES.items():
        if (Path(out) / name).is_file():
            into = ", load_into_transformer_2=True" if part == "transformer_2" else ""
            lines.append(f"pipe.load_lora_weights({str(out)!r}, weight_name={name!r}{into})")
    return lines


def _base_transformer(info: dict, base: str | None) -> Path:
    if base is not None:
        return Path(base) / "transformer"
    if info.get("base_transformer"):
        root = Path(info["base_transformer"])
        return root / "transformer" if (root / "transformer" / "config.json").is_file() else root
    return Path(info["base_model"]) / "transformer"


def merged_transformer(checkpoint, ema: bool = False, base: str | None = None, family=None):
    """The base transformer (float32, CPU) with a LoRA checkpoint's adapters merged in. family:
    the ModelFamily (default: the one the checkpoint records). A two-expert run's adapters
    (``transformer.*`` / ``transformer_2.*``) merge into the family's two-expert model of the base
    folder (both experts loaded; an expert without adapters stays the base's)."""
    from fastvideo.models.loading import from_pretrained_checked
    from fastvideo.training import lora

    ckpt = Path(checkpoint)
    ckpt_lib.verify_checkpoint(ckpt)
    info = _lora_info(ckpt)
    folder = _base_transformer(info, base)
    if not (folder / "config.json").is_file():
        raise ExportError(f"merging needs the base transformer the adapters were trained on; {folder} holds no "
                          "config.json: pass --base MODEL_DIR")
    family = family if family is not None else checkpoint_family(ckpt)
    adapters = _adapters(ckpt, ema)
    if _split_parts(adapters, at_least=1) and folder.name == "transformer":
        model = family.load_transformer(folder.parent, "transformer", "cpu", torch.float32)
    else:
        model = from_pretrained_checked(family.transformer_class(), folder, None, torch.float32)
    merged = lora.merge_into_base(model.state_dict(), adapters, float(info["alpha"]) / float(info["rank"]))
    model.load_state_dict(merged)
    return model


def _save_merged(model, tmp: Path) -> None:
    """One transformer: its folder at OUT; several (Wan2.2-A14B's experts): OUT/transformer and
    OUT/transformer_2, the pipeline's sub-folders."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(tmp, safe_serialization=True)
        return
    for part in TRANSFORMER_PARTS:
        getattr(model, part).save_pretrained(tmp / part, safe_serialization=True)


def export_merged(checkpoint, out, ema: bool = False, base: str | None = None, dtype: str | None = None,
                  overwrite: bool = False) -> Path:
    """A full transformer folder: the base transformer with every adapter merged in (two experts:
    a folder for each, see _save_merged)."""
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    model = merged_transformer(checkpoint, ema, base)
    if dtype is not None:
        model.to(DTYPES[dtype])
    return _atomic_folder(Path(out), overwrite, lambda tmp: _save_merged(model, tmp))
