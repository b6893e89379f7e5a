"""Wan image-to-video (--model_family wan_i2v) against diffusers' own WanImageToVideoPipeline (nobody
here wrote it): the tiny Wan2.1-I2V folder (make_tiny_wan --variant i2v) loads in the stock pipeline
offline; the first frame's condition (VAE latents with the mask channels) and the CLIP image features
equal the pipeline's prepare_latents and encode_image; the ODE rollout of two prompts, each with its own
source image, equals the pipeline's latents and decoded frames on the same noise and sigmas (CFG 5.0
with the negative prompt ""); the same for the tiny Wan2.2-I2V-A14B (--variant i2v_a14b: two experts
by boundary_ratio 0.9, no CLIP), each expert with its scale. The current library line only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line

ROOT = Path(__file__).resolve().parents[2]


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Wan image-to-video (diffusers' WanImageToVideoPipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")

PROMPTS = ["the square turns green", "a circle appears"]
IMAGES = [ROOT / "assets/edit/images/00.png", ROOT / "assets/edit/images/01.png"]
SEQ, STEPS, FRAMES, SCALE, SIZE = 512, 3, 5, 5.0, 64  # 512: the I2V transformer's text length


@pytest.fixture(scope="module")
def setup(tiny_wan_i2v_dir):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

    from fastvideo.data.sources import load_pixels
    from fastvideo.models.wan_i2v.family import WanI2VFamily

    pipe = WanImageToVideoPipeline.from_pretrained(tiny_wan_i2v_dir)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)
    family = WanI2VFamily(guidance_scale=SCALE, num_frames=FRAMES)
    family.check_folder(tiny_wan_i2v_dir)
    enc = family.load_text_encoders(tiny_wan_i2v_dir)
    cond = family.encode_sources(enc, family.encode_prompts(enc, PROMPTS, SEQ), load_pixels(IMAGES))
    return pipe, family, cond


def test_the_tiny_folder_is_wan21_i2v_in_the_stock_pipeline(tiny_wan_i2v_dir, setup):
    from fastvideo.models.registry import family_of_folder

    pipe, _, _ = setup
    config = pipe.transformer.config
    assert (config.in_channels, config.out_channels, config.image_dim) == (36, 16, 16)
    assert type(pipe.image_encoder).__name__ == "CLIPVisionModel" and pipe.transformer.condition_embedder.image_embedder
    assert json.loads((tiny_wan_i2v_dir / "model_index.json").read_text())["_class_name"] == "WanImageToVideoPipeline"
    assert family_of_folder(tiny_wan_i2v_dir) == "wan_i2v"


def test_condition_and_clip_features_equal_the_pipeline(setup):
    """condition [P, 4 + 16, f, h, w] = prepare_latents' [mask ; normalised first-frame latents]; the
    CLIP features = encode_image's second-last hidden state, each prompt its own source."""
    from fastvideo.data.sources import open_rgb

    pipe, _, cond = setup
    assert cond["condition"].shape == (2, 20, 2, 8, 8) and cond["image_embeds"].shape == (2, 17, 16)
    for i, path in enumerate(IMAGES):
        image = pipe.video_processor.preprocess(open_rgb(path), height=SIZE, width=SIZE).float()
        _, ref = pipe.prepare_latents(image, 1, 16, SIZE, SIZE, FRAMES, torch.float32, "cpu",
                                      torch.Generator().manual_seed(0))
        torch.testing.assert_close(cond["condition"][i:i + 1], ref, rtol=0, atol=1e-6)  # batched: 2.6e-7
        torch.testing.assert_close(cond["image_embeds"][i:i + 1], pipe.encode_image(open_rgb(path), "cpu"),
                                   rtol=0, atol=1e-6)
    from fastvideo.models.base import EmbeddingShapeError, TensorConditioning

    family = setup[1]
    family.check_cond(cond)
    short = TensorConditioning({**cond.tensors, "prompt_embeds": cond["prompt_embeds"][:, :32]},
                               {"neg_prompt_embeds": cond["neg_prompt_embeds"][:32]})
    with pytest.raises(EmbeddingShapeError, match="--eval_max_sequence_length 512"):
        family.check_cond(short)  # the transformer would take image tokens for text
    mask = cond["condition"][:, :4]
    assert mask[:, :, 0].eq(1).all() and mask[:, :, 1:].eq(0).all()  # the first latent frame is given
    assert not torch.equal(cond["condition"][0], cond["condition"][1])  # two sources


def test_ode_rollout_equals_the_pipeline(setup):
    """The ODE rollout (both prompts in one batch, CFG rows batched) equals WanImageToVideoPipeline's
    latents and decoded frames, one call per prompt with its image, on the same noise and sigmas."""
    pipe, family, cond = setup
    traj = _ode_against_the_pipeline(pipe, family, cond, dict(guidance_scale=SCALE))
    torch.testing.assert_close(family.source_images(traj.cond)[:, :, 0, 0], cond["source_image"][:, :, 0, 0])


def test_two_expert_i2v_ode_rollout_equals_the_pipeline(tiny_wan_i2v_a14b_dir):
    """Wan2.2-I2V-A14B's layout: WanImageToVideoPipeline with boundary_ratio 0.9 and no image encoder;
    the first step (t = 1000) on the high-noise expert at guidance 4.0, the others on the low-noise one at
    3.0, no CLIP features stored ([P, 0, 0]) or passed."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

    from fastvideo.data.sources import load_pixels
    from fastvideo.models.wan.experts import WanExperts
    from fastvideo.models.wan_i2v.family import WanI2VFamily

    pipe = WanImageToVideoPipeline.from_pretrained(tiny_wan_i2v_a14b_dir)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.image_encoder is None and pipe.transformer.config.image_dim is None
    assert pipe.config.boundary_ratio == 0.9 and pipe.transformer_2.config.in_channels == 36
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)
    family = WanI2VFamily(guidance_scale=4.0, num_frames=FRAMES, guidance_scale_2=3.0)
    family.check_folder(tiny_wan_i2v_a14b_dir)
    enc = family.load_text_encoders(tiny_wan_i2v_a14b_dir)
    cond = family.encode_sources(enc, family.encode_prompts(enc, PROMPTS, SEQ), load_pixels(IMAGES))
    assert cond["image_embeds"].shape == (2, 0, 0) and family.experts == (0.9, 1000)
    family.check_dims((SEQ, 32, 20, 2, 8, 8, 0, 0, SIZE, SIZE), pipe.transformer.config)
    experts = []
    hooks = [m.register_forward_pre_hook(lambda m, a, kw, n=n: experts.append(n), with_kwargs=True)
             for n, m in (("high", pipe.transformer), ("low", pipe.transformer_2))]
    try:
        _ode_against_the_pipeline(pipe, family, cond, dict(guidance_scale=4.0, guidance_scale_2=3.0), calls=experts,
                                  transformer=WanExperts(pipe.transformer, pipe.transformer_2, *family.experts))
    finally:
        for hook in hooks:
            hook.remove()


def test_last_image_condition_and_ode_rollout_equal_the_pipeline(tiny_wan_i2v_a14b_dir):
    """A record's "last_image" (Wan2.2-I2V-A14B's folder, no CLIP): the condition is prepare_latents' with
    last_image (the first frame, black frames, the last frame through the VAE; the mask one on the first and
    the last pixel frame), and the ODE rollout equals WanImageToVideoPipeline(image=..., last_image=...)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

    from fastvideo.data.sources import load_pixels, open_rgb
    from fastvideo.models.wan.experts import WanExperts
    from fastvideo.models.wan_i2v.family import WanI2VFamily

    pipe = WanImageToVideoPipeline.from_pretrained(tiny_wan_i2v_a14b_dir)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)
    family = WanI2VFamily(guidance_scale=4.0, num_frames=FRAMES, guidance_scale_2=3.0)
    family.check_folder(tiny_wan_i2v_a14b_dir)
    enc = family.load_text_encoders(tiny_wan_i2v_a14b_dir)
    lasts = IMAGES[::-1]
    pixels = torch.stack([load_pixels(IMAGES), load_pixels(lasts)], dim=1)  # [P, 2, 3, H, W]: (first, last)
    cond = family.encode_sources(enc, family.encode_prompts(enc, PROMPTS, SEQ), pixels)
    only_first = family.encode_sources(enc, family.encode_prompts(enc, PROMPTS, SEQ), load_pixels(IMAGES))
    assert cond["condition"].shape == (2, 20, 2, 8, 8) and not torch.equal(cond["condition"], only_first["condition"])
    torch.testing.assert_close(cond["source_image"], only_first["source_image"], rtol=0, atol=0)  # the first frame
    for i, path in enumerate(IMAGES):
        image, last = (pipe.video_processor.preprocess(open_rgb(p), height=SIZE, width=SIZE).float()
                       for p in (path, lasts[i]))
        _, ref = pipe.prepare_latents(image, 1, 16, SIZE, SIZE, FRAMES, torch.float32, "cpu",
                                      torch.Generator().manual_seed(0), last_image=last)
        torch.testing.assert_close(cond["condition"][i:i + 1], ref, rtol=0, atol=1e-6)
    mask = cond["condition"][:, :4]
    assert mask[:, :, 0].eq(1).all() and mask[:, 3, 1].eq(1).all() and mask[:, :3, 1].eq(0).all()
    _ode_against_the_pipeline(pipe, family, cond, dict(guidance_scale=4.0, guidance_scale_2=3.0), last=lasts,
                              transformer=WanExperts(pipe.transformer, pipe.transformer_2, *family.experts))


def _ode_against_the_pipeline(pipe, family, cond, guidance: dict, calls: list | None = None, transformer=None,
                              shape=((2, 8, 8), (128, 16)), last: list | None = None):
    from fastvideo.data.sources import open_rgb
    from fastvideo.models.latents import from_tokens
    from fastvideo.sampling.plan import ODE, SamplingPlan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    pipe.scheduler.set_timesteps(STEPS)
    sigmas = pipe.scheduler.sigmas.float().clone()
    cfg = RolloutConfig(height=SIZE, width=SIZE, sampling_steps=STEPS, eta=0.0, shift=1.0, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    plan = SamplingPlan(sigmas=sigmas, kinds=(ODE,) * STEPS, trainable=(), num_trained=0)
    traj = rollout(family, transformer or pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(3), 1,
                   "cpu", plan=plan)
    grid = traj.layout["grid"]
    assert (grid, traj.layout.tokens) == shape
    noise, ours = from_tokens(traj.latents[:, 0], *grid), from_tokens(traj.latents[:, -1], *grid)
    if calls is not None:  # the rollout's experts, one call a step (both rows and both guidance rows in it)
        assert calls == ["high", "low", "low"]
    for i, path in enumerate(IMAGES):
        kwargs = dict(image=open_rgb(path), prompt=PROMPTS[i], negative_prompt="", height=SIZE, width=SIZE,
                      num_frames=FRAMES, num_inference_steps=STEPS, max_sequence_length=SEQ,
                      latents=noise[i:i + 1].clone(), **guidance)
        if last is not None:
            kwargs["last_image"] = open_rgb(last[i])
        if calls is not None:
            calls.clear()
        ref = pipe(**kwargs, output_type="latent").frames
        if calls is not None:  # the pipeline's: a conditional and an unconditional call a step
            assert calls == ["high", "high", "low", "low", "low", "low"]
        assert not torch.allclose(ours[i:i + 1], noise[i:i + 1], atol=1e-1)  # it moved
        rel = float((ours[i:i + 1] - ref).abs().max() / ref.abs().max())
        print(f"prompt {i}: max |ours - pipeline| / max |pipeline| = {rel:.1e}")
        assert rel <= 1e-5
        frames = pipe(**kwargs, output_type="pt").frames
        assert traj.images[i:i + 1].shape == frames.shape == (1, FRAMES, 3, SIZE, SIZE)
        print(f"prompt {i}: frames max |ours - pipeline| = {float((traj.images[i:i + 1] - frames).abs().max()):.1e}")
        torch.testing.assert_close(traj.images[i:i + 1], frames, rtol=0, atol=1e-5)
    return traj


@pytest.fixture(scope="module")
def ti2v_setup(tiny_wan_ti2v_dir):
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline

    from fastvideo.data.sources import load_pixels
    from fastvideo.models.wan_i2v.family import WanI2VFamily

    pipe = WanImageToVideoPipeline.from_pretrained(tiny_wan_ti2v_dir)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)
    family = WanI2VFamily(guidance_scale=SCALE, num_frames=FRAMES)
    enc = family.load_text_encoders(tiny_wan_ti2v_dir)
    cond = family.encode_sources(enc, family.encode_prompts(enc, PROMPTS, SEQ), load_pixels(IMAGES))
    return pipe, family, cond


def test_ti2v_5b_image_to_video_ode_rollout_equals_the_pipeline(ti2v_setup):
    """Wan2.2-TI2V-5B's folder (make_tiny_wan --variant ti2v: WanPipeline's model_index.json with
    expand_timesteps) in the stock WanImageToVideoPipeline: the condition is the first frame's normalised
    Wan2.2-VAE latents alone [P, 48, 1, h, w] (prepare_latents' with expand_timesteps), no mask channels,
    no CLIP; the ODE rollout (the first latent frame given, its tokens at timestep 0) equals the pipeline's
    latents (first frame: the condition) and decoded frames; the layout holds the first frame's 16 tokens
    fixed."""
    from fastvideo.data.sources import open_rgb

    pipe, family, cond = ti2v_setup
    assert pipe.config.expand_timesteps and pipe.image_encoder is None and pipe.transformer.config.in_channels == 48
    assert family.expand_timesteps and cond["condition"].shape == (2, 48, 1, 4, 4)
    assert cond["image_embeds"].shape == (2, 0, 0)
    family.check_dims((SEQ, 32, 48, 1, 4, 4, 0, 0, SIZE, SIZE), pipe.transformer.config)
    for i, path in enumerate(IMAGES):
        image = pipe.video_processor.preprocess(open_rgb(path), height=SIZE, width=SIZE).float()
        _, ref, mask = pipe.prepare_latents(image, 1, 48, SIZE, SIZE, FRAMES, torch.float32, "cpu",
                                            torch.Generator().manual_seed(0))
        torch.testing.assert_close(cond["condition"][i:i + 1], ref, rtol=0, atol=1e-6)
        assert mask[:, :, 0].eq(0).all() and mask[:, :, 1:].eq(1).all()
    traj = _ode_against_the_pipeline(pipe, family, cond, dict(guidance_scale=SCALE), shape=((2, 4, 4), (32, 48)))
    assert traj.layout["fixed_tokens"] == 16
    with pytest.raises(Exception, match="expand_timesteps"):
        family.check_dims((SEQ, 32, 52, 2, 4, 4, 0, 0, SIZE, SIZE), pipe.transformer.config)


def test_ti2v_5b_given_first_frame_is_no_action_of_the_policy(ti2v_setup):
    """The SDE rollout (Flow-GRPO's SDE, eta 0.7) keeps the given first frame out of the policy's
    log-probabilities: the rollout's log-prob of each step is the mean over the generated frames' tokens
    alone (recomputed by the step on them; the all-token mean differs), the replay under the same weights
    gives it back (ratio 1), changing a stored first-frame token of the next state changes nothing while a
    generated token does, the first frame takes no noise, and the decoded x0's first frame is the
    condition."""
    import dataclasses

    from fastvideo.models.latents import from_tokens, to_tokens
    from fastvideo.sampling import solvers
    from fastvideo.sampling.plan import SDE, SamplingPlan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout
    from fastvideo.training.policy import Policy

    pipe, family, cond = ti2v_setup
    sigmas = torch.tensor([1.0, 0.75, 0.4, 0.0])
    plan = SamplingPlan(sigmas=sigmas, kinds=(SDE,) * 3, trainable=(0, 1, 2), num_trained=3, sde_kind="flow")
    cfg = RolloutConfig(height=SIZE, width=SIZE, sampling_steps=3, eta=0.7, shift=1.0, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    traj = rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(5), 1, "cpu",
                   plan=plan, decode=False)
    n = traj.layout["fixed_tokens"]
    policy = Policy(pipe.transformer, family, torch.device("cpu"), None)
    rows, k = torch.tensor([0, 1]), 1
    x, nxt = traj.latents[:, k], traj.latents[:, k + 1]
    with torch.no_grad():
        v = family.velocity(pipe.transformer, x, sigmas[k], traj.cond, traj.layout)
        top = float(plan.host_sigmas[1])  # the rollout's sigma_max of Flow-GRPO's step
        free = solvers.flow_sde_step(x[:, n:], v[:, n:], sigmas[k], sigmas[k + 1], 0.7, top, prev_sample=nxt[:, n:])[1]
        every = solvers.flow_sde_step(x, v, sigmas[k], sigmas[k + 1], 0.7, top, prev_sample=nxt)[1]
        torch.testing.assert_close(traj.log_probs[:, k], free, rtol=0, atol=1e-6)
        assert (every - free).abs().min() > 1e-3  # counting the first frame would give another number
        replay = policy.transition_log_prob(traj, rows, torch.tensor([k, k]), 0.7).log_prob
        torch.testing.assert_close(replay, traj.log_probs[:, k], rtol=0, atol=1e-6)
        for token, counts in ((0, False), (n, True)):
            edited = traj.latents.clone()
            edited[:, k + 1, token] += 3.0
            traj_e = dataclasses.replace(traj, latents=edited)
            changed = policy.transition_log_prob(traj_e, rows, torch.tensor([k, k]), 0.7).log_prob
            assert (not torch.equal(changed, replay)) == counts
    euler = x[:, :n] + (sigmas[k + 1] - sigmas[k]) * v[:, :n]
    torch.testing.assert_close(nxt[:, :n], euler, rtol=0, atol=1e-6)  # no noise on the given frame
    first = from_tokens(traj.x0, *traj.layout["grid"])[:, :, :1]
    torch.testing.assert_close(to_tokens(first), to_tokens(cond["condition"]), rtol=0, atol=1e-5)


def test_the_eval_grids_source_row_starts_each_clips_frame_strip(tmp_path):
    """Above clips [G, F, 3, H, W] of the sources' size the source row has each source as its strip's
    first cell (white after), so the row lines up with the clips' frame strips; above images (editing)
    or clips of another size the sources are drawn as they are."""
    import numpy as np
    from PIL import Image

    from fastvideo.eval.report import save_row, source_cells

    sources = torch.rand(2, 3, 8, 8)
    clips = torch.zeros(2, FRAMES, 3, 8, 8)
    cells = source_cells(sources, clips)
    assert cells.shape == clips.shape and torch.equal(cells[:, 0], sources) and cells[:, 1:].eq(1).all()
    assert source_cells(sources, torch.zeros(2, 3, 8, 8)) is sources
    assert source_cells(sources, torch.zeros(2, FRAMES, 3, 16, 16)) is sources
    source_row = np.asarray(Image.open(save_row(cells, tmp_path / "source.png")))
    clip_row = np.asarray(Image.open(save_row(clips, tmp_path / "clips.png")))
    assert source_row.shape == clip_row.shape  # the two rows line up, strip for strip
    plain = np.asarray(Image.open(save_row(sources, tmp_path / "plain.png")))
    assert plain.shape[1] < source_row.shape[1] / (FRAMES - 1)  # what the row was before: misaligned
