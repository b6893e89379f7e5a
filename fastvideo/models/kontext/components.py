"""FLUX.1 Kontext's own pieces; everything else is FLUX.1's (fastvideo.models.flux.components).

Kontext is a FLUX.1-dev transformer (FluxTransformer2DModel, guidance embedding) that reads the
source image as extra latent tokens, as diffusers' FluxKontextPipeline does:

    source image [3, H, W] in [0, 1] -> VAE mode (argmax) -> (z - shift) * scale -> 2x2 packed
    source tokens [Ls, 64] with ids [Ls, 3] = FLUX's image ids with column 0 set to 1
    velocity: transformer([x ; source], ids [image ids ; source ids]) -> the first L tokens
"""

from __future__ import annotations

import torch

import fastvideo.models.flux.components as C
from fastvideo.models import latents as L


def source_ids(latent_h: int, latent_w: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """[(h/2)(w/2), 3]: the source tokens' ids, FLUX's image ids with column 0 set to 1 (the
    generated tokens keep 0), so that RoPE tells the two images apart."""
    ids = C.image_ids(latent_h, latent_w, device=device, dtype=dtype)
    ids[:, 0] = 1
    return ids


@torch.no_grad()
def encode_source_latents(vae, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Source images [B, 3, H, W] in [0, 1] -> (packed latents [B, Ls, 4C], ids [Ls, 3]), as
    FluxKontextPipeline's prepare_latents does (the distribution's mode, then normalised)."""
    dtype = next(vae.parameters()).dtype
    x = (pixels.to(dtype) * 2.0 - 1.0)  # VaeImageProcessor.normalize
    z = vae.encode(x).latent_dist.mode()
    z = L.normalize_scale_shift(z, vae.config)
    lat_h, lat_w = z.shape[-2:]
    return L.pack_image(z), source_ids(lat_h, lat_w, device=z.device, dtype=z.dtype)


def kontext_velocity(transformer, x: torch.Tensor, sigma, cond, image_ids: torch.Tensor, guidance_scale: float,
                     quantize_timestep: bool) -> torch.Tensor:
    """v(x, sigma) float32 [B, L, C] of the generated tokens x [B, L, C]: the transformer runs on
    [x ; cond's source tokens] with [image_ids ; source ids], and the first L tokens' output is kept."""
    src = cond["image_latents"]
    if src.shape[0] != x.shape[0] or src.shape[2] != x.shape[2]:
        raise ValueError(f"source latents {tuple(src.shape)} do not fit latents {tuple(x.shape)}")
    ids = torch.cat([image_ids, cond["source_ids"].to(image_ids)], dim=0)
    v = C.predict_velocity(transformer, torch.cat([x, src.to(x.dtype)], dim=1), sigma, cond["prompt_embeds"],
                           cond["pooled"], cond["text_ids"], ids, guidance_scale, quantize_timestep)
    return v[:, : x.shape[1]]


# FLUX.1 Kontext [dev]'s scheduler_config.json (FLUX.1-dev's): the shift grows with the generated
# image's token count between these points (diffusers' calculate_shift, mu = log(shift)).
BASE_SEQ, MAX_SEQ, BASE_SHIFT, MAX_SHIFT = 256, 4096, 0.5, 1.15


def schedule_shift(height: int, width: int) -> float:
    """exp(mu): the shift FluxKontextPipeline's scheduler applies for an image of height x width
    (mu from the generated tokens alone, not the source's)."""
    import math

    seq = (height // 16) * (width // 16)
    slope = (MAX_SHIFT - BASE_SHIFT) / (MAX_SEQ - BASE_SEQ)
    return math.exp(seq * slope + BASE_SHIFT - slope * BASE_SEQ)
