"""FLUX.2 [klein] editing's own pieces; everything else is FLUX.2's (fastvideo.models.flux2.components).

Flux2KleinPipeline(image=...) reads each reference image as extra latent tokens:

    source image [3, H, W] in [0, 1] -> VAE mode (argmax) -> 2x2 patches (128 channels) -> the
    batch-norm statistics removed -> source tokens [Ls, 128] with ids [Ls, 4] = (10, row, column, 0)
    (the first reference's time coordinate, Flux2KleinPipeline._prepare_image_ids' scale 10)
    several references i = 0..N-1 (image=[...]): each encoded alone, ids (10 + 10 i, row, column, 0),
    the tokens [N Ls, 128] and ids [N Ls, 4] concatenated in order (prepare_image_latents)
    velocity: transformer([x ; source], ids [image ids ; source ids]) -> the first L tokens, for
    the conditional and the unconditional (empty prompt) rows alike
"""

from __future__ import annotations

import torch

import fastvideo.models.flux2.components as C
from fastvideo.models import latents as L

REFERENCE_TIME = 10  # Flux2KleinPipeline._prepare_image_ids: scale + scale * i for reference i = 0
# Flux2ImageProcessor.check_image_input's limits on a reference image, and the area above which
# Flux2KleinPipeline shrinks it (_resize_to_target_area) before encoding
MIN_SOURCE_SIDE, MAX_SOURCE_ASPECT, MAX_SOURCE_AREA = 64, 8, 1024 * 1024


def source_ids(grid_h: int, grid_w: int, device=None) -> torch.Tensor:
    """[h w, 4] = (10, row, column, 0) in row-major order: the first reference image's token ids
    (the generated tokens' time coordinate is 0)."""
    return source_ids_at(C.image_ids(grid_h, grid_w, device), 0)


@torch.no_grad()
def encode_source_latents(vae, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Source images [B, 3, H, W] in [0, 1] (sides multiples of 16) -> (tokens [B, Ls, 128], ids
    [Ls, 4]), as Flux2KleinPipeline.prepare_image_latents (the distribution's mode, patched,
    normalised by the VAE's batch-norm statistics, packed). N references [B, N, 3, H, W] -> tokens
    [B, N Ls, 128] and ids [N Ls, 4], each reference encoded alone with its own time coordinate."""
    if pixels.ndim == 5:
        parts = [encode_source_latents(vae, pixels[:, i]) for i in range(pixels.shape[1])]
        ids = [source_ids_at(part_ids, i) for i, (_, part_ids) in enumerate(parts)]
        return torch.cat([tokens for tokens, _ in parts], dim=1), torch.cat(ids, dim=0)
    dtype = next(vae.parameters()).dtype
    z = vae.encode(pixels.to(dtype) * 2.0 - 1.0).latent_dist.mode()  # VaeImageProcessor.normalize
    z = L.patchify(z.unsqueeze(2)).squeeze(2)
    z = L.normalize_batch_norm(z, *C.latent_statistics(vae))
    grid_h, grid_w = z.shape[-2:]
    return L.to_tokens(z), source_ids(grid_h, grid_w, z.device)


def source_ids_at(ids: torch.Tensor, index: int) -> torch.Tensor:
    """Token ids [Ls, 4] at reference ``index``'s time coordinate (10 + 10 index: _prepare_image_ids)."""
    ids = ids.clone()
    ids[:, 0] = REFERENCE_TIME + REFERENCE_TIME * index
    return ids


def reference_count(ids: torch.Tensor) -> int:
    """The reference images whose tokens ``ids`` [Ls, 4] hold: their distinct time coordinates."""
    return int(torch.unique(ids[:, 0]).numel())


def edit_velocity(transformer, x: torch.Tensor, sigma, cond, image_ids: torch.Tensor, guidance_scale: float,
                  quantize_timestep: bool) -> torch.Tensor:
    """v(x, sigma) float32 [B, L, C] of the generated tokens x [B, L, C]: FLUX.2's velocity (true CFG
    included) on [x ; cond's source tokens] with [image_ids ; source ids], the first L tokens kept."""
    src = cond["image_latents"]
    if src.shape[0] != x.shape[0] or src.shape[2] != x.shape[2]:
        raise ValueError(f"source latents {tuple(src.shape)} do not fit latents {tuple(x.shape)}")
    ids = torch.cat([image_ids, cond["source_ids"].to(image_ids)], dim=0)
    v = C.predict_velocity(transformer, torch.cat([x, src.to(x.dtype)], dim=1), sigma, cond["prompt_embeds"],
                           cond["neg_prompt_embeds"], ids, guidance_scale, quantize_timestep)
    return v[:, : x.shape[1]]
