"""training/lean.py: --rollout_weights auto and --update_timesteps_per_forward all resolved by the
memory model (fastvideo.perf.memory) against one device's memory."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from helpers import train_args

from fastvideo import devices
from fastvideo.config import parse_config
from fastvideo.errors import ConfigError
from fastvideo.models.registry import get_model_family
from fastvideo.perf.memory import estimate
from fastvideo.training import lean

CPU = torch.device("cpu")


@pytest.fixture
def setup(tiny_flux_dir, tiny_embeddings, tmp_path):
    def make(**flags):
        cfg = parse_config(train_args(tiny_embeddings, tiny_flux_dir, tmp_path, sampling_steps=8, timestep_fraction=1.0,
                                      train_micro_batch_size=1, **flags))
        return cfg, json.loads((tiny_flux_dir / "transformer" / "config.json").read_text()), \
            json.loads((tiny_flux_dir / "vae" / "config.json").read_text())
    return make


def _peak(cfg, tcfg, vcfg, **fields) -> int:
    shape = replace(lean.memory_shape(cfg, 2, CPU), **fields)
    return estimate(tcfg, vcfg, shape, family=get_model_family("flux")).peak_bytes


def _device_of(monkeypatch, total_bytes: float) -> None:
    monkeypatch.setattr(devices, "is_accelerator", lambda d: True)
    monkeypatch.setattr(lean, "HEADROOM", 1.0)
    monkeypatch.setattr(devices, "total_memory_bytes", lambda t: int(total_bytes))


def test_cpu_auto_is_gathered_and_said(setup):
    cfg, tcfg, vcfg = setup(rollout_weights="auto", update_timesteps_per_forward="all")
    c = lean.choose(cfg, 2, CPU, get_model_family("flux"), tcfg, vcfg)
    assert c.gathered and c.timesteps == 7 and "auto: gathered" in c.notes[0]
    cfg, *_ = setup()
    assert lean.choose(cfg, 2, CPU, get_model_family("flux"), tcfg, vcfg) == lean.LeanChoice(False, 1, [])


def test_auto_follows_the_memory_model(setup, monkeypatch):
    # a rollout of 32 samples at once (the rollout phase is the peak) of the tiny FLUX's shape with 10
    # blocks (the memory model runs it on the meta device): the gathered copy (10 blocks) raises the
    # peak over the sharded rollout's units in flight (2 blocks + the root)
    cfg, tcfg, vcfg = setup(rollout_weights="auto", num_generations=32, rollout_batch_size=32)
    tcfg = {**tcfg, "num_layers": 4, "num_single_layers": 6}
    sharded, gathered = _peak(cfg, tcfg, vcfg), _peak(cfg, tcfg, vcfg, rollout_gathered=True)
    assert gathered > sharded  # the gathered copy is priced
    fam = get_model_family("flux")
    _device_of(monkeypatch, gathered)
    c = lean.choose(cfg, 2, CPU, fam, tcfg, vcfg)
    assert c.gathered and "auto: gathered" in c.notes[0]
    _device_of(monkeypatch, gathered - 1)
    c = lean.choose(cfg, 2, CPU, fam, tcfg, vcfg)
    assert not c.gathered and "auto: sharded" in c.notes[0]


def test_all_is_reduced_and_an_explicit_k_refused_where_it_does_not_fit(setup, monkeypatch):
    cfg, tcfg, vcfg = setup(update_timesteps_per_forward="all")
    fam = get_model_family("flux")
    seven, three = _peak(cfg, tcfg, vcfg, timesteps_per_forward=7), _peak(cfg, tcfg, vcfg, timesteps_per_forward=3)
    assert seven > three  # K timesteps of activations are priced
    _device_of(monkeypatch, three)
    c = lean.choose(cfg, 2, CPU, fam, tcfg, vcfg)
    assert c.timesteps == 3 and "all: 7 timesteps per forward would peak" in c.notes[0]
    cfg4, *_ = setup(update_timesteps_per_forward="7")
    with pytest.raises(ConfigError, match="--update_timesteps_per_forward 7: the memory model's peak"):
        lean.choose(cfg4, 2, CPU, fam, tcfg, vcfg)


def test_a_family_without_a_cost_model_is_not_checked_and_said(setup, monkeypatch):
    cfg, tcfg, vcfg = setup(rollout_weights="auto", update_timesteps_per_forward="all")
    _device_of(monkeypatch, 1.0)  # a device of 1 byte: any check would refuse
    c = lean.choose(cfg, 2, CPU, object(), tcfg, vcfg)
    assert not c.gathered and c.timesteps == 7 and "not checked" in c.notes[0]


# The device's own fields: the cost model counts an NPU's communicators and HCCL buffers; the trainer's
# shape is checked against the device it runs on (the CPU here has neither).
DEVICE_FIELDS = {"communicators", "hccl_buffsize_mb"}


@pytest.mark.parametrize("flags", [
    {},
    {"master_weight_type": "bf16", "use_ema": True, "fsdp_param_dtype": "bf16", "mixed_precision": "bf16",
     "gradient_accumulation_steps": 2, "gradient_checkpointing": True, "selective_checkpointing": 0.5},
    {"grad_sync": "per_step", "rewards": "compressibility:1.0,hpsv2:0.5", "num_generations": 4, "train_batch_size": 2},
    {"algorithm": "nft"},
    {"algorithm": "awm", "awm_ema_kl_beta": 0.1, "kl_coef": 0.1},  # its EMA copy, no log-probs (test_memory)
    {"algorithm": "dgpo", "use_lora": True, "lora_rank": 4},
    {"kl_coef": 0.1, "rollout_weights": "gathered", "update_timesteps_per_forward": "all"},
    {"use_lora": True, "lora_rank": 8, "lora_base_precision": "bf16", "lora_target_modules": "to_q,to_v"},
    {"use_lora": True, "lora_rank": 4, "use_cpu_offload": True, "master_weight_type": "bf16"},
])
def test_the_trainer_prices_the_run_the_cost_model_prices(flags, tmp_path):
    """lean.memory_shape(config) equals tools/cost_model's --memory shape of the same command line, field by
    field (a field the trainer forgot, e.g. NFT's x0-only rollout, would make auto choose on another peak)."""
    import dataclasses

    from fastvideo.tools import cost_model, cost_model_memory

    argv = train_args(tmp_path / "e.json", tmp_path / "m", tmp_path, **flags)
    argv += [] if flags.get("gradient_checkpointing") else ["--no-gradient_checkpointing"]
    cfg = parse_config([a for a in argv if a != "--no-gradient_checkpointing"])
    ours = lean.memory_shape(cfg, 2, CPU)
    theirs = cost_model_memory.memory_shape(cost_model.parse_args(argv + ["--world_size", "2", "--memory"]))
    # the cost model's shape is the trainer's before K is resolved: set K and the gathered rollout as the flags say
    theirs = replace(theirs, timesteps_per_forward=ours.timesteps_per_forward, rollout_gathered=ours.rollout_gathered)
    differ = {f.name: (getattr(ours, f.name), getattr(theirs, f.name)) for f in dataclasses.fields(ours)
              if f.name not in DEVICE_FIELDS and getattr(ours, f.name) != getattr(theirs, f.name)}
    assert differ == {}


def test_the_peak_must_fit_ninety_percent_of_the_device(setup, monkeypatch):
    """HEADROOM: the model's peak may use 90% of a device's memory (the framework's own is not modelled)."""
    cfg, tcfg, vcfg = setup(rollout_weights="auto", num_generations=32, rollout_batch_size=32)
    tcfg = {**tcfg, "num_layers": 4, "num_single_layers": 6}
    gathered = _peak(cfg, tcfg, vcfg, rollout_gathered=True)
    monkeypatch.setattr(devices, "is_accelerator", lambda d: True)
    fam = get_model_family("flux")
    for total, fits in ((gathered, False), (int(gathered / 0.9) + 2, True), (int(gathered / 0.9) - 2, False)):
        monkeypatch.setattr(devices, "total_memory_bytes", lambda t, total=total: total)
        c = lean.choose(cfg, 2, CPU, fam, tcfg, vcfg)
        assert c.gathered is fits, (total, gathered)
        assert f"of {0.9 * total / 1e9:.1f} GB usable" in c.notes[0]
    # at a real device's size the start-up line names the usable share: 90 of 100 GB
    monkeypatch.setattr(devices, "total_memory_bytes", lambda t: 100e9)
    monkeypatch.setattr(lean, "_fits", lambda shape, t, v, family, limit: (12e9 <= limit, 12e9))
    c = lean.choose(cfg, 2, CPU, fam, tcfg, vcfg)
    assert c.notes[0].endswith("(the memory model's peak with the weights gathered: 12.0 GB of 90.0 GB usable)")
