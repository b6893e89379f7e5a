"""The HunyuanVideo family against diffusers' own HunyuanVideoPipeline (nobody here wrote it), on both
library lines: the tiny folder loads in the stock pipeline offline, its Llama tokenizer splits the
pipeline's template prefix into exactly the pipeline's crop_start tokens, prompt encoding (Llama hidden
states under the template, cropped, with the mask; CLIP pooled) equals HunyuanVideoPipeline.encode_prompt,
and the ODE rollout on the stock scheduler's sigmas equals the pipeline's latents and decoded frames
with its embedded guidance, 5 frames at 32x32; --num_frames' rule.

On transformers 5 the stock pipeline is given the folder's tokenizer as PreTrainedTokenizerFast (the
family's loader, components.load_llama_tokenizer): the LlamaTokenizerFast its model_index names
replaces the byte-level pre-tokenizer there (huggingface/transformers#45488)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

PROMPTS = ["a red cube on a table", "two small birds fly over the sea"]
SEQ, STEPS, FRAMES, SIZE, SCALE = 24, 3, 5, 32, 6.0


@pytest.fixture(scope="module")
def stock(tiny_hunyuan_video_dir):
    """(folder, the stock pipeline with the folder's tokenizer as written, the family, its encoders)."""
    from diffusers import HunyuanVideoPipeline

    from fastvideo.models.hunyuan_video.components import load_llama_tokenizer
    from fastvideo.models.hunyuan_video.family import HunyuanVideoFamily

    folder = tiny_hunyuan_video_dir
    pipe = HunyuanVideoPipeline.from_pretrained(folder, tokenizer=load_llama_tokenizer(folder))
    pipe.set_progress_bar_config(disable=True)
    family = HunyuanVideoFamily(guidance_scale=SCALE, num_frames=FRAMES)
    return folder, pipe, family, family.load_text_encoders(folder)


def test_tiny_folder_loads_in_the_stock_pipeline_with_hunyuan_videos_layout(stock):
    from diffusers import HunyuanVideoPipeline

    from fastvideo.models.hunyuan_video.components import prompt_template
    from fastvideo.models.registry import family_of_folder

    folder, pipe, _, enc = stock
    plain = HunyuanVideoPipeline.from_pretrained(folder)  # the classes model_index.json names
    assert type(plain.text_encoder).__name__ == "LlamaModel" and type(plain.text_encoder_2).__name__ == "CLIPTextModel"
    assert type(plain.vae).__name__ == "AutoencoderKLHunyuanVideo" and plain.transformer.config.guidance_embeds
    assert pipe.transformer.config.text_embed_dim == pipe.text_encoder.config.hidden_size
    assert pipe.transformer.config.pooled_projection_dim == pipe.text_encoder_2.config.hidden_size
    assert family_of_folder(folder) == "hunyuan_video"
    template = prompt_template()
    prefix = enc.llama_tokenizer(template["template"].split("{}")[0]).input_ids
    assert len(prefix) == template["crop_start"] == 95  # as Llama-3's tokenizer: the crop leaves the prompt
    video = pipe(prompt="a cube", height=SIZE, width=SIZE, num_frames=FRAMES, num_inference_steps=1,
                 max_sequence_length=SEQ, output_type="pt").frames
    assert video.shape == (1, FRAMES, 3, SIZE, SIZE)


def test_prompt_encoding_equals_the_pipeline(stock):
    """Llama's hidden_states[-3] of the templated prompt with crop_start cropped, its mask, and CLIP's
    pooled output, as HunyuanVideoPipeline.encode_prompt."""
    _, pipe, family, enc = stock
    cond = family.encode_prompts(enc, PROMPTS, SEQ)
    embeds, pooled, mask = pipe.encode_prompt(PROMPTS, max_sequence_length=SEQ)
    assert cond["prompt_embeds"].shape == embeds.shape == (2, SEQ, 32) and cond["pooled"].shape == (2, 24)
    torch.testing.assert_close(cond["prompt_embeds"], embeds, rtol=0, atol=0)
    torch.testing.assert_close(cond["prompt_mask"], mask, rtol=0, atol=0)
    torch.testing.assert_close(cond["pooled"], pooled, rtol=0, atol=0)
    lengths = cond["prompt_mask"].sum(-1)
    assert 0 < lengths[0] < lengths[1] < SEQ  # each prompt's own tokens, then padding
    assert not torch.equal(cond["prompt_embeds"][0], cond["prompt_embeds"][1])


def test_ode_rollout_equals_the_pipeline(stock):
    """The ODE rollout equals HunyuanVideoPipeline's latents (output_type latent) and decoded frames
    [B, F, 3, H, W] (output_type pt) for the same noise on the stock scheduler's sigmas (shift 7.0),
    with the embedded guidance 6.0 (1000 x 6.0 to the transformer, one pass). Tolerance 1e-5 (fp32)."""
    from fastvideo.models.latents import from_tokens
    from fastvideo.sampling.plan import ODE, SamplingPlan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    _, pipe, family, enc = stock
    cond = family.encode_prompts(enc, PROMPTS, SEQ)
    seen = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["guidance"].tolist(), kw["timestep"].tolist())), with_kwargs=True)
    pipe.scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, STEPS + 1)[:-1])  # the pipeline's own call
    sigmas = pipe.scheduler.sigmas.float().clone()  # shifted by the folder's 7.0, a final 0
    cfg = RolloutConfig(height=SIZE, width=SIZE, sampling_steps=STEPS, eta=0.0, shift=1.0, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    plan = SamplingPlan(sigmas=sigmas, kinds=(ODE,) * STEPS, trainable=(), num_trained=0)
    try:
        traj = rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(3), 1, "cpu",
                       plan=plan)
    finally:
        hook.remove()
    assert seen[0][0] == [6000.0, 6000.0] and seen[0][1] == pytest.approx([1000.0 * float(sigmas[0])] * 2)
    grid = traj.layout["grid"]
    assert grid == (2, 4, 4) and traj.layout.tokens == (32, 16) and len(seen) == STEPS
    noise = from_tokens(traj.latents[:, 0], *grid)
    kwargs = dict(prompt=list(PROMPTS), guidance_scale=SCALE, height=SIZE, width=SIZE, num_frames=FRAMES,
                  num_inference_steps=STEPS, max_sequence_length=SEQ)
    ref = pipe(**kwargs, latents=noise.clone(), output_type="latent").frames
    ours = from_tokens(traj.latents[:, -1], *grid)
    assert ours.shape == ref.shape == (2, 16, 2, 4, 4)
    assert not torch.allclose(ours, noise, atol=1e-1)  # it moved
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"max |ours - pipeline| / max |pipeline| = {rel:.1e}")
    assert rel <= 1e-5
    frames = pipe(**kwargs, latents=noise.clone(), output_type="pt").frames
    assert traj.images.shape == frames.shape == (2, FRAMES, 3, SIZE, SIZE)
    torch.testing.assert_close(traj.images, frames, rtol=0, atol=1e-5)
    assert float((traj.images[:, 0] - traj.images[:, -1]).abs().max()) > 0  # frames differ: a clip


def test_a_batch_of_prompts_of_unequal_length_equals_each_prompt_alone(stock):
    """diffusers 0.32's transformer attends under a mask [B, S, S] that SDPA broadcasts against the heads
    (head h gets sample h's mask; B > 1 other than the head count fails); the family's transformer
    (components.adapt_for_device, attention.py) gives every head of a sample that sample's mask. A batch
    of 3 prompts of different text lengths (more than the tiny model's 2 heads) equals each prompt alone
    to 1e-5, on both lines; one prompt, and a group of one prompt repeated, are bit-identical to the stock
    transformer's; a group of 3 runs too (0.32's stock does not)."""
    from fastvideo.library_lines import is_current

    folder, pipe, family, enc = stock
    model = family.load_transformer(folder, "transformer", "cpu", torch.float32)
    cond = family.encode_prompts(enc, [*PROMPTS, "a cat"], SEQ)
    assert len(set(cond["prompt_mask"].sum(-1).tolist())) == 3 and model.config.num_attention_heads == 2
    layout = family.nominal_layout(SIZE, SIZE, model.config)
    x = torch.randn(3, *layout.tokens, generator=torch.Generator().manual_seed(1))

    def velocity(transformer, rows):
        with torch.no_grad():
            return family.velocity(transformer, x[rows], 0.6, cond.select(rows), layout)

    batch = velocity(model, slice(0, 3))
    alone = torch.cat([velocity(model, slice(i, i + 1)) for i in range(3)])
    assert float((batch - alone).abs().max()) <= 1e-5
    assert torch.equal(alone[:1], velocity(pipe.transformer, slice(0, 1)))  # one prompt: as stock
    group = torch.tensor([1, 1])
    assert torch.equal(velocity(model, group), velocity(pipe.transformer, group))  # a group: as stock
    assert float((velocity(model, torch.tensor([1, 1, 1])) - alone[1]).abs().max()) <= 1e-5  # more than heads, one length
    stock_pair = velocity(pipe.transformer, slice(0, 2))
    if is_current():  # 0.42 masks keys per sample
        assert float((stock_pair - alone[:2]).abs().max()) <= 1e-5
    else:  # 0.32: sample h's mask on head h, and no broadcast of 3 masks over 2 heads
        assert float((stock_pair - alone[:2]).abs().max()) > 1e-3
        with pytest.raises(RuntimeError):
            velocity(pipe.transformer, slice(0, 3))


def test_num_frames_must_be_4k_plus_1_in_one_line():
    from fastvideo.errors import ConfigError
    from fastvideo.models.hunyuan_video.family import HunyuanVideoFamily
    from fastvideo.models.hunyuan_video.settings import HunyuanVideoSettings

    assert HunyuanVideoFamily().num_frames == 129 and HunyuanVideoFamily(num_frames=53).num_frames == 53
    with pytest.raises(ConfigError, match=r"--num_frames 52: .*4k\+1.*use 49 or 53"):
        HunyuanVideoSettings(num_frames=52).checked()
    family = HunyuanVideoFamily(num_frames=5)
    assert family.nominal_layout(480, 480, {"in_channels": 16})["grid"] == (2, 60, 60)
    family.set_num_frames(53)
    assert family.nominal_layout(480, 480, {"in_channels": 16}).tokens == (14 * 60 * 60, 16)


def test_transformer_flops_match_flop_counter(stock):
    """The analytic count (models/hunyuan_video/flops.py) equals FlopCounterMode's on the tiny transformer,
    forward and forward + backward, 2 clips of 2 x 4 x 6 latent cells and 7 text tokens; the published
    13B's forward at DanceGRPO's 53 frames of 480x480 is counted from the reference config."""
    from fastvideo.models.hunyuan_video.reference import TRANSFORMER
    from fastvideo.perf.flops import count_flops

    _, pipe, family, _ = stock
    model, config = pipe.transformer, dict(pipe.transformer.config)
    b, f, h, w, lt = 2, 2, 4, 6, 7
    inputs = dict(hidden_states=torch.randn(b, 16, f, h, w), timestep=torch.tensor([500.0, 300.0]),
                  encoder_hidden_states=torch.randn(b, lt, 32), encoder_attention_mask=torch.ones(b, lt),
                  pooled_projections=torch.randn(b, 24), guidance=torch.tensor([6000.0, 6000.0]), return_dict=False)
    with torch.no_grad():
        forward = count_flops(lambda: model(**inputs))
    both = count_flops(lambda: model(**inputs)[0].square().mean().backward())
    model.zero_grad(set_to_none=True)
    counts = family.transformer_flops(config, f * h * w, lt, b)
    assert counts["forward"] == forward and counts["backward"] == both - forward
    assert 0 < counts["blocks"] < counts["forward"]
    big = family.transformer_flops(TRANSFORMER, 14 * 60 * 60, 256)  # 53 frames at 480x480: 14 x 60 x 60 cells
    assert 2.5e14 < big["forward"] < 3.5e14 and big["blocks"] / big["forward"] > 0.99  # 2.97e14


def test_vae_decode_flops_equal_a_real_decode(stock):
    """HunyuanVideoFamily.vae_decode_flops (models/video_decode.py: the causal AutoencoderKLHunyuanVideo decoding
    on meta) equals FlopCounterMode around the folder's own VAE decoding a real clip's latents on the CPU with
    the math attention (its matmuls counted, as on meta): a clip's decode, not AutoencoderKL's image count
    perf.flops gave every family before (one frame's 2-D decoder)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from fastvideo.perf.flops import vae_decoder_flops

    folder, pipe, family, _ = stock
    config = json.loads((folder / "transformer" / "config.json").read_text())
    vae_config = json.loads((folder / "vae" / "config.json").read_text())
    layout = family.nominal_layout(SIZE, SIZE, config)
    latents = torch.randn(1, vae_config["latent_channels"], *layout["grid"], generator=torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        frames = pipe.vae.decode(latents).sample
    assert frames.shape[2:] == (FRAMES, SIZE, SIZE)
    measured = family.vae_decode_flops(vae_config, config, SIZE, SIZE)
    assert measured == counter.get_total_flops() > 2 * vae_decoder_flops(vae_config, SIZE // 8, SIZE // 8)
