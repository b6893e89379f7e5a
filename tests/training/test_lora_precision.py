"""The frozen base's dtype under --use_lora: the master dtype (fp32) by default as upstream's LoRA
script (FluxTransformer2DModel.from_pretrained(..., torch_dtype=torch.float32), bf16 autocast),
bf16 only with --lora_base_precision bf16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastvideo.config import build_parser, validate_args
from fastvideo.training.builders import lora_base_dtype

BASE = ["--data_json_path", "x", "--pretrained_model_name_or_path", "x", "--rewards", "compressibility:1",
        "--use_lora"]


def _cfg(*flags):
    return validate_args(build_parser().parse_args(BASE + list(flags)))


@pytest.mark.parametrize("flags, dtype", [
    ((), torch.float32),  # --mixed_precision bf16 is the default: the base still stays fp32
    (("--mixed_precision", "no"), torch.float32),
    (("--lora_base_precision", "bf16"), torch.bfloat16),
    (("--master_weight_type", "bf16"), torch.bfloat16),
])
def test_lora_base_dtype(flags, dtype):
    cfg = _cfg(*flags)
    assert cfg.model.mixed_precision == ("no" if "no" in flags else "bf16")
    assert lora_base_dtype(cfg) == dtype


def test_base_params_are_fp32_and_adapters_train(tiny_flux_dir):
    from fastvideo.models import flux
    from fastvideo.training.lora import apply_lora

    for flags, base in (((), torch.float32), (("--lora_base_precision", "bf16"), torch.bfloat16)):
        cfg = _cfg("--lora_rank", "4", "--lora_alpha", "8", *flags)
        model = flux.load_transformer(Path(tiny_flux_dir), device="cpu", dtype=torch.float32)
        apply_lora(model, cfg.lora, lora_base_dtype(cfg), torch.float32, seed=0)
        frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
        trained = {p.dtype for p in model.parameters() if p.requires_grad}
        assert frozen == {base} and trained == {torch.float32}
        norm = dict(model.named_parameters())["norm_out.linear.weight"]
        assert norm.dtype == base and not norm.requires_grad


def test_old_config_json_replays_a_bf16_base():
    from fastvideo.component_settings.lora import LoraSettings

    section = {"enabled": True, "rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["to_q"],
               "init_weights": None}
    assert LoraSettings.flags_from_resolved(section)["lora_base_precision"] == "bf16"
    assert LoraSettings.flags_from_resolved({**section, "base_precision": "master"})["lora_base_precision"] == "master"
