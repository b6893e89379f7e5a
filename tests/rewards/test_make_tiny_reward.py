"""make_tiny_reward writes the real file layouts, reproducibly, and small."""

import json
import runpy
import sys

import torch
from safetensors.torch import load_file

from fastvideo.tools.make_tiny_reward import TINY_HPS_CONFIG, TINY_HPS_MODEL_NAME, make_tiny_reward


def _tensors(folder):
    base = torch.load(folder / "hps_ckpt" / "open_clip_pytorch_model.bin", weights_only=True)
    hps = torch.load(folder / "hps_ckpt" / "HPS_v2.1_compressed.pt", weights_only=True)
    pick = load_file(folder / "pickscore" / "model.safetensors")
    return base, hps, pick


def test_layout_and_size(tiny_rewards):
    root = tiny_rewards.hps_ckpt_dir.parent
    hps = tiny_rewards.hps_ckpt_dir
    assert {p.name for p in hps.iterdir()} == {
        "open_clip_pytorch_model.bin", "HPS_v2.1_compressed.pt", f"{TINY_HPS_MODEL_NAME}.json"}
    assert json.loads((hps / f"{TINY_HPS_MODEL_NAME}.json").read_text()) == TINY_HPS_CONFIG
    for name in ("config.json", "model.safetensors", "preprocessor_config.json", "vocab.json",
                 "merges.txt", "tokenizer_config.json"):
        assert (tiny_rewards.pickscore_dir / name).is_file(), name
    _, ckpt, _ = _tensors(root)
    assert set(ckpt) == {"state_dict"}
    floats = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    assert all(v.dtype == torch.float16 for v in floats)
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert total < 10e6, total


def test_aesthetic_and_image_reward_layouts(tiny_rewards):
    aes, ir = tiny_rewards.aesthetic_dir, tiny_rewards.image_reward_dir
    assert {p.name for p in aes.iterdir()} == {
        "open_clip_pytorch_model.bin", "sac+logos+ava1-l14-linearMSE.pth", f"{tiny_rewards.aesthetic_clip_name}.json"}
    mlp = torch.load(aes / "sac+logos+ava1-l14-linearMSE.pth", weights_only=True)
    assert sorted(mlp) == sorted(f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias"))
    assert {"ImageReward.pt", "med_config.json", "vocab.txt"} <= {p.name for p in ir.iterdir()}
    sd = torch.load(ir / "ImageReward.pt", weights_only=True)
    prefixes = {k.split(".")[0] + "." + k.split(".")[1] for k in sd if k.startswith("blip.")}
    assert prefixes == {"blip.visual_encoder", "blip.text_encoder", "blip.vision_proj", "blip.text_proj"}
    assert "blip.visual_encoder.blocks.1.attn.qkv.weight" in sd and "mlp.layers.7.bias" in sd
    config = json.loads((ir / "med_config.json").read_text())
    assert config["add_cross_attention"] and config["vocab_size"] == len((ir / "vocab.txt").read_text().split()) + 2


def test_vocab_is_byte_level_with_specials(tiny_rewards):
    vocab = json.loads((tiny_rewards.pickscore_dir / "vocab.json").read_text())
    assert len(vocab) == 256 * 2 + 2
    assert vocab["<|startoftext|>"] == 512 and vocab["<|endoftext|>"] == 513
    assert "a</w>" in vocab and "a" in vocab


def test_same_seed_same_weights(tiny_rewards, tmp_path):
    root = tiny_rewards.hps_ckpt_dir.parent  # built with seed 0
    make_tiny_reward(tmp_path / "again", seed=0)
    make_tiny_reward(tmp_path / "other", seed=1)
    for ref, same, other in zip(_tensors(root), _tensors(tmp_path / "again"),
                                _tensors(tmp_path / "other")):
        ref = ref.get("state_dict", ref)
        same = same.get("state_dict", same)
        other = other.get("state_dict", other)
        assert all(torch.equal(ref[k], same[k]) for k in ref)
        assert any(not torch.equal(ref[k], other[k]) for k in ref if ref[k].is_floating_point())


def test_cli_module_entry(tmp_path, monkeypatch, capsys):
    """`python -m fastvideo.tools.make_tiny_reward OUT --seed 3`, run in-process (no new
    interpreter: the imports would cost more than the rest of this file)."""
    out = tmp_path / "t"
    monkeypatch.setattr(sys, "argv", ["make_tiny_reward", str(out), "--seed", "3"])
    # runpy warns when the module is already imported (it is, by this file): run a fresh copy
    monkeypatch.delitem(sys.modules, "fastvideo.tools.make_tiny_reward", raising=False)
    runpy.run_module("fastvideo.tools.make_tiny_reward", run_name="__main__")
    assert "model_name=flux-grpo-tiny-hps" in capsys.readouterr().out
    assert (out / "hps_ckpt" / "HPS_v2.1_compressed.pt").is_file()
    assert (out / "pickscore" / "model.safetensors").is_file()
