"""Qwen-Image-Edit against diffusers' own QwenImageEditPlusPipeline (nobody here wrote it): the tiny
folder loads in it offline and edits; the instruction + image encoding equals its encode_prompt
exactly (the VL encoder sees the condition image's tokens); the source latents equal its
_encode_vae_image + _pack_latents at its own 1024^2 area; the ODE rollout equals its latents for the
same source and noise with true CFG (negative " " with the image) and without. The current library
line only (skipped on the recipe line, saying so)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line

ROOT = Path(__file__).resolve().parents[2]


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Qwen-Image-Edit (diffusers' QwenImageEditPlusPipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")
PROMPT = "make the square green"
SEQ, STEPS = 320, 3
SMALL_VAE_AREA = 128 * 128  # the rollout's VAE area (the pipeline's module constant patched alike)


def _pixels(h=64, w=48, seed=0, n=1) -> torch.Tensor:
    """Source images [n, 3, h, w] on the 8-bit grid (what a PNG holds)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 3, h, w, generator=g) * 255).round() / 255


def _pil(pixels):
    from fastvideo.rewards.base import tensor_to_pils

    return tensor_to_pils(pixels)[0]


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory):
    from fastvideo.tools.make_tiny_qwen_image_edit import make_tiny_qwen_image_edit

    return make_tiny_qwen_image_edit(tmp_path_factory.mktemp("tiny_qwen_image_edit"), seed=0)


@pytest.fixture(scope="module")
def pipe(edit_dir):
    from diffusers import QwenImageEditPlusPipeline

    p = QwenImageEditPlusPipeline.from_pretrained(edit_dir)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def encoders(edit_dir):
    from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily

    return QwenImageEditFamily().load_text_encoders(edit_dir)


def _family(scale=4.0, vae_area=None):
    from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily

    if vae_area is None:
        return QwenImageEditFamily(guidance_scale=scale)
    return QwenImageEditFamily(guidance_scale=scale, vae_area=vae_area)


def test_tiny_folder_is_an_edit_plus_folder(edit_dir, pipe):
    from fastvideo.models.registry import family_for_class_name, family_of_folder
    from fastvideo.tools.make_tiny_qwen_image_edit import EDIT_SYSTEM_PREFIX

    index = json.loads((edit_dir / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImageEditPlusPipeline"
    assert family_of_folder(edit_dir) == "qwen_image_edit"
    assert family_for_class_name("QwenImageTransformer2DModel") == "qwen_image"  # a checkpoint still says Qwen-Image
    assert type(pipe.processor).__name__ == "Qwen2VLProcessor"
    assert len(pipe.tokenizer(EDIT_SYSTEM_PREFIX).input_ids) == pipe.prompt_template_encode_start_idx == 64
    vision = pipe.text_encoder.config.vision_config
    assert vision.depth == 2 and vision.fullatt_block_indexes == [1]
    out = pipe(image=_pil(_pixels()), prompt=PROMPT, negative_prompt=" ", height=64, width=64, num_inference_steps=2,
               output_type="pt", generator=torch.Generator().manual_seed(0)).images
    assert out.shape == (1, 3, 64, 64) and float(out.std()) > 0


def test_prompt_and_source_encoding_equal_the_pipeline(pipe, encoders):
    """At the pipeline's own areas (condition 384^2, VAE 1024^2) on a 64x48 source: the embeddings of
    instruction + image equal encode_prompt's exactly (atol 0), the negative " " with the image too,
    the source latents equal _encode_vae_image + _pack_latents, and the source changes the text."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as P

    from fastvideo.models.qwen_image import components as QC

    family, pixels = _family(), _pixels()
    cond = family.encode_sources(encoders, family.encode_prompts(encoders, [PROMPT], SEQ), pixels)
    pil = _pil(pixels)
    cw, ch = P.calculate_dimensions(P.CONDITION_IMAGE_SIZE, 48 / 64)
    vw, vh = P.calculate_dimensions(P.VAE_IMAGE_SIZE, 48 / 64)
    condition = pipe.image_processor.resize(pil, ch, cw)
    ref, ref_mask = pipe.encode_prompt(prompt=PROMPT, image=[condition])
    ours, mask = QC.trimmed(cond["prompt_embeds"], cond["prompt_mask"])
    assert ref_mask is None and mask is None and ours.shape == ref.shape and ref.shape[1] > 100  # image tokens
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    neg, _ = pipe.encode_prompt(prompt=" ", image=[condition])
    ours_neg, _ = QC.trimmed(cond["neg_prompt_embeds"], cond["neg_prompt_mask"])
    torch.testing.assert_close(ours_neg, neg, rtol=0, atol=0)
    z = pipe._encode_vae_image(pipe.image_processor.preprocess(pil, vh, vw).unsqueeze(2), None)
    ref_lat = pipe._pack_latents(z, 1, 16, z.shape[3], z.shape[4])
    torch.testing.assert_close(cond["image_latents"], ref_lat, rtol=0, atol=0)
    assert cond["source_grid"].tolist() == [vh // 16, vw // 16]
    assert torch.equal(cond["source_image"], pixels)
    other = family.encode_sources(encoders, family.encode_prompts(encoders, [PROMPT], SEQ), _pixels(seed=1))
    assert not torch.allclose(other["prompt_embeds"], cond["prompt_embeds"])  # the VL encoder reads the image


def test_preprocessing_at_source_vae_size_384_equals_the_pipeline(pipe, edit_dir, tmp_path):
    """--source_vae_size 384 (Flow-Factory's condition_image_size): the stored source latents of
    assets/edit's 64x64 image 00 equal the stock pipeline's _encode_vae_image + _pack_latents of that
    image resized to calculate_dimensions(384^2) (exactly: 24x24 = 576 tokens), the grid is recorded
    beside them and the area in preprocess_meta.json, which training's family reads; without the flag
    the family keeps the pipeline's 1024^2."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as P

    from fastvideo.data.sources import open_rgb
    from fastvideo.data_preprocess.preprocess_embeddings import main, parse_args

    out = tmp_path / "emb"
    argv = ["--model_path", str(edit_dir), "--prompt_dir", str(ROOT / "assets/edit/prompts_edit.jsonl"),
            "--output_dir", str(out), "--model_family", "qwen_image_edit", "--max_sequence_length", str(SEQ),
            "--max_prompts", "1", "--batch_size", "1", "--dataloader_num_workers", "0"]
    assert parse_args(argv).family().vae_area == P.VAE_IMAGE_SIZE == 1024 * 1024
    main(argv + ["--source_vae_size", "384"])
    pil = open_rgb(ROOT / "assets/edit/images/00.png")
    vw, vh = P.calculate_dimensions(384 * 384, pil.size[0] / pil.size[1])
    z = pipe._encode_vae_image(pipe.image_processor.preprocess(pil, vh, vw).unsqueeze(2), None)
    ref = pipe._pack_latents(z, 1, 16, z.shape[3], z.shape[4])[0]
    stored = torch.load(out / "image_latents" / "0.pt", weights_only=True)
    assert (vw, vh) == (384, 384) and stored.shape == ref.shape == (576, 64)
    torch.testing.assert_close(stored, ref, rtol=0, atol=0)
    assert torch.load(out / "source_grid" / "0.pt", weights_only=True).tolist() == [24, 24]
    meta = json.loads((out / "preprocess_meta.json").read_text())
    assert meta["settings"]["source_vae_area"] == 384 * 384
    from fastvideo.training.builders import recorded_family_settings

    # training's family (and its evaluation's encoding of held-out sources) takes the recorded area
    assert recorded_family_settings(str(out / "videos2caption.json")) == {"vae_area": 384 * 384}
    assert recorded_family_settings(str(tmp_path / "elsewhere" / "videos2caption.json")) == {}


def test_a_too_short_max_sequence_length_is_refused(encoders):
    from fastvideo.models.base import EmbeddingShapeError

    family = _family()
    with pytest.raises(EmbeddingShapeError, match="--max_sequence_length is 32: pass at least"):
        family.encode_sources(encoders, family.encode_prompts(encoders, [PROMPT], 32), _pixels())


def _rollout(family, pipe, cond, sigmas, seed=3):
    from fastvideo.sampling.plan import ODE, SamplingPlan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    steps = len(sigmas) - 1
    cfg = RolloutConfig(height=64, width=64, sampling_steps=steps, eta=0.0, shift=1.0, num_generations=1,
                        rollout_batch_size=1, init_same_noise=False)
    plan = SamplingPlan(sigmas=sigmas, kinds=(ODE,) * steps, trainable=(), num_trained=0)
    return rollout(family, pipe.transformer, pipe.vae, cond, [PROMPT], [0], cfg, RandomSource(seed), 1, "cpu",
                   plan=plan)


@pytest.mark.parametrize("scale", [4.0, 1.0])
def test_ode_rollout_equals_the_pipeline(pipe, encoders, monkeypatch, scale):
    """The ODE rollout on the pipeline's scheduler sigmas equals QwenImageEditPlusPipeline's latents
    (output_type latent) for the same 64x48 source, instruction and noise, with true CFG 4.0 and the
    negative " " (encoded with the image) and without. The VAE area is 128^2 on both sides (the
    pipeline's module constant patched) to keep the CPU run short. Tolerance 1e-5 relative (fp32)."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as P

    monkeypatch.setattr(P, "VAE_IMAGE_SIZE", SMALL_VAE_AREA)
    family = _family(scale, SMALL_VAE_AREA)
    cond = family.encode_sources(encoders, family.encode_prompts(encoders, [PROMPT], SEQ), _pixels())
    mu = P.calculate_shift(16, 256, 8192, 0.5, 0.9)
    pipe.scheduler.set_timesteps(STEPS, sigmas=np.linspace(1.0, 1 / STEPS, STEPS), mu=mu)
    sigmas = pipe.scheduler.sigmas.clone()
    traj = _rollout(family, pipe, cond, sigmas)
    noise = traj.latents[:, 0]
    ref = pipe(image=_pil(_pixels()), prompt=PROMPT, negative_prompt=" " if scale > 1 else None, true_cfg_scale=scale,
               height=64, width=64, num_inference_steps=STEPS, latents=noise.clone(), output_type="latent").images
    ours = traj.latents[:, -1]
    assert ours.shape == ref.shape == (1, 16, 64)
    assert not torch.allclose(ours, noise, atol=1e-1)
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"scale {scale}: max |ours - QwenImageEditPlusPipeline| / max |pipeline| = {rel:.1e}")
    assert rel <= 1e-5
    assert cond["image_latents"].shape[1] == 60  # 128^2 at 3:4 -> 96x160 px -> 6x10 source tokens joined
