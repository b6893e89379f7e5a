"""FLUX.1-schnell-shaped folders (no guidance embedding, guidance_embeds False) load, sample as
diffusers' FluxPipeline does and train; FLUX.1-Krea-dev has FLUX.1-dev's architecture (guidance
embedding) and loads as dev does."""

from __future__ import annotations

import json

import torch

from fastvideo.models import flux
from fastvideo.models.base import TensorConditioning
from fastvideo.sampling.plan import ode_plan
from fastvideo.sampling.randomness import RandomSource
from fastvideo.sampling.rollout import RolloutConfig, rollout


def test_schnell_ode_rollout_equals_flux_pipeline(tiny_schnell_dir):
    """4 Euler steps on schnell's schedule (shift 1: sigmas 1, 3/4, 1/2, 1/4, as FluxPipeline's
    default linspace(1, 1/N, N)); the pipeline gives the transformer no guidance. Tolerance 1e-5:
    the pipeline passes timestep (1000 sigma) / 1000, one rounding away from sigma."""
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_schnell_dir)
    pipe.set_progress_bar_config(disable=True)
    transformer = flux.load_transformer(tiny_schnell_dir)
    assert not transformer.config.guidance_embeds and not flux.components.has_guidance_embeds(transformer)
    embeds, pooled, text_ids = flux.encode_prompts(flux.load_text_encoders(tiny_schnell_dir), ["a red cube"], 32)
    cond = TensorConditioning({"prompt_embeds": embeds, "pooled": pooled}, {"text_ids": text_ids})
    cfg = RolloutConfig(height=64, width=64, sampling_steps=4, eta=0.0, shift=1.0, num_generations=1,
                        rollout_batch_size=1, init_same_noise=False)
    family = flux.FluxFamily(guidance_scale=0.0, quantize_timestep=False)
    traj = rollout(family, transformer, pipe.vae, cond, ["a red cube"], [0], cfg, RandomSource(1), 1, "cpu",
                   decode=False, plan=ode_plan(4, 1.0))
    ref = pipe(prompt_embeds=embeds, pooled_prompt_embeds=pooled, height=64, width=64, num_inference_steps=4,
               latents=traj.latents[:, 0].clone(), output_type="latent").images
    assert not torch.allclose(traj.latents[:, -1], traj.latents[:, 0], atol=1e-2)
    torch.testing.assert_close(traj.latents[:, -1], ref, rtol=1e-5, atol=1e-5)


def test_schnell_flops_and_meta_inputs_have_no_guidance_embedder(tiny_schnell_dir):
    config = json.loads((tiny_schnell_dir / "transformer" / "config.json").read_text())
    family = flux.FluxFamily()
    parts = family.transformer_flops(config, 16, 32)
    assert parts["guidance_embedder"] == 0
    assert family.meta_inputs(config, 1, family.nominal_layout(64, 64, config), 32, torch.float32)["guidance"] is None
