"""What the standalone evaluator can evaluate: a diffusers FLUX folder, a training checkpoint
folder (checkpoint-N or OUTPUT_DIR/best, full or LoRA), an exported transformer folder, or an
exported LoRA (pytorch_lora_weights.safetensors) applied to the base model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.errors import UserError

FLUX_FOLDER, CHECKPOINT, TRANSFORMER_FOLDER = "flux", "checkpoint", "transformer"
LORA_CHECKPOINT, LORA_FILE = "lora_checkpoint", "lora_file"


class ModelSpecError(UserError, ValueError):
    """A --model argument that is not something the evaluator can load."""


@dataclass(frozen=True)
class ModelSpec:
    label: str
    path: Path
    kind: str  # flux | checkpoint | transformer | lora_checkpoint | lora_file


def _kind(path: Path) -> str:
    from fastvideo.training.lora import LORA_WEIGHTS_NAME

    if (path / "COMPLETE.json").is_file() and (path / "lora.safetensors").is_file():
        return LORA_CHECKPOINT
    if (path / LORA_WEIGHTS_NAME).is_file():
        return LORA_FILE
    if (path / "adapter_config.json").is_file():
        raise ModelSpecError(f"--model {str(path)!r} is a peft adapter folder; export the run's LoRA with "
                             "`python -m fastvideo.tools.export CKPT OUT --lora` and evaluate OUT (on --base)")
    if (path / "transformer" / "config.json").is_file():
        return FLUX_FOLDER
    if (path / "model.safetensors").is_file() and (path / "COMPLETE.json").is_file():
        return CHECKPOINT
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return TRANSFORMER_FOLDER
    raise ModelSpecError(
        f"--model {str(path)!r} is neither a FLUX folder (transformer/config.json), a training checkpoint "
        "(model.safetensors or lora.safetensors + COMPLETE.json), an exported transformer folder (config.json + "
        "*.safetensors) nor an exported LoRA (pytorch_lora_weights.safetensors)")


def parse_model_arg(text: str) -> ModelSpec:
    """'PATH' or 'LABEL=PATH' -> ModelSpec (the label defaults to the folder's name)."""
    label, sep, path = text.partition("=")
    if not sep:
        label, path = "", text
    p = Path(path)
    if not p.is_dir():
        raise ModelSpecError(f"--model {text!r}: {str(p)!r} is not a folder")
    return ModelSpec(label or p.name, p, _kind(p))


def load_transformer_for(spec: ModelSpec, base: Path, device, dtype=torch.float32):
    """The FluxTransformer2DModel of ``spec``; a checkpoint takes its architecture from its own
    transformer_config.json (else from ``base``) and its weights from model.safetensors."""
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import load_file

    from fastvideo.models import flux
    from fastvideo.rewards.base import load_state_dict_strict
    from fastvideo.training import checkpoint as ckpt_lib

    if spec.kind == FLUX_FOLDER:
        return flux.load_transformer(spec.path, device=device, dtype=dtype).eval()
    if spec.kind == TRANSFORMER_FOLDER:
        model = FluxTransformer2DModel.from_pretrained(spec.path, torch_dtype=dtype).to(device)
        flux.adapt_for_device(model, device)
        return model.eval()
    if spec.kind in (LORA_CHECKPOINT, LORA_FILE):
        model = _lora_merged(spec, base)
        model.to(device=device, dtype=dtype)
        flux.adapt_for_device(model, device)
        return model.eval()
    ckpt_lib.verify_checkpoint(spec.path)
    own = spec.path / ckpt_lib.CONFIG_FILE
    config_path = own if own.is_file() else base / "transformer" / "config.json"
    config = {k: v for k, v in json.loads(config_path.read_text(encoding="utf-8")).items() if not k.startswith("_")}
    model = FluxTransformer2DModel.from_config(config)
    load_state_dict_strict(model, load_file(str(spec.path / ckpt_lib.MODEL_FILE)), str(spec.path))
    model.to(device=device, dtype=dtype)
    flux.adapt_for_device(model, device)
    return model.eval()


def _lora_merged(spec: ModelSpec, base: Path):
    """A LoRA checkpoint or an exported LoRA file merged into the base transformer (float32, CPU):
    W + scale B A, the function the adapted model computes."""
    from fastvideo.models import flux
    from fastvideo.training import export, lora

    if spec.kind == LORA_CHECKPOINT:
        return export.merged_transformer(spec.path, base=str(base))
    model = flux.load_transformer(base, device="cpu", dtype=torch.float32)
    adapters = lora.from_diffusers(lora.read_lora_file(spec.path), 1.0)  # the file is at scale 1
    model.load_state_dict(lora.merge_into_base(model.state_dict(), adapters, 1.0))
    return model
