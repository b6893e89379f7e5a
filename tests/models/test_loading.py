"""A transformer folder whose config.json and weights disagree is one CheckpointError on both library
lines (diffusers 0.42 loads a config needing more weights than the files hold, leaving those
parameters on the meta device); a folder that agrees loads the weights it holds."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from fastvideo.errors import CheckpointError
from fastvideo.models import flux
from fastvideo.models.registry import get_model_family
from fastvideo.models.loading import from_pretrained_checked


def _copy_with(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    return dst


def _weights(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_more_blocks_in_the_config_than_in_the_weights(tiny_flux_dir, tmp_path):
    root = tmp_path / "model"
    shutil.copytree(tiny_flux_dir, root)
    config = json.loads((root / "transformer" / "config.json").read_text())
    (root / "transformer" / "config.json").write_text(json.dumps({**config, "num_layers": config["num_layers"] + 1}))
    with pytest.raises(CheckpointError, match=r"transformer: its config.json and weights disagree .*one download"):
        get_model_family("flux").load_transformer(root, "transformer", "cpu", torch.float32)


def test_sd3_weights_without_a_parameter_of_the_config(tiny_sd3_dir, tmp_path):
    root = tmp_path / "model"
    shutil.copytree(tiny_sd3_dir, root)
    (file,) = (root / "transformer").glob("*.safetensors")
    weights = load_file(file)
    del weights["transformer_blocks.0.attn.norm_q.weight"]
    save_file(weights, file)
    with pytest.raises(CheckpointError, match=r"transformer: its config.json and weights disagree .*one download"):
        get_model_family("sd3").load_transformer(root, "transformer", "cpu", torch.float32)


def test_a_shape_that_differs_and_a_checkpoint_folder(tiny_flux_dir, tmp_path):
    src = tiny_flux_dir / "transformer"
    config = json.loads((src / "config.json").read_text())
    wider = _copy_with(src, tmp_path / "wider", joint_attention_dim=config["joint_attention_dim"] * 2)
    with pytest.raises(CheckpointError, match="wider: its config.json and weights disagree"):
        from_pretrained_checked(flux.FluxFamily().transformer_class(), wider)
    deeper = _copy_with(src, tmp_path / "checkpoint-2", num_single_layers=config["num_single_layers"] + 1)
    with pytest.raises(CheckpointError, match="checkpoint-2: its config.json and weights disagree"):
        flux.FluxFamily().load_transformer(deeper, None, "cpu", torch.float32)


def test_an_agreeing_folder_loads_its_weights_and_unused_weights_are_left(tiny_flux_dir, tmp_path):
    src = tiny_flux_dir / "transformer"
    model = flux.FluxFamily().load_transformer(src, None, "cpu", torch.float32)
    saved = _weights(src)
    state = model.state_dict()
    assert set(state) == set(saved) and all(torch.equal(state[k], saved[k]) for k in saved)
    config = json.loads((src / "config.json").read_text())
    shallower = _copy_with(src, tmp_path / "shallower", num_single_layers=config["num_single_layers"] - 1)
    model = from_pretrained_checked(flux.FluxFamily().transformer_class(), shallower)
    assert not any(p.is_meta for p in model.parameters()) and len(model.single_transformer_blocks) == 0
