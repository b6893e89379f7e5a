"""Rollout on the tiny FLUX: parity with diffusers' FluxPipeline, batching invariance,
seeded noise, init_same_noise, capture/replay, and no host synchronisation."""

import numpy as np
import pytest
import torch

from fastvideo.models import flux
from fastvideo.sampling.randomness import RandomSource
from fastvideo.models.flux import predict_velocity
from fastvideo.sampling.rollout import RolloutConfig, Trajectory
from fastvideo.sampling.sde import sde_step
from sampling_helpers import flux_rollout as rollout
from sampling_helpers import tiny_models

PROMPTS = ["a red cube on a table", "a cat", "two birds at dawn"]
SEQ = 32  # short T5 sequence keeps the tiny model fast; the code is length-agnostic


@pytest.fixture(scope="module")
def models(tiny_flux_dir):
    return tiny_models(tiny_flux_dir, PROMPTS, SEQ)


def _cfg(**kw):
    base = dict(height=64, width=64, sampling_steps=4, eta=0.3, shift=3.0, num_generations=4,
                rollout_batch_size=4, init_same_noise=False)
    base.update(kw)
    return RolloutConfig(**base)


def _run(models, cfg, prompts=(0, 1), group_ids=(0, 1), seed=1, iteration=0, rs=None, device="cpu", family=None):
    transformer, vae, embeds, pooled, text_ids = models
    idx = list(prompts)
    return rollout(transformer, vae, embeds[idx], pooled[idx], text_ids, [PROMPTS[i] for i in idx],
                   list(group_ids), cfg, rs or RandomSource(seed), iteration, device, family=family)


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_shapes_ids_and_ranges(models):
    traj = _run(models, _cfg(num_generations=3, rollout_batch_size=2), group_ids=(7, 2))
    assert isinstance(traj, Trajectory)
    assert traj.latents.shape == (6, 5, 16, 64) and traj.log_probs.shape == (6, 4)
    assert traj.sigmas.shape == (5,) and traj.images.shape == (6, 3, 64, 64)
    assert traj.cond["prompt_embeds"].shape == (6, SEQ, 32) and traj.cond["pooled"].shape == (6, 32)
    assert traj.cond["text_ids"].shape == (SEQ, 3) and traj.layout["image_ids"].shape == (16, 3)
    assert traj.sample_ids.tolist() == [21, 22, 23, 6, 7, 8]
    assert traj.group_ids.tolist() == [7, 7, 7, 2, 2, 2]
    assert traj.captions == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    assert traj.images.min() >= 0 and traj.images.max() <= 1
    assert torch.isfinite(traj.log_probs).all() and bool((traj.log_probs != 0).all())
    sub = traj.subset([4, 0])
    assert sub.sample_ids.tolist() == [7, 21] and torch.equal(sub.latents[1], traj.latents[0])


def test_eta_zero_matches_diffusers_flux_pipeline(models, tiny_flux_dir):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer, vae, embeds, pooled, text_ids = models
    shift, steps = 3.0, 6
    pipe = FluxPipeline.from_pretrained(tiny_flux_dir, transformer=transformer, vae=vae)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(
        pipe.scheduler.config, use_dynamic_shifting=False, shift=shift)
    pipe.set_progress_bar_config(disable=True)
    cfg = _cfg(eta=0.0, sampling_steps=steps, num_generations=2)
    traj = _run(models, cfg, family=flux.FluxFamily(quantize_timestep=False))
    theirs = pipe(prompt_embeds=traj.cond["prompt_embeds"], pooled_prompt_embeds=traj.cond["pooled"], height=64, width=64,
                  num_inference_steps=steps, sigmas=np.linspace(1.0, 1.0 / steps, steps),
                  latents=traj.latents[:, 0].clone(), guidance_scale=3.5, output_type="latent",
                  return_dict=False)[0]
    assert _rel(traj.latents[:, -1], theirs) < 1e-5
    # the comparison has teeth: the last step moves the latent by far more than the tolerance
    assert _rel(traj.latents[:, -2], theirs) > 1e-2
    # with eta = 0 the decoded image is the decode of the final latent (x0_hat at sigma = 0)
    torch.testing.assert_close(traj.images, flux.decode_latents(vae, traj.latents[:, -1], 8, 8))
    assert torch.equal(traj.log_probs, torch.zeros(4, steps))


def test_quantized_timestep_is_upstreams_floor(models):
    transformer, _, embeds, pooled, text_ids = models
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0))
    ids = flux.image_ids(8, 8)
    sig = torch.tensor([0.83751, 0.4129])
    args = (embeds[:2], pooled[:2], text_ids, ids)
    q = predict_velocity(transformer, x, sig, *args, quantize_timestep=True)
    manual = predict_velocity(transformer, x, torch.tensor([0.837, 0.412]), *args, quantize_timestep=False)
    exact = predict_velocity(transformer, x, sig, *args, quantize_timestep=False)
    torch.testing.assert_close(q, manual, rtol=0, atol=0)
    assert not torch.equal(q, exact)


def test_predict_velocity_batch_invariance_with_per_sample_sigmas(models):
    transformer, _, embeds, pooled, text_ids = models
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 16, 64, generator=g)
    sig = torch.tensor([0.9, 0.5, 0.31, 0.07])
    pe, po = embeds[[0, 1, 2, 0]], pooled[[0, 1, 2, 0]]
    ids = flux.image_ids(8, 8)
    batched = predict_velocity(transformer, x, sig, pe, po, text_ids, ids)
    single = torch.cat([predict_velocity(transformer, x[i : i + 1], sig[i : i + 1], pe[i : i + 1], po[i : i + 1],
                                         text_ids, ids) for i in range(4)])
    assert batched.dtype == torch.float32
    assert _rel(batched, single) < 1e-5
    assert _rel(single[0:1], predict_velocity(transformer, x[:1], 0.9, pe[:1], po[:1], text_ids, ids)) == 0


def test_rollout_batch_size_does_not_change_trajectories(models):
    one = _run(models, _cfg(rollout_batch_size=1))
    four = _run(models, _cfg(rollout_batch_size=4))
    three = _run(models, _cfg(rollout_batch_size=3))  # remainder chunk
    for other in (four, three):
        assert torch.equal(other.latents[:, 0], one.latents[:, 0])
        assert _rel(other.latents, one.latents) < 1e-5
        assert _rel(other.log_probs, one.log_probs) < 1e-5
        assert _rel(other.images, one.images) < 1e-5


def test_same_seed_same_images_other_seed_other_images(models):
    cfg = _cfg(num_generations=2)
    a, b, c = _run(models, cfg), _run(models, cfg), _run(models, cfg, seed=2)
    assert torch.equal(a.images, b.images) and torch.equal(a.latents, b.latents)
    assert not torch.allclose(a.images, c.images)


def test_noise_differs_across_prompts_samples_and_ranks(models):
    cfg = _cfg(num_generations=2)
    rank0 = _run(models, cfg, prompts=(0, 0), group_ids=(0, 1))  # same prompt, two groups
    rank1 = _run(models, cfg, prompts=(0, 0), group_ids=(2, 3))  # another rank's global ids
    init = torch.cat([rank0.latents[:, 0], rank1.latents[:, 0]]).flatten(1)
    assert torch.unique(init, dim=0).shape[0] == 8
    assert not torch.allclose(rank0.images, rank1.images)


def test_init_same_noise_rank_scope_shares_one_noise_over_the_whole_call(models):
    """Upstream DanceGRPO draws one noise before its per-sample loop: with train_batch_size 2 all
    2 x G samples of the rank start from it (whatever the chunking), step noise stays per sample."""
    cfg = _cfg(num_generations=3, init_same_noise=True, rollout_batch_size=2)
    assert cfg.same_noise_scope == "rank"
    traj = _run(models, cfg, prompts=(0, 1), group_ids=(4, 5))
    x0 = traj.latents[:, 0]
    assert all(torch.equal(x0[0], x0[i]) for i in range(6))
    assert torch.unique(traj.latents[:, 1].flatten(1), dim=0).shape[0] == 6
    # the shared noise is the first group's, so with one prompt per rank both scopes agree
    alone = _run(models, _cfg(num_generations=3, init_same_noise=True, same_noise_scope="prompt"),
                 prompts=(0,), group_ids=(4,))
    assert torch.equal(alone.latents[0, 0], x0[0])
    other_rank = _run(models, cfg, prompts=(0, 1), group_ids=(6, 7))
    assert not torch.allclose(other_rank.latents[0, 0], x0[0])


def test_same_noise_scope_is_checked():
    with pytest.raises(ValueError, match="same_noise_scope must be one of"):
        _cfg(init_same_noise=True, same_noise_scope="batch")


def test_init_same_noise_prompt_scope_shares_only_within_a_group(models):
    traj = _run(models, _cfg(num_generations=3, init_same_noise=True, rollout_batch_size=2,
                             same_noise_scope="prompt"),
                prompts=(0, 0), group_ids=(4, 5))
    x0, x1 = traj.latents[:, 0], traj.latents[:, 1]
    for g in range(2):
        rows = slice(3 * g, 3 * g + 3)
        assert all(torch.equal(x0[3 * g], x0[i]) for i in range(3 * g, 3 * g + 3))
        # step noise is per sample, so the group spreads out after the first step
        assert torch.unique(x1[rows].flatten(1), dim=0).shape[0] == 3
    assert not torch.allclose(x0[0], x0[3])


def test_capture_then_replay_with_another_seed_reproduces_exactly(models, tmp_path):
    cfg = _cfg(num_generations=2, rollout_batch_size=3)
    rs = RandomSource(11).capture(tmp_path / "rng", rank=0, world_size=1)
    captured = _run(models, cfg, rs=rs, iteration=3)
    rs.flush()
    assert (tmp_path / "rng" / "randomness_000003.safetensors").is_file()
    replay_cfg = _cfg(num_generations=2, rollout_batch_size=1)  # batching may differ on replay
    replayed = _run(models, replay_cfg, rs=RandomSource(12345).replay(tmp_path / "rng"), iteration=3)
    assert torch.equal(replayed.latents[:, 0], captured.latents[:, 0])
    assert _rel(replayed.latents, captured.latents) < 1e-5
    same_batching = _run(models, cfg, rs=RandomSource(12345).replay(tmp_path / "rng"), iteration=3)
    assert torch.equal(same_batching.latents, captured.latents)
    assert torch.equal(same_batching.log_probs, captured.log_probs)
    assert torch.equal(same_batching.images, captured.images)


def test_stored_transitions_rescore_to_ratio_one(models):
    """The update phase's first step: re-scoring stored transitions, mixed timesteps per batch."""
    transformer, *_ = models
    traj = _run(models, _cfg(num_generations=2))
    steps = torch.tensor([0, 3, 1, 2])
    rows = torch.arange(4)
    sig, sig_next = traj.sigmas[steps], traj.sigmas[steps + 1]
    x, x_next = traj.latents[rows, steps], traj.latents[rows, steps + 1]
    v = predict_velocity(transformer, x, sig, traj.cond["prompt_embeds"], traj.cond["pooled"], traj.cond["text_ids"], traj.layout["image_ids"])
    _, lp = sde_step(x, v, sig, sig_next, 0.3, prev_sample=x_next)
    ratio = torch.exp(lp - traj.log_probs[rows, steps])
    assert (ratio - 1).abs().max() < 1e-5


def test_images_decode_the_last_x0_prediction(models):
    transformer, vae, *_ = models
    traj = _run(models, _cfg(num_generations=2))
    x, sigma = traj.latents[:, -2], traj.sigmas[-2]
    v = predict_velocity(transformer, x, sigma, traj.cond["prompt_embeds"], traj.cond["pooled"], traj.cond["text_ids"], traj.layout["image_ids"])
    x0 = x - sigma * v
    torch.testing.assert_close(traj.images, flux.decode_latents(vae, x0, 8, 8), rtol=1e-5, atol=1e-5)
    # ... which is not the decode of the final SDE sample when eta > 0
    assert not torch.allclose(traj.images, flux.decode_latents(vae, traj.latents[:, -1], 8, 8), atol=1e-3)


def test_no_host_synchronisation_on_meta_device(models, tiny_flux_dir):
    """Meta tensors have no values: any .item(), bool() or .cpu() of one raises."""
    _, _, embeds, pooled, text_ids = models
    transformer = flux.load_transformer(tiny_flux_dir).to("meta")
    vae = flux.load_vae(tiny_flux_dir).to("meta")
    traj = rollout(transformer, vae, embeds[:2], pooled[:2], text_ids, PROMPTS[:2], [0, 1],
                   _cfg(rollout_batch_size=3), RandomSource(0), 0, "meta")
    assert traj.latents.device.type == "meta" and traj.latents.shape == (8, 5, 16, 64)


def test_bf16_autocast_runs_and_keeps_float32_state(models):
    transformer, vae, embeds, pooled, text_ids = models
    traj = rollout(transformer, vae, embeds[:1], pooled[:1], text_ids, PROMPTS[:1], [0],
                   _cfg(num_generations=2), RandomSource(0), 0, "cpu", autocast_dtype=torch.bfloat16)
    assert traj.latents.dtype == torch.float32 and traj.log_probs.dtype == torch.float32
    assert torch.isfinite(traj.latents).all() and torch.isfinite(traj.log_probs).all()


def test_bad_inputs_fail_early(models):
    with pytest.raises(ValueError, match="distinct"):
        _run(models, _cfg(), group_ids=(3, 3))
    with pytest.raises(ValueError, match="one global id per prompt"):
        _run(models, _cfg(), group_ids=(3,))
    with pytest.raises(ValueError, match="multiples of 16"):
        _cfg(height=72)
    with pytest.raises(ValueError, match="rollout_batch_size"):
        _cfg(rollout_batch_size=0)
    transformer, vae, embeds, pooled, text_ids = models
    with pytest.raises(ValueError, match="captions"):
        rollout(transformer, vae, embeds[:2], pooled[:2], text_ids, PROMPTS[:1], [0, 1], _cfg(),
                RandomSource(0), 0, "cpu")
