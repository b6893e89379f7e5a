"""What the standalone evaluator can evaluate: a diffusers model folder, a training checkpoint
folder (checkpoint-N or OUTPUT_DIR/best, full or LoRA), an exported transformer folder, or an
exported LoRA (pytorch_lora_weights.safetensors) applied to the base model; and which model
family they are (all one: the checkpoints' runs record it, else --model_family)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.errors import UserError
from fastvideo.training.checkpoint.files import recorded_family

MODEL_FOLDER, CHECKPOINT, TRANSFORMER_FOLDER = "model_folder", "checkpoint", "transformer"
LORA_CHECKPOINT, LORA_FILE = "lora_checkpoint", "lora_file"


class ModelSpecError(UserError, ValueError):
    """A --model argument that is not something the evaluator can load."""


@dataclass(frozen=True)
class ModelSpec:
    label: str
    path: Path
    kind: str  # model_folder | checkpoint | transformer | lora_checkpoint | lora_file
    family: str | None = None  # the family its run or config records (None: it does not say)


def _kind(path: Path, family_label: str) -> str:
    from fastvideo.training.checkpoint import files
    from fastvideo.training.lora import LORA_WEIGHTS_NAME

    trainer_checkpoint = (path / files.MARKER).is_file()
    if trainer_checkpoint and files.has_file(path, files.LORA_FILE):
        return LORA_CHECKPOINT
    if (path / LORA_WEIGHTS_NAME).is_file():
        return LORA_FILE
    if (path / "adapter_config.json").is_file():
        raise ModelSpecError(f"--model {str(path)!r} is a peft adapter folder; export the run's LoRA with "
                             "`python -m fastvideo.tools.export CKPT OUT --lora` and evaluate OUT (on --base)")
    if (path / "transformer" / "config.json").is_file():
        return MODEL_FOLDER
    if trainer_checkpoint and files.has_file(path, files.MODEL_FILE):
        return CHECKPOINT
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return TRANSFORMER_FOLDER
    raise ModelSpecError(
        f"--model {str(path)!r} is neither a {family_label} folder (transformer/config.json), a training checkpoint "
        "(diffusion_pytorch_model.safetensors or pytorch_lora_weights.safetensors + COMPLETE.json), an exported transformer folder (config.json + "
        "*.safetensors) nor an exported LoRA (pytorch_lora_weights.safetensors)")


def parse_model_arg(text: str, family_label: str = "model") -> ModelSpec:
    """'PATH' or 'LABEL=PATH' -> ModelSpec (the label defaults to the folder's name); family_label
    names the expected base folder in the message for a folder of no known kind."""
    label, sep, path = text.partition("=")
    if not sep:
        label, path = "", text
    p = Path(path)
    if not p.is_dir():
        raise ModelSpecError(f"--model {text!r}: {str(p)!r} is not a folder")
    kind = _kind(p, family_label)
    recorded = recorded_family(p) if kind in (CHECKPOINT, LORA_CHECKPOINT, TRANSFORMER_FOLDER) else None
    return ModelSpec(label or p.name, p, kind, recorded)


def family_name_for(models: list[ModelSpec], flag: str | None) -> str:
    """The one family of the models: what their checkpoints record, else --model_family (default:
    the default family). Refuses models of two families, or a flag the checkpoints contradict."""
    from fastvideo.models.registry import DEFAULT_FAMILY

    recorded = {m.family for m in models if m.family is not None}
    names = recorded | ({flag} if flag else set())
    if len(names) > 1:
        raise ModelSpecError(f"the models are of different families ({', '.join(sorted(names))}; --model_family "
                             f"{flag}): evaluate each family separately")
    return names.pop() if names else DEFAULT_FAMILY


def load_transformer_for(spec: ModelSpec, base: Path, device, family, dtype=torch.float32):
    """The transformer of ``spec`` (a ``family`` model); a checkpoint takes its architecture from
    its own config.json (else from ``base``) and its weights (either checkpoint layout)."""

    from fastvideo.rewards.base import load_state_dict_strict
    from fastvideo.training import checkpoint as ckpt_lib

    if spec.kind == MODEL_FOLDER:
        return family.load_transformer(spec.path, "transformer", device, dtype).eval()
    if spec.kind == TRANSFORMER_FOLDER:
        return family.load_transformer(spec.path, None, device, dtype).eval()
    if spec.kind in (LORA_CHECKPOINT, LORA_FILE):
        model = _lora_merged(spec, base, family)
        model.to(device=device, dtype=dtype)
        family.adapt_for_device(model, device)
        return model.eval()
    ckpt_lib.verify_checkpoint(spec.path)
    own = ckpt_lib.stored_file(spec.path, ckpt_lib.CONFIG_FILE)
    config_path = own if own.is_file() else base / "transformer" / "config.json"
    config = {k: v for k, v in json.loads(config_path.read_text(encoding="utf-8")).items() if not k.startswith("_")}
    model = family.transformer_class().from_config(config)
    load_state_dict_strict(model, ckpt_lib.read_weights(spec.path), str(spec.path))
    model.to(device=device, dtype=dtype)
    family.adapt_for_device(model, device)
    return model.eval()


def _lora_merged(spec: ModelSpec, base: Path, family):
    """A LoRA checkpoint or an exported LoRA file merged into the base transformer (float32, CPU):
    W + scale B A, the function the adapted model computes."""
    from fastvideo.training import export, lora

    if spec.kind == LORA_CHECKPOINT:
        return export.merged_transformer(spec.path, base=str(base), family=family)
    model = family.load_transformer(base, "transformer", "cpu", torch.float32)
    adapters = lora.from_diffusers(lora.read_lora_file(spec.path), 1.0)  # the file is at scale 1
    model.load_state_dict(lora.merge_into_base(model.state_dict(), adapters, 1.0))
    return model
