"""The trainer with --checkpoint_format sharded on 2 gloo ranks: 2 iterations straight equal 1 +
resume from the straight run's checkpoint-1 + 1, bit for bit (weights or adapters, every shard:
AdamW state and EMA, the scheduler, the metrics). Full fine-tuning under FSDP full sharding;
LoRA under DDP, whose replicas write one shard file between them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers import read_metrics, torchrun, train_args


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _tensors_equal(a, b, what):
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta and ta.keys() == tb.keys(), what
    assert all(torch.equal(ta[k], tb[k]) for k in ta), f"{what}: the resumed run differs"


def _straight_and_resumed(tiny_embeddings, tiny_flux_dir, tmp_path, **flags):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = dict(checkpointing_steps=1, save_images_every=0, use_ema=True, ema_decay=0.9, use_group=None,
                  checkpoint_format="sharded", **flags)
    _ok(torchrun(train_args(tiny_embeddings, tiny_flux_dir, straight, max_train_steps=2, **common)))
    _ok(torchrun(train_args(tiny_embeddings, tiny_flux_dir, split, max_train_steps=2,
                            resume_from_checkpoint=str(straight / "checkpoint-1"), **common)))
    return straight / "checkpoint-2", split / "checkpoint-2", read_metrics(straight), read_metrics(split)


def _same_checkpoints(a, b, weights_file, files):
    index = json.loads((a / "shards.json").read_text())
    assert [s["file"] for s in index["shards"]] == files and index["sets"] == ["ema"]
    assert index["optimizer"]["scalars"][0]["step"] == 2.0
    _tensors_equal(a / weights_file, b / weights_file, weights_file)
    for f in files:
        _tensors_equal(a / f, b / f, f)
    for name in ("scheduler.json", "ema.json"):
        assert (a / name).read_text() == (b / name).read_text(), name
    assert not (a / "optimizer.safetensors").exists() and not (a / "ema.safetensors").exists()


@pytest.mark.slow
def test_full_fine_tuning_resumes_exactly_from_a_sharded_checkpoint(tiny_flux_dir, tiny_embeddings, tmp_path):
    a, b, ma, mb = _straight_and_resumed(tiny_embeddings, tiny_flux_dir, tmp_path)
    _same_checkpoints(a, b, "diffusion_pytorch_model.safetensors",
                      ["shards/rank-00000.safetensors", "shards/rank-00001.safetensors"])
    assert [r["reward_mean"] for r in ma[1:]] == [r["reward_mean"] for r in mb] and [r["iteration"] for r in mb] == [2]


@pytest.mark.slow
def test_lora_under_ddp_resumes_exactly_from_a_sharded_checkpoint(tiny_flux_dir, tiny_embeddings, tmp_path):
    a, b, ma, mb = _straight_and_resumed(tiny_embeddings, tiny_flux_dir, tmp_path, use_lora=True, lora_rank=4,
                                         lora_alpha=8, fsdp_sharding_strategy="none")
    _same_checkpoints(a, b, "pytorch_lora_weights.safetensors", ["shards/rank-00000.safetensors"])
    names = json.loads((a / "shards.json").read_text())["tensors"]
    assert all(".lora_A.default." in n or ".lora_B.default." in n for t in names for n in t["names"])
    assert [r["reward_mean"] for r in ma[1:]] == [r["reward_mean"] for r in mb] and [r["iteration"] for r in mb] == [2]
