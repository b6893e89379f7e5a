"""FLUX.1 Kontext against diffusers' own FluxKontextPipeline (nobody here wrote it): the tiny folder
loads in it offline, the source image's latents and ids equal its prepare_latents', the scheduler's
shift equals its sigmas, and the ODE rollout equals its latents for the same source image and noise
(fp32, tolerance 1e-5 relative; measured about 1e-7). FluxKontextPipeline exists on the current
library line only (diffusers 0.42; 0.32 has none): those tests say so when skipped."""

from __future__ import annotations

import json

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "FLUX.1 Kontext's stock pipeline (diffusers' FluxKontextPipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


needs_pipeline = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")
PROMPTS = ["make the square green", "turn the circle blue"]
SEQ, STEPS = 32, 4


def _pixels(h=64, w=48, seed=0) -> torch.Tensor:
    """Source images [2, 3, h, w] on the 8-bit grid (what a PNG holds)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(2, 3, h, w, generator=g) * 255).round() / 255


def _pils(pixels):
    from fastvideo.rewards.base import tensor_to_pils

    return tensor_to_pils(pixels)


@pytest.fixture(scope="module")
def pipe(tiny_kontext_dir):
    from diffusers import FluxKontextPipeline

    p = FluxKontextPipeline.from_pretrained(tiny_kontext_dir)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def family():
    from fastvideo.models.kontext.family import KontextFamily

    return KontextFamily(guidance_scale=2.5, quantize_timestep=False)


@pytest.fixture(scope="module")
def cond(tiny_kontext_dir, family):
    enc = family.load_text_encoders(tiny_kontext_dir)
    return family.encode_sources(enc, family.encode_prompts(enc, PROMPTS, SEQ), _pixels())


def test_tiny_folder_is_a_flux_folder_named_kontext(tiny_kontext_dir):
    from fastvideo.models.registry import family_of_folder, family_for_class_name

    index = json.loads((tiny_kontext_dir / "model_index.json").read_text())
    assert index["_class_name"] == "FluxKontextPipeline"
    assert index["transformer"] == ["diffusers", "FluxTransformer2DModel"]
    assert family_of_folder(tiny_kontext_dir) == "kontext"
    assert family_for_class_name("FluxTransformer2DModel") == "flux"  # a checkpoint's class still says FLUX.1


def test_source_ids_put_the_source_on_the_second_image_axis():
    from fastvideo.models.flux.components import image_ids
    from fastvideo.models.kontext.components import source_ids

    ids = source_ids(8, 6)
    assert ids.shape == (12, 3) and torch.equal(ids[:, 0], torch.ones(12))
    assert torch.equal(ids[:, 1:], image_ids(8, 6)[:, 1:])


@needs_pipeline
def test_stock_pipeline_edits_with_the_tiny_folder(pipe):
    out = pipe(image=_pils(_pixels(64, 64))[0], prompt=PROMPTS[0], height=64, width=64, num_inference_steps=2,
               generator=torch.Generator().manual_seed(0), output_type="pt", max_area=64 * 64,
               _auto_resize=False, max_sequence_length=SEQ).images
    assert out.shape == (1, 3, 64, 64) and torch.isfinite(out).all() and out.std() > 0


@needs_pipeline
def test_source_latents_and_ids_equal_prepare_latents(pipe, cond):
    image = pipe.image_processor.preprocess(_pils(_pixels()), 64, 48)
    _, ref_latents, _, ref_ids = pipe.prepare_latents(image, 2, 16, 64, 64, torch.float32, "cpu", None)
    torch.testing.assert_close(cond["image_latents"], ref_latents, rtol=1e-6, atol=1e-6)
    assert torch.equal(cond["source_ids"], ref_ids)
    assert torch.equal(cond["source_image"], _pixels())


def _rollout(family, pipe, cond, steps=STEPS, seed=3):
    from fastvideo.sampling.plan import ode_plan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    shift = family.schedule_shift(64, 64, steps)
    cfg = RolloutConfig(height=64, width=64, sampling_steps=steps, eta=0.0, shift=shift, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    plan = ode_plan(steps, shift)
    return rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(seed), 1, "cpu",
                   plan=plan), plan


@needs_pipeline
def test_ode_rollout_equals_the_pipeline(pipe, family, cond):
    """Same source images (64x48, another size than the 64x64 target), prompts and noise: our ODE
    rollout's final latents equal FluxKontextPipeline's (output_type latent, guidance 2.5, its dynamic
    shift) to 1e-5 relative; the sigmas equal its scheduler's."""
    traj, plan = _rollout(family, pipe, cond)
    noise = traj.latents[:, 0]
    ref = pipe(image=_pils(_pixels()), prompt=PROMPTS, height=64, width=64, num_inference_steps=STEPS,
               guidance_scale=2.5, latents=noise.clone(), max_sequence_length=SEQ, output_type="latent",
               _auto_resize=False, max_area=64 * 64).images
    ours = traj.latents[:, -1]
    assert ours.shape == ref.shape == (2, 16, 64)
    assert not torch.allclose(ours, noise, atol=1e-1)  # it moved
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"max |ours - FluxKontextPipeline| / max |pipeline| = {rel:.1e}")
    assert rel <= 1e-5
    torch.testing.assert_close(plan.sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)


@needs_pipeline
def test_the_source_changes_the_rollout(pipe, family, cond, tiny_kontext_dir):
    """Another source image gives other latents (the source tokens are read, not dropped)."""
    enc = family.load_text_encoders(tiny_kontext_dir)
    other = family.encode_sources(enc, family.encode_prompts(enc, PROMPTS, SEQ), _pixels(seed=1))
    a, _ = _rollout(family, pipe, cond)
    b, _ = _rollout(family, pipe, other)
    assert not torch.allclose(a.latents[:, -1], b.latents[:, -1], atol=1e-4)
