"""FLUX.2 [klein] editing against diffusers' own Flux2KleinPipeline(image=...) (nobody here wrote it):
the source image's tokens and ids equal its prepare_image_latents', and the ODE rollout equals its
latents for the same source image, instruction and noise, with true classifier-free guidance (both
rows see the source) and without (fp32, 1e-5 relative); another source gives another rollout. The
current library line only (skipped on the recipe line, saying so)."""

from __future__ import annotations

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "FLUX.2 [klein] editing (diffusers' Flux2KleinPipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")
PROMPTS = ["make the square green", "turn the circle blue"]
SEQ, STEPS = 48, 3


def _pixels(h=64, w=80, seed=0) -> torch.Tensor:
    """Source images [2, 3, h, w] on the 8-bit grid (what a PNG holds)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(2, 3, h, w, generator=g) * 255).round() / 255


def _pils(pixels):
    from fastvideo.rewards.base import tensor_to_pils

    return tensor_to_pils(pixels)


@pytest.fixture(scope="module")
def pipe(tiny_flux2_dir):
    from diffusers import Flux2KleinPipeline

    p = Flux2KleinPipeline.from_pretrained(tiny_flux2_dir)
    p.set_progress_bar_config(disable=True)
    return p


def _cond(family, folder, pixels):
    enc = family.load_text_encoders(folder)
    return family.encode_sources(enc, family.encode_prompts(enc, PROMPTS, SEQ), pixels)


@pytest.fixture(scope="module")
def cond(tiny_flux2_dir):
    from fastvideo.models.flux2_edit.family import Flux2EditFamily

    return _cond(Flux2EditFamily(), tiny_flux2_dir, _pixels())


def test_source_tokens_and_ids_equal_prepare_image_latents(pipe, cond):
    for i, image in enumerate(_pils(_pixels())):
        tensor = pipe.image_processor.preprocess(image, height=64, width=80, resize_mode="crop")
        latents, ids = pipe.prepare_image_latents([tensor], 1, None, "cpu", torch.float32)
        torch.testing.assert_close(cond["image_latents"][i:i + 1], latents, rtol=1e-6, atol=1e-6)
        assert torch.equal(cond["source_ids"], ids[0])  # (10, row, column, 0): the first reference
    assert cond["image_latents"].shape == (2, 20, 128) and torch.equal(cond["source_image"], _pixels())


def _rollout(family, pipe, cond):
    from fastvideo.sampling.plan import ode_plan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    shift = family.schedule_shift(64, 64, STEPS)
    cfg = RolloutConfig(height=64, width=64, sampling_steps=STEPS, eta=0.0, shift=shift, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    return rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(3), 1, "cpu",
                   plan=ode_plan(STEPS, shift))


@pytest.mark.parametrize("scale", [4.0, 1.0])
def test_ode_rollout_equals_the_pipeline(pipe, cond, scale):
    """Each instruction with its own source (64x80, another size than the 64x64 target): the pipeline
    takes a list of images as references shared by the batch, so it runs once per prompt."""
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2_edit.family import Flux2EditFamily

    family = Flux2EditFamily(guidance_scale=scale)
    traj = _rollout(family, pipe, cond)
    gh, gw = traj.layout["grid_h"], traj.layout["grid_w"]
    noise = C.to_grid(traj.latents[:, 0], gh, gw)
    ref = torch.cat([pipe(image=image, prompt=PROMPTS[i], height=64, width=64, num_inference_steps=STEPS,
                          guidance_scale=scale, latents=noise[i:i + 1].clone(), max_sequence_length=SEQ,
                          output_type="latent").images for i, image in enumerate(_pils(_pixels()))])
    mean, std = C.latent_statistics(pipe.vae)
    ours = C.unpatchify(C.to_grid(traj.latents[:, -1], gh, gw) * std + mean)
    assert ours.shape == ref.shape == (2, 32, 8, 8)
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"guidance {scale}: max |ours - Flux2KleinPipeline(image=)| / max |pipeline| = {rel:.1e}")
    assert rel <= 1e-5
    # the source is read: without it (klein text-to-image) the same noise ends elsewhere
    from fastvideo.models.flux2.family import Flux2Family

    plain = _rollout(Flux2Family(guidance_scale=scale), pipe, cond)
    assert not torch.allclose(plain.latents[:, -1], traj.latents[:, -1], atol=1e-4)


def test_another_source_changes_the_rollout(pipe, cond, tiny_flux2_dir):
    from fastvideo.models.flux2_edit.family import Flux2EditFamily

    family = Flux2EditFamily()
    other = _cond(family, tiny_flux2_dir, _pixels(seed=1))
    a, b = _rollout(family, pipe, cond), _rollout(family, pipe, other)
    assert not torch.allclose(a.latents[:, -1], b.latents[:, -1], atol=1e-4)


@pytest.mark.parametrize("size, fits", [((64, 80), True), ((384, 384), True), ((1024, 1024), True),
                                        ((48, 64), False), ((64, 640), False), ((1040, 1040), False)])
def test_source_sizes_the_pipeline_would_refuse_or_shrink_are_refused_in_one_line(size, fits):
    """Flux2ImageProcessor.check_image_input's 64-pixel side and 8:1 aspect, and the pipeline's 1024^2
    area above which it shrinks the source: preprocessing asks before any model loads."""
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
    from PIL import Image

    from fastvideo.errors import ConfigError
    from fastvideo.models.flux2_edit.family import Flux2EditFamily

    h, w = size
    try:  # the stock pipeline's own verdict on the image, for the limits it checks itself
        Flux2ImageProcessor.check_image_input(Image.new("RGB", (w, h)))
        stock_takes = h * w <= 1024 * 1024
    except ValueError:
        stock_takes = False
    assert stock_takes == fits
    if fits:
        Flux2EditFamily().check_source_size(h, w)
    else:
        with pytest.raises(ConfigError, match="Flux2KleinPipeline refuses or resizes") as err:
            Flux2EditFamily().check_source_size(h, w)
        assert "\n" not in str(err.value)


def test_two_references_equal_the_pipelines_image_list(pipe, tiny_flux2_dir):
    """Multi-reference editing (a JSONL record's "image" list): each prompt with 2 references (64x80),
    the tokens and ids equal prepare_image_latents([first, second]) (times 10 and 20), the ODE rollout
    with true CFG equals Flux2KleinPipeline(image=[first, second]), the rewards see the first
    reference, and swapping the references' order changes the rollout."""
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2_edit.family import Flux2EditFamily

    family = Flux2EditFamily(guidance_scale=4.0)
    refs = torch.stack([_pixels(), _pixels(seed=1)], dim=1)  # [2 prompts, 2 references, 3, 64, 80]
    cond = _cond(family, tiny_flux2_dir, refs)
    pils = [_pils(refs[:, i]) for i in range(2)]
    for p in range(2):
        tensors = [pipe.image_processor.preprocess(pils[i][p], height=64, width=80, resize_mode="crop") for i in range(2)]
        latents, ids = pipe.prepare_image_latents(tensors, 1, None, "cpu", torch.float32)
        torch.testing.assert_close(cond["image_latents"][p:p + 1], latents, rtol=1e-6, atol=1e-6)
        assert torch.equal(cond["source_ids"], ids[0])
    assert sorted(cond["source_ids"][:, 0].unique().tolist()) == [10, 20] and family.reference_count(cond["source_ids"]) == 2
    assert torch.equal(family.source_images(cond), refs[:, 0])  # clip_edit and the grids: the first reference
    traj = _rollout(family, pipe, cond)
    gh, gw = traj.layout["grid_h"], traj.layout["grid_w"]
    noise = C.to_grid(traj.latents[:, 0], gh, gw)
    ref = torch.cat([pipe(image=[pils[0][p], pils[1][p]], prompt=PROMPTS[p], height=64, width=64,
                          num_inference_steps=STEPS, guidance_scale=4.0, latents=noise[p:p + 1].clone(),
                          max_sequence_length=SEQ, output_type="latent").images for p in range(2)])
    mean, std = C.latent_statistics(pipe.vae)
    ours = C.unpatchify(C.to_grid(traj.latents[:, -1], gh, gw) * std + mean)
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"2 references: max |ours - Flux2KleinPipeline(image=[a, b])| / max |pipeline| = {rel:.1e}")
    assert rel <= 1e-5
    swapped = _rollout(family, pipe, _cond(family, tiny_flux2_dir, refs.flip(1)))
    assert not torch.allclose(swapped.latents[:, -1], traj.latents[:, -1], atol=1e-4)
