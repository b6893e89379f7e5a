"""--algorithm nft end to end on the tiny model: 2 gloo ranks under FSDP, full fine-tuning and LoRA
(the replicated-base layout, with the KL term), each resumed bit for bit from its first checkpoint,
the old policy's update checked on the saved files, and the 2-rank run against a one-process run of
the same global batch."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers import read_metrics, single_process_trainer, torchrun, train_args

from fastvideo.algorithms.nft_loss import decay_schedule
from fastvideo.training.checkpoint.files import read_weights

NFT = dict(algorithm="nft", save_images_every=0, checkpointing_steps=1, max_train_steps=2, sampling_steps=4,
           timestep_fraction=0.5, nft_beta=0.5)
# fp32: the old policy's gap at iteration 2 (0.001 of one step's adapter change) is below bf16's
# resolution, so under bf16 autocast v_old == v exactly and a swap that did nothing would pass
# unseen; the bf16 NFT path is tested in process (test_no_float64.py::test_nft_iteration_without_float64).
LORA = dict(use_lora=True, lora_rank=4, lora_alpha=8, kl_coef=0.1)


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _same_files(a, b, name):
    x, y = load_file(str(a / name)), load_file(str(b / name))
    assert x and set(x) == set(y), name
    bad = [k for k in x if not torch.equal(x[k], y[k])]
    assert not bad, f"{name}: resume is not exact for {bad[:3]}"
    return x


@pytest.fixture(scope="module")
def runs(tiny_flux_dir, tiny_embeddings, tmp_path_factory):
    root = tmp_path_factory.mktemp("nft")
    out = {}
    for name, extra in (("full", {}), ("lora", LORA)):
        straight, resumed = root / name, root / f"{name}_resumed"
        _ok(torchrun(train_args(tiny_embeddings, tiny_flux_dir, straight, **NFT, **extra)))
        _ok(torchrun(train_args(tiny_embeddings, tiny_flux_dir, resumed, **NFT, **extra,
                                resume_from_checkpoint=str(straight / "checkpoint-1"))))
        out[name] = (straight, resumed)
    # One process (this one: no launch) with the two ranks' prompts: 2 prompts x 2 samples, one
    # micro-batch of 4, one iteration.
    single = root / "single"
    argv = train_args(tiny_embeddings, tiny_flux_dir, single, **{**NFT, "max_train_steps": 1}, train_batch_size=2,
                      train_micro_batch_size=4)
    import fastvideo.training.trainer as trainer_module

    kept = []  # what the rollouts stored: NFT keeps x0, not the step latents

    original = trainer_module.rollout

    def recording_rollout(*args, **kwargs):
        traj = original(*args, **kwargs)
        kept.append(traj)
        return traj

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_module, "rollout", recording_rollout)
        single_process_trainer(argv, mp).train()
    out["single"] = single
    out["single_rollouts"] = kept
    return out


def _trained(ckpt, lora: bool) -> dict:
    """The checkpoint's trained weights in the model's names (the LoRA file holds diffusers' names,
    the old-policy file, like the EMA file, the in-model peft names)."""
    return {k: v.float() for k, v in read_weights(ckpt, lora=lora).items()}


def _lerp_error(before: dict, current: dict, after: dict, decay: float) -> float:
    """max |(decay * before + (1 - decay) * current) - after| over the old policy's tensors."""
    return max((before[k].lerp(current[k], 1.0 - decay) - v).abs().max().item() for k, v in after.items())


@pytest.mark.slow
@pytest.mark.parametrize("name, weights", [("full", "diffusion_pytorch_model.safetensors"),
                                           ("lora", "pytorch_lora_weights.safetensors")])
def test_nft_trains_two_ranks_and_resumes_exactly(runs, name, weights, tiny_flux_dir):
    straight, resumed = runs[name]
    rows, again = read_metrics(straight), read_metrics(resumed)
    assert [r["iteration"] for r in rows] == [1, 2] and [r["iteration"] for r in again] == [2]
    for key in ("reward_mean", "loss", "grad_norm", "nft_positive", "nft_negative", "old_deviate", "old_decay"):
        assert rows[1][key] == again[0][key], (key, rows[1][key], again[0][key])
    assert all(r["grad_norm"] == r["grad_norm"] and r["skipped_steps"] == 0 for r in rows)  # finite
    assert "ratio_mean" not in rows[0] and rows[0]["old_deviate"] == 0.0  # old == current before any step
    assert rows[0]["old_decay"] == pytest.approx(0.001)
    # old = 0.001 old + 0.999 current after iteration 1: a small but non-zero gap at iteration 2, so
    # the old weights were swapped into the forward (a swap doing nothing gives exactly 0)
    assert rows[1]["old_deviate"] > 0
    if name == "lora":  # the base (adapters off) is the initial policy: the old one is 1000x nearer v
        assert rows[1]["kl"] > 0 and rows[1]["old_deviate"] < 1e-3 * rows[1]["kl"]
    ckpt, ckpt_resumed = straight / "checkpoint-2", resumed / "checkpoint-2"
    _same_files(ckpt, ckpt_resumed, weights)
    _same_files(ckpt, ckpt_resumed, "old_policy.safetensors")
    lora = name == "lora"
    old = {k: v.float() for k, v in load_file(str(ckpt / "old_policy.safetensors")).items()}
    old_before = {k: v.float() for k, v in load_file(str(straight / "checkpoint-1" / "old_policy.safetensors")).items()}
    current = _trained(ckpt, lora)
    assert set(old) == set(current)  # the trained weights' names (the adapters under LoRA)
    # iteration 2 moved each old weight toward the current one with the schedule's decay of step 2
    # (0.002), not of step 1 and not by nothing: the trained tensors (adapters, under LoRA)
    step2, step1 = (_lerp_error(old_before, current, old, d) for d in (decay_schedule(2, 1), decay_schedule(1, 1)))
    assert step2 < 0.1 * step1
    assert any(not torch.equal(old[k], current[k]) for k in old)  # it lags the current one
    state = json.loads((ckpt / "extra_state.json").read_text())["tree"]["state"]["objective"]
    assert state["old_updates"] == 2


@pytest.mark.slow
def test_the_nft_rollout_keeps_no_step_latents(runs):
    """Objective.needs_trajectory / needs_log_probs False: the trainer's rollout stores each sample's x0
    only, and no log-probability; the logged trajectory_bytes is what it holds (no step latents, no
    log-probs: Trajectory.nbytes)."""
    trajs = runs["single_rollouts"]
    assert trajs and all(t.latents is None and t.log_probs is None and t.x0.shape[0] == 4 for t in trajs)
    counted = trajs[0].nbytes()
    assert counted["latents"] == counted["log_probs"] == 0 and counted["x0"] > 0 and counted["images"] > 0
    assert read_metrics(runs["single"])[0]["trajectory_bytes"] == sum(counted.values())


@pytest.mark.slow
def test_two_ranks_equal_one_process(runs):
    two, one = read_metrics(runs["full"][0]), read_metrics(runs["single"])
    for key in ("reward_mean", "loss", "grad_norm", "nft_positive", "nft_negative"):
        assert one[0][key] == pytest.approx(two[0][key], rel=1e-4, abs=1e-6), key
    a = load_file(str(runs["full"][0] / "checkpoint-1" / "old_policy.safetensors"))
    b = load_file(str(runs["single"] / "checkpoint-1" / "old_policy.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-5)
