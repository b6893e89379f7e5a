"""Export a training checkpoint's transformer as a diffusers folder.

    python -m fastvideo.tools.export CKPT OUT [--ema] [--base MODEL_DIR] [--dtype fp32|bf16]

Without --base, OUT is a transformer folder (config.json + diffusion_pytorch_model.safetensors):

    transformer = FluxTransformer2DModel.from_pretrained(OUT)
    pipe = FluxPipeline.from_pretrained(BASE_FLUX_DIR, transformer=transformer)

With --base, OUT is a complete FLUX pipeline folder: every component of MODEL_DIR (hard-linked
when the file system allows, else copied) with its transformer/ replaced by the checkpoint's, so
``FluxPipeline.from_pretrained(OUT)`` works directly and the trainer accepts it as
--pretrained_model_name_or_path. The transformer config comes from the checkpoint itself; the
base folder is needed only for the other components. --ema exports the EMA weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from fastvideo.training import checkpoint as ckpt_lib
from fastvideo.errors import UserError

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ExportError(UserError, ValueError):
    """The export cannot be done as asked."""


def _transformer_config(ckpt: Path, base: Path | None) -> dict:
    own = ckpt / ckpt_lib.CONFIG_FILE
    if own.is_file():
        config = json.loads(own.read_text(encoding="utf-8"))
    elif base is not None and (base / "transformer" / "config.json").is_file():
        config = json.loads((base / "transformer" / "config.json").read_text(encoding="utf-8"))
    else:
        raise ExportError(
            f"{ckpt} holds no {ckpt_lib.CONFIG_FILE} (saved without a transformer config); pass --base with the "
            "FLUX folder the run started from"
        )
    config.setdefault("_class_name", "FluxTransformer2DModel")
    if "_diffusers_version" not in config:
        import diffusers

        config["_diffusers_version"] = diffusers.__version__
    return config


def _write_transformer(folder: Path, weights: Path, config: dict, dtype: torch.dtype | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if dtype is None:
        shutil.copyfile(weights, folder / WEIGHTS_NAME)  # the checkpoint's bytes, unchanged
        return
    from safetensors.torch import load_file, save_file

    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in load_file(str(weights)).items()}
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


def _copy_base(base: Path, out: Path) -> None:
    from fastvideo.models import flux

    flux.check_flux_folder(base)
    for entry in base.iterdir():
        if entry.name == "transformer":
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
    weights = ckpt / (ckpt_lib.EMA_FILE if ema else ckpt_lib.MODEL_FILE)
    if not weights.is_file():
        raise ExportError(f"{ckpt} has no {weights.name}" + (" (the run did not use --use_ema)" if ema else ""))
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ExportError(f"{out} exists and is not empty; choose another folder or pass --overwrite")
    config = _transformer_config(ckpt, base_dir)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        if base_dir is not None:
            _copy_base(base_dir, tmp)
            _write_transformer(tmp / "transformer", weights, config, DTYPES.get(dtype))
        else:
            _write_transformer(tmp, weights, config, DTYPES.get(dtype))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="a checkpoint-N folder written by the trainer")
    ap.add_argument("out", help="folder to write")
    ap.add_argument("--ema", action="store_true", help="export the EMA weights instead of the policy")
    ap.add_argument("--base", default=None, help="FLUX folder whose other components complete a pipeline folder")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast the weights (default: as saved)")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = ap.parse_args(argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out, args.ema, args.base, args.dtype, args.overwrite)
    except Exception as exc:  # noqa: BLE001 - a user error prints alone, anything else with its traceback
        from fastvideo.errors import report_failure

        raise SystemExit(report_failure(exc, "export")) from exc
    kind = "pipeline folder" if args.base else "transformer folder"
    print(f"exported {'EMA' if args.ema else 'policy'} weights of {args.checkpoint} as a diffusers {kind}: {out}")


if __name__ == "__main__":
    main()
