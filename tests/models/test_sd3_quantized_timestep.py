"""SD3 with timestep quantisation ON (#39 test 22: every other SD3 test runs with it off, as the
Flow-GRPO launchers do): the trainer's family passes the stock SD3Transformer2DModel floor(1000 sigma),
DanceGRPO's convention, in the conditional and the unconditional rows alike."""

from __future__ import annotations

import pytest
import torch

from fastvideo.models.sd3.family import SD3Family

PROMPTS = ["a red cube on a table", "two small birds"]
SCALE = 4.5


@pytest.fixture(scope="module")
def pipe(tiny_sd3_dir):
    from diffusers import StableDiffusion3Pipeline

    return StableDiffusion3Pipeline.from_pretrained(tiny_sd3_dir)


@torch.no_grad()
def _stock_guided_velocity(pipe, x, timestep, cond, layout):
    """The pipeline's denoising step (unconditional rows first, v_u + s (v_c - v_u)) on the stock
    transformer, with the timestep given as is."""
    from fastvideo.models.sd3 import components as C

    b = x.shape[0]
    grid = C.to_grid(x, layout["latent_h"], layout["latent_w"])
    embeds = torch.cat([cond["neg_prompt_embeds"].expand(b, -1, -1), cond["prompt_embeds"]])
    pooled = torch.cat([cond["neg_pooled"].expand(b, -1), cond["pooled"]])
    out = pipe.transformer(hidden_states=torch.cat([grid, grid]), encoder_hidden_states=embeds,
                           pooled_projections=pooled, timestep=torch.full((2 * b,), timestep), return_dict=False)[0]
    v_u, v_c = C.from_grid(out.float()).chunk(2)
    return v_u + SCALE * (v_c - v_u)


def test_quantized_sd3_velocity_is_the_stock_transformer_at_floor_1000_sigma(pipe, tiny_sd3_dir):
    from fastvideo.training.builders import build_family
    from fastvideo.config import build_parser, validate_args

    cfg = validate_args(build_parser().parse_args(
        ["--data_json_path", "d", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility",
         "--model_family", "sd3", "--guidance_scale", str(SCALE)]))
    family = build_family(cfg)  # no --no_quantize_timestep: quantisation on
    assert isinstance(family, SD3Family) and family.quantize_timestep is True
    cond = family.encode_prompts(family.load_text_encoders(tiny_sd3_dir), PROMPTS, 16)
    layout = family.layout(64, 64, pipe.vae, pipe.transformer)
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(0))
    sigma = 0.8437  # 1000 sigma = 843.7: quantised 843
    with torch.no_grad():
        v = family.velocity(pipe.transformer, x, sigma, cond, layout)
    torch.testing.assert_close(v, _stock_guided_velocity(pipe, x, 843.0, cond, layout), rtol=1e-5, atol=1e-5)
    exact = _stock_guided_velocity(pipe, x, 843.7, cond, layout)
    assert (v - exact).abs().max() > 1e-4  # the quantisation is visible: not the unrounded timestep
    unquantized = SD3Family(guidance_scale=SCALE, quantize_timestep=False)
    with torch.no_grad():
        torch.testing.assert_close(unquantized.velocity(pipe.transformer, x, sigma, cond, layout), exact,
                                   rtol=1e-5, atol=1e-5)
