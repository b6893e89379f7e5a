"""Checkpoint folders as upstream DanceGRPO writes them (a diffusers transformer folder), the older
layout still resuming, and the sha256 digests of COMPLETE.json: a flipped bit is found, 'latest'
skips the damaged checkpoint with a warning naming the file, an explicit one is refused."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from test_checkpoint import _plain_state, _save, assert_tree_equal, snapshot, train_step, training_state

from fastvideo.training import checkpoint
from fastvideo.training.checkpoint import Checkpointer, CheckpointError, DamagedCheckpointWarning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import flip_bit, to_old_layout, train_args  # noqa: E402

MODEL = "diffusion_pytorch_model.safetensors"


def _trainer_config(model) -> dict:
    """The transformer config the trainer hands the checkpointer (builders.build_models)."""
    return {**{k: v for k, v in dict(model.config).items() if not k.startswith("_")},
            "_class_name": type(model).__name__}


def test_a_checkpoint_is_a_diffusers_transformer_folder(tmp_path, tiny_flux_dir):
    """FluxTransformer2DModel.from_pretrained(OUTPUT_DIR/checkpoint-N) loads the trained weights,
    as upstream's checkpoints do (diffusion_pytorch_model.safetensors + config.json)."""
    from diffusers import FluxTransformer2DModel

    from fastvideo.models import flux

    model = flux.load_transformer(tiny_flux_dir)
    state = training_state(model)
    for seed in (1, 2):  # (the first step is at warm-up's learning rate 0)
        train_step(model, *state, seed=seed)
    path = Checkpointer(tmp_path).save(2, model=model, optimizer=state[0], transformer_config=_trainer_config(model))
    config = json.loads((path / "config.json").read_text())
    assert config["_class_name"] == "FluxTransformer2DModel" and "_diffusers_version" in config
    loaded = FluxTransformer2DModel.from_pretrained(path).state_dict()
    trained = model.state_dict()
    assert set(loaded) == set(trained)
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)
    base = flux.load_transformer(tiny_flux_dir).state_dict()
    assert not torch.equal(loaded["proj_out.weight"], base["proj_out.weight"])  # the trained weights, not the base


def test_a_checkpoint_of_the_older_layout_resumes_exactly(tmp_path):
    """model.safetensors + transformer_config.json, a marker without digests: resume and export."""
    from diffusers import FluxTransformer2DModel

    from fastvideo.training import export

    state = _plain_state()
    train_step(*state, seed=1)
    path = _save(Checkpointer(tmp_path), 1, state)
    saved = snapshot(*state)
    to_old_layout(path)
    assert (path / "model.safetensors").is_file() and not (path / MODEL).exists()
    assert "sha256" not in json.loads((path / checkpoint.MARKER).read_text())
    fresh = _plain_state(seed=1)
    extra = Checkpointer(tmp_path).load("latest", model=fresh[0], optimizer=fresh[1], lr_scheduler=fresh[2],
                                        ema=fresh[3])
    assert extra["iteration"] == 1
    assert_tree_equal(snapshot(*fresh), saved, "resumed from the older layout")
    out = export.export_checkpoint(path, tmp_path / "exported")
    loaded = FluxTransformer2DModel.from_pretrained(out).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in saved["model"].items())


def _two_checkpoints(tmp_path):
    ckpt = Checkpointer(tmp_path)
    state = _plain_state()
    train_step(*state, seed=1)
    _save(ckpt, 1, state)
    at_one = snapshot(*state)
    train_step(*state, seed=2)
    _save(ckpt, 2, state)
    return ckpt, at_one


def test_a_flipped_bit_is_found_and_latest_falls_back(tmp_path):
    ckpt, at_one = _two_checkpoints(tmp_path)
    marker = json.loads((tmp_path / "checkpoint-2" / checkpoint.MARKER).read_text())
    assert set(marker["sha256"]) == set(marker["files"]) and MODEL in marker["sha256"]
    assert marker["sha256"][MODEL] == checkpoint.file_digest(tmp_path / "checkpoint-2" / MODEL)
    flip_bit(tmp_path / "checkpoint-2" / MODEL)  # same size: the old size check passed it

    fresh = _plain_state(seed=1)
    parts = dict(model=fresh[0], optimizer=fresh[1], lr_scheduler=fresh[2], ema=fresh[3])
    with pytest.warns(DamagedCheckpointWarning, match=rf"checkpoint-2' is damaged: {MODEL} does not match its sha256"):
        extra = ckpt.load("latest", **parts)
    assert extra["iteration"] == 1
    assert_tree_equal(snapshot(*fresh), at_one, "resumed from the previous checkpoint")
    with pytest.raises(CheckpointError, match=rf"checkpoint-2' is damaged: {MODEL} does not match"):
        ckpt.load(str(tmp_path / "checkpoint-2"), **parts)

    # A folder verified once is not hashed again while unchanged, but a later change is seen.
    ckpt.load(str(tmp_path / "checkpoint-1"), model=fresh[0])
    time.sleep(0.05)  # a later modification time than the verification's
    flip_bit(tmp_path / "checkpoint-1" / "optimizer.safetensors")
    with pytest.raises(CheckpointError, match="optimizer.safetensors does not match"):
        ckpt.load(str(tmp_path / "checkpoint-1"), **parts)
    with pytest.warns(DamagedCheckpointWarning), pytest.raises(CheckpointError, match="every checkpoint .* is damaged"):
        ckpt.load("latest", model=fresh[0])

    # A marker without digests (checkpoints written before them): sizes only, as then.
    marker = tmp_path / "checkpoint-2" / checkpoint.MARKER
    old = json.loads(marker.read_text())
    del old["sha256"]
    marker.write_text(json.dumps(old))
    assert ckpt.load(str(tmp_path / "checkpoint-2"), model=fresh[0])["iteration"] == 2


@pytest.mark.slow
def test_training_resumes_past_a_damaged_latest_checkpoint(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    """A bit flip in the latest checkpoint's model file: --resume_from_checkpoint latest warns naming the
    file, resumes from the checkpoint before it, and (resume being exact) rewrites the damaged one
    with the bytes the uninterrupted run wrote."""
    from safetensors.torch import load_file

    from fastvideo.train_grpo_flux import main

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    out = tmp_path / "run"
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=2, checkpointing_steps=1,
                      save_images_every=0, fsdp_sharding_strategy="none")
    assert main(argv) == 0
    uninterrupted = {k: v.clone() for k, v in load_file(str(out / "checkpoint-2" / MODEL)).items()}  # not the mmap
    flip_bit(out / "checkpoint-2" / MODEL, offset_from_end=7)
    with pytest.warns(DamagedCheckpointWarning, match=rf"checkpoint-2' is damaged: {MODEL}"):
        assert main([*argv, "--resume_from_checkpoint", "latest"]) == 0
    resumed = load_file(str(out / "checkpoint-2" / MODEL))
    assert set(resumed) == set(uninterrupted) and all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)
    checkpoint.verify_checkpoint(out / "checkpoint-2")


def _rewrite_marker(path, **drop):
    marker = path / checkpoint.MARKER
    old = json.loads(marker.read_text())
    marker.write_text(json.dumps({k: v for k, v in old.items() if k not in drop}))
    return old


def test_a_marker_without_digests_still_catches_a_truncated_file(tmp_path):
    """Issue #39 test 25: COMPLETE.json as written before digests (sizes only): a file cut short is refused
    when named, skipped by 'latest' with a warning naming it."""
    ckpt, at_one = _two_checkpoints(tmp_path)
    path = tmp_path / "checkpoint-2"
    old = _rewrite_marker(path, sha256=True)
    victim = path / "optimizer.safetensors"
    victim.write_bytes(victim.read_bytes()[:-1])
    assert victim.stat().st_size == old["files"]["optimizer.safetensors"] - 1
    fresh = _plain_state(seed=1)
    parts = dict(model=fresh[0], optimizer=fresh[1], lr_scheduler=fresh[2], ema=fresh[3])
    with pytest.raises(CheckpointError, match="checkpoint-2' is damaged: optimizer.safetensors is missing or has the "
                                              "wrong size"):
        ckpt.load(str(path), **parts)
    with pytest.warns(DamagedCheckpointWarning, match="optimizer.safetensors is missing or has the wrong size"):
        assert ckpt.load("latest", **parts)["iteration"] == 1
    assert_tree_equal(snapshot(*fresh), at_one, "resumed from the checkpoint before the truncated one")


def test_a_marker_without_a_file_list_is_not_complete(tmp_path):
    """Issue #39 test 25: a COMPLETE.json without its file list is not a complete checkpoint: 'latest' passes
    over it (to checkpoint-1) and, named, it is refused."""
    ckpt, at_one = _two_checkpoints(tmp_path)
    path = tmp_path / "checkpoint-2"
    _rewrite_marker(path, files=True, sha256=True)
    assert not checkpoint.is_complete(path)
    assert checkpoint.find_latest(tmp_path) == tmp_path / "checkpoint-1"
    fresh = _plain_state(seed=1)
    parts = dict(model=fresh[0], optimizer=fresh[1], lr_scheduler=fresh[2], ema=fresh[3])
    assert ckpt.load("latest", **parts)["iteration"] == 1
    assert_tree_equal(snapshot(*fresh), at_one, "resumed from the checkpoint with a file list")
    with pytest.raises(CheckpointError, match="checkpoint-2' is not a complete checkpoint: its COMPLETE.json lists no "
                                              "files"):
        ckpt.load(str(path), **parts)
