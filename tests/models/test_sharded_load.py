"""FSDP loading without a full copy per rank: the meta-built transformer filled unit by unit from the
safetensors files must equal diffusers' own from_pretrained load, on 2 gloo ranks."""

from __future__ import annotations

import json

import pytest
import torch
from dist_utils import run_distributed, tiny_inputs, tiny_transformer

from fastvideo.distributed import fsdp
from fastvideo.models import sharded_load
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)


def _sharded_vs_reference(info, folder: str, checkpointing: bool):
    from diffusers import FluxTransformer2DModel

    ref = FluxTransformer2DModel.from_pretrained(folder)
    model, loader = sharded_load.meta_transformer(folder, None, torch.float32, info.device, family=FLUX)
    model = fsdp.wrap_model(model, "full", info.device, gradient_checkpointing=checkpointing, param_init_fn=loader)
    loader.check_complete()
    # Each rank holds only its shard: the flat parameters add up to half the model (plus padding).
    held = sum(p.numel() for p in model.parameters())
    state = fsdp.full_model_state_dict(model)
    out = model(**tiny_inputs(info.rank))[0].detach()
    ref_out = ref(**tiny_inputs(info.rank))[0].detach()
    # The previous path (full load on every rank, then FSDP) computes bit for bit the same.
    old = fsdp.wrap_model(FluxTransformer2DModel.from_pretrained(folder), "full", info.device,
                          gradient_checkpointing=checkpointing)
    old_out = old(**tiny_inputs(info.rank))[0].detach()
    diffs = {k: (v - ref.state_dict()[k]).abs().max().item() for k, v in state.items()}
    return {"held": held, "total": sum(p.numel() for p in ref.parameters()), "keys": len(state),
            "max_diff": max(diffs.values()) if diffs else -1.0, "out_diff": (out - ref_out).abs().max().item(),
            "old_diff": (out - old_out).abs().max().item()}


def test_sharded_load_equals_from_pretrained(tmp_path):
    # Several safetensors shards with an index, as FLUX.1-dev ships (the single-file case is below).
    tiny_transformer().save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / sharded_load.INDEX_NAME).is_file()
    results = run_distributed(_sharded_vs_reference, str(tmp_path), True)
    for rank, r in enumerate(results):
        assert r["old_diff"] == 0.0 and r["out_diff"] < 1e-5, (rank, r)
        assert r["held"] < 0.6 * r["total"]
    assert results[0]["keys"] > 0 and results[0]["max_diff"] == 0.0


def test_missing_tensor_and_wrong_shape_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_transformer().save_pretrained(tmp_path, safe_serialization=True)
    weights = load_file(tmp_path / sharded_load.SINGLE_NAME)
    name = "proj_out.weight"
    model, loader = sharded_load.meta_transformer(tmp_path, None, torch.float32, torch.device("cpu"), family=FLUX)
    save_file({k: v for k, v in weights.items() if k != name}, tmp_path / sharded_load.SINGLE_NAME)
    loader.source = sharded_load.SafetensorsSource(tmp_path)
    with pytest.raises(KeyError, match=name):
        loader(model.proj_out)
    weights[name] = torch.zeros(3, 3)
    save_file(weights, tmp_path / sharded_load.SINGLE_NAME)
    model, loader = sharded_load.meta_transformer(tmp_path, None, torch.float32, torch.device("cpu"), family=FLUX)
    with pytest.raises(ValueError, match="config.json does not match"):
        loader(model.proj_out)


def test_no_safetensors_and_wrong_strategy_fail_early(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "FluxTransformer2DModel"}))
    with pytest.raises(FileNotFoundError, match="fsdp_sharding_strategy none"):
        sharded_load.SafetensorsSource(tmp_path)
    assert sharded_load.uses_sharded_load("full", 2) and sharded_load.uses_sharded_load("hybrid", 16)
    assert not sharded_load.uses_sharded_load("none", 2) and not sharded_load.uses_sharded_load("full", 1)
    with pytest.raises(ValueError, match="needs an FSDP strategy"):
        fsdp.wrap_model(tiny_transformer(), "full", "cpu", param_init_fn=lambda m: None)
