"""--grad_sync per_step (issue #37 item 5): the gradients of an accumulation window are
reduce-scattered once, by its last backward (FSDP1's no_sync over the others). On 2 gloo ranks,
tiny FLUX, fp32: one set of reduce-scatters per optimizer step instead of one per term, the same
gradient norm and the same weights after the iteration (1e-6 relative), under FSDP1 and FSDP2
(--fsdp_version 2: set_requires_gradient_sync(False)); the memory model prices
the unsharded gradients and the trainer's choice refuses them where they would not fit."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import read_metrics, torchrun, train_args

# 4 samples per rank, micro-batch 1, 3 trained timesteps each (4 steps, fraction 1.0): 12 terms;
# accumulation 2: 2 optimizer steps per iteration
SHAPE = dict(sampling_steps=4, num_generations=4, train_batch_size=1, rollout_batch_size=4, train_micro_batch_size=1,
             timestep_fraction=1.0, gradient_accumulation_steps=2, max_train_steps=1, checkpointing_steps=1,
             save_images_every=0)
RUNS = {"per_microbatch": {}, "per_step": {"grad_sync": "per_step"},
        "per_step_all": {"grad_sync": "per_step", "update_timesteps_per_forward": "all"},
        "per_step_fsdp2": {"grad_sync": "per_step", "fsdp_version": 2}}  # set_requires_gradient_sync(False)


@pytest.fixture(scope="module")
def runs(tiny_flux_dir, tiny_embeddings, tmp_path_factory):
    out = {}
    for name, extra in RUNS.items():
        folder = tmp_path_factory.mktemp(name)
        proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, folder, **{**SHAPE, **extra}))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        out[name] = (read_metrics(folder)[-1], folder)
    return out


def _weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (path,) = list(folder.glob("checkpoint-1/diffusion_pytorch_model.safetensors"))
    return load_file(str(path))


@pytest.mark.parametrize("name", ["per_step", "per_step_all", "per_step_fsdp2"])
def test_one_reduce_scatter_set_per_optimizer_step_same_maths(runs, name):
    (base, base_dir), (run, run_dir) = runs["per_microbatch"], runs[name]
    assert base["optimizer_steps"] == run["optimizer_steps"] == 2
    units = base["comm/update/reduce_scatter_calls"] / 12  # one set (a call per FSDP unit) per term
    assert units == int(units) and units > 1
    assert run["comm/update/reduce_scatter_calls"] == 2 * units  # one set per optimizer step
    assert run["comm/update/reduce_scatter_bytes"] * 6 == pytest.approx(base["comm/update/reduce_scatter_bytes"],
                                                                         abs=8 * units)
    assert run["reward_mean"] == base["reward_mean"]  # the same rollout
    assert math.isclose(run["grad_norm"], base["grad_norm"], rel_tol=1e-6), (run["grad_norm"], base["grad_norm"])
    a, b = _weights(base_dir), _weights(run_dir)
    assert a.keys() == b.keys()
    diff = math.sqrt(sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a))
    norm = math.sqrt(sum(float(a[k].double().pow(2).sum()) for k in a))
    assert diff <= 1e-6 * norm, (diff, norm)
    print(f"{name}: reduce-scatter calls {run['comm/update/reduce_scatter_calls']} vs {base['comm/update/reduce_scatter_calls']}, "
          f"bytes {run['comm/update/reduce_scatter_bytes']} vs {base['comm/update/reduce_scatter_bytes']}; grad norm rel "
          f"{abs(run['grad_norm'] / base['grad_norm'] - 1):.2e}; weights rel {diff / norm:.2e}")


@pytest.mark.parametrize("name", list(RUNS))
def test_the_cost_model_predicts_the_reduce_scatters(runs, tiny_flux_dir, name):
    from test_comm_lean import _tiny_shape

    from fastvideo.perf.comms import CommShape, predicted_collectives

    record, _ = runs[name]
    s = CommShape(**_tiny_shape(tiny_flux_dir), samples_per_rank=4, rollout_batch=4, micro_batch=1, sampling_steps=4,
                  trained_steps=3, shards=2, timesteps_per_forward=3 if name.endswith("all") else 1,
                  reduce_per_step=2 if name.startswith("per_step") else 0)
    calls, nbytes = predicted_collectives(s)["update"]["reduce_scatter"]
    assert record["comm/update/reduce_scatter_calls"] == calls
    assert 0 <= record["comm/update/reduce_scatter_bytes"] - nbytes <= 4 * calls


def test_the_memory_model_prices_the_unsharded_gradients(tiny_flux_dir):
    from fastvideo.models.registry import get_model_family
    from fastvideo.perf.memory import MemoryShape, estimate, profile_model

    family = get_model_family("flux")
    tcfg = json.loads((tiny_flux_dir / "transformer" / "config.json").read_text())
    vcfg = json.loads((tiny_flux_dir / "vae" / "config.json").read_text())
    shape = MemoryShape(height=32, width=32, text_tokens=32, sampling_steps=4, samples_per_rank=4, rollout_batch=4,
                        micro_batch=1, world_size=2,
                        rewards=(), compute_dtype=torch.float32)
    prof = profile_model(tcfg, vcfg, shape, family=family)
    per_micro = estimate(tcfg, vcfg, shape, prof=prof, family=family)
    from dataclasses import replace

    per_step = estimate(tcfg, vcfg, replace(shape, grads_unsharded=True), prof=prof, family=family)
    assert per_step.phases["update"] - per_micro.phases["update"] == \
        (prof.params - prof.largest_block_params) * 4  # the whole model's fp32 gradients, not one block's
    assert per_step.phases["rollout"] == per_micro.phases["rollout"]


def test_the_trainer_refuses_per_step_where_it_does_not_fit(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    from dataclasses import replace

    from fastvideo import devices
    from fastvideo.config import parse_config
    from fastvideo.errors import ConfigError
    from fastvideo.models.registry import get_model_family
    from fastvideo.perf.memory import estimate
    from fastvideo.training import lean

    cfg = parse_config(train_args(tiny_embeddings, tiny_flux_dir, tmp_path, **{**SHAPE, "grad_sync": "per_step"}))
    tcfg = json.loads((tiny_flux_dir / "transformer" / "config.json").read_text())
    vcfg = json.loads((tiny_flux_dir / "vae" / "config.json").read_text())
    fam, cpu = get_model_family("flux"), torch.device("cpu")
    shape = lean.memory_shape(cfg, 2, cpu)
    assert shape.grads_unsharded
    with_grads = estimate(tcfg, vcfg, shape, family=fam).peak_bytes
    without = estimate(tcfg, vcfg, replace(shape, grads_unsharded=False), family=fam).peak_bytes
    assert with_grads > without
    monkeypatch.setattr(devices, "is_accelerator", lambda d: True)
    monkeypatch.setattr(lean, "HEADROOM", 1.0)
    monkeypatch.setattr(devices, "total_memory_bytes", lambda t: int(with_grads))
    c = lean.choose(cfg, 2, cpu, fam, tcfg, vcfg)
    assert "--grad_sync per_step: one gradient reduce-scatter per optimizer step" in c.notes[-1]
    monkeypatch.setattr(devices, "total_memory_bytes", lambda t: int(with_grads) - 1)
    with pytest.raises(ConfigError, match="--grad_sync per_step: with the whole unsharded gradients"):
        lean.choose(cfg, 2, cpu, fam, tcfg, vcfg)
