"""A communication-lean iteration (issue #37) on 2 gloo ranks, tiny FLUX at 32 px, 8 steps, 4
samples per rank, micro-batch 1, timestep fraction 1.0: the collective counter's figures in
metrics.jsonl equal the cost model's prediction (fastvideo.perf.comms), and the lean options
(--rollout_weights gathered, --update_timesteps_per_forward all) move at most a quarter of the
default's all-gather + reduce-scatter bytes with the same rewards and gradient norm."""

from __future__ import annotations

import json
import math

import pytest

from helpers import read_metrics, torchrun, train_args

SHAPE = dict(sampling_steps=8, num_generations=4, train_batch_size=1, rollout_batch_size=4, train_micro_batch_size=1,
             timestep_fraction=1.0, max_train_steps=1, checkpointing_steps=100, save_images_every=0)
LEAN = dict(rollout_weights="gathered", update_timesteps_per_forward="all")
FSDP2 = dict(fsdp_version=2)
RUNS = {"grpo": {}, "grpo_lean": LEAN, "nft": {"algorithm": "nft"}, "nft_lean": {"algorithm": "nft", **LEAN},
        "grpo_fsdp2": FSDP2, "grpo_fsdp2_lean": {**LEAN, **FSDP2},
        "nft_fsdp2": {"algorithm": "nft", **FSDP2}, "nft_fsdp2_lean": {"algorithm": "nft", **LEAN, **FSDP2}}


@pytest.fixture(scope="module")
def runs(tiny_flux_dir, tiny_embeddings, tmp_path_factory):
    out = {}
    for name, extra in RUNS.items():
        folder = tmp_path_factory.mktemp(name)
        proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, folder, **{**SHAPE, **extra}))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        out[name] = read_metrics(folder)[-1]
        resolved = json.loads((folder / "config.json").read_text())
        assert resolved.get("fsdp_version", 1) == extra.get("fsdp_version", 1), name
        wrapper = "FSDP2 (fully_shard), full sharding over 2 ranks, 3 units" if "fsdp2" in name else \
            "FSDP1 (FullyShardedDataParallel), full sharding over 2 ranks, 3 units"
        assert f"[parallel] {wrapper}" in proc.stdout, name  # the flag took effect
    return out


def _tiny_shape(tiny_flux_dir) -> dict:
    import torch

    from fastvideo.models.registry import get_model_family
    from fastvideo.perf.comms import shape_of_model

    family = get_model_family("flux")
    config = json.loads((tiny_flux_dir / "transformer" / "config.json").read_text())
    model = family.meta_transformer(config, torch.float32)
    return shape_of_model(model, family.blocks(model))


def _predicted(tiny_flux_dir, name: str) -> dict:
    from fastvideo.perf.comms import CommShape, predicted_collectives

    nft, lean = name.startswith("nft"), name.endswith("lean")
    trained = 8 if nft else 7  # NFT: int(8 * 1.0) timesteps; GRPO: the 7 candidates (the last step not trained)
    s = CommShape(**_tiny_shape(tiny_flux_dir), samples_per_rank=4, rollout_batch=4, micro_batch=1,
                  sampling_steps=8, trained_steps=trained, shards=2, nograd_update_forwards=int(nft),
                  rollout_swapped=nft, rollout_gathered=lean, timesteps_per_forward=trained if lean else 1)
    return predicted_collectives(s)


@pytest.mark.parametrize("name", list(RUNS))
def test_counter_equals_the_cost_model(runs, tiny_flux_dir, name):
    """Calls exactly; bytes up to FSDP's padding of each unit to a multiple of the 2 ranks (at most
    one float32 element per unit gathered or reduced, i.e. 4 bytes a call)."""
    record = runs[name]
    for phase, kinds in _predicted(tiny_flux_dir, name).items():
        for kind, (calls, nbytes) in kinds.items():
            got_calls = record.get(f"comm/{phase}/{kind}_calls", 0)
            got_bytes = record.get(f"comm/{phase}/{kind}_bytes", 0)
            assert got_calls == calls, (name, phase, kind, got_calls, calls)
            assert 0 <= got_bytes - nbytes <= 4 * calls, (name, phase, kind, got_bytes, nbytes)


def _fsdp_bytes(record: dict) -> int:
    return record["comm/total/all_gather_bytes"] + record["comm/total/reduce_scatter_bytes"]


@pytest.mark.parametrize("algorithm", ["grpo", "nft"])
def test_lean_options_move_a_quarter_of_the_bytes_with_the_same_maths(runs, algorithm):
    default, lean = runs[algorithm], runs[f"{algorithm}_lean"]
    assert _fsdp_bytes(lean) <= _fsdp_bytes(default) / 4, (_fsdp_bytes(lean), _fsdp_bytes(default))
    assert lean["reward_mean"] == default["reward_mean"] and lean["reward_std"] == default["reward_std"]
    assert math.isclose(lean["grad_norm"], default["grad_norm"], rel_tol=1e-5), (lean["grad_norm"],
                                                                                  default["grad_norm"])


@pytest.mark.parametrize("algorithm", ["grpo", "nft"])
@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_fsdp2_runs_the_same_maths_and_bytes(runs, algorithm, lean):
    """--fsdp_version 2 (fully_shard): the same rewards bit for bit and gradient norm (1e-5) as FSDP1's
    default run, and the same all-gather + reduce-scatter bytes as FSDP1 with the same options (up
    to padding: FSDP2 pads each parameter, FSDP1 each unit); lean, at most a quarter of the default."""
    fsdp1, default = runs[f"{algorithm}_lean" if lean else algorithm], runs[algorithm]
    fsdp2 = runs[f"{algorithm}_fsdp2_lean" if lean else f"{algorithm}_fsdp2"]
    assert fsdp2["reward_mean"] == default["reward_mean"] and fsdp2["reward_std"] == default["reward_std"]
    assert math.isclose(fsdp2["grad_norm"], default["grad_norm"], rel_tol=1e-5), (fsdp2["grad_norm"],
                                                                                   default["grad_norm"])
    assert fsdp2["comm/total/all_gather_calls"] == fsdp1["comm/total/all_gather_calls"]
    assert fsdp2["comm/total/reduce_scatter_calls"] == fsdp1["comm/total/reduce_scatter_calls"]
    assert math.isclose(_fsdp_bytes(fsdp2), _fsdp_bytes(fsdp1), rel_tol=0.01), (_fsdp_bytes(fsdp2), _fsdp_bytes(fsdp1))
    if lean:
        assert _fsdp_bytes(fsdp2) <= _fsdp_bytes(default) / 4
    print(f"{algorithm} {'lean' if lean else 'default'}: FSDP2 AG+RS {_fsdp_bytes(fsdp2)} B "
          f"({fsdp2['comm/total/all_gather_calls']} + {fsdp2['comm/total/reduce_scatter_calls']} calls), FSDP1 "
          f"{_fsdp_bytes(fsdp1)} B; grad norm rel {abs(fsdp2['grad_norm'] / default['grad_norm'] - 1):.1e}")
