"""Latents of the diffusers families, written once: 2x2 patches <-> tokens, token positions, and the
VAE normalisation variants. Frames are a first-class dimension.

Layout: a VAE latent is z [B, C, F, H, W] (F frames; F = 1 for an image, H x W the latent grid, the
image's h/8 x w/8). A 2x2 patch of latent cells becomes one token of 4C features, channel
c * 4 + 2 i + j holding cell (2 y + i, 2 x + j); tokens run frame by frame, row by row:

    pack:      [B, C, F, H, W] -> [B, F (H/2)(W/2), 4C]        (FLUX.1, Qwen-Image, Z-Image's sampler)
    patchify:  [B, C, F, H, W] -> [B, 4C, F, H/2, W/2]         (FLUX.2 normalises here, then to_tokens)
    to_tokens: [B, C, *grid]   -> [B, prod(grid), C]           (channels last; SD3's layout, FLUX.2's)

``pack`` is ``to_tokens(patchify(z))``; every function here is a pure permutation of elements or an
element-wise formula, so the image helpers (``*_image``, [B, C, H, W] in and out, for today's image
callers) give the same bits as the 4-D code the families had before.

VAE normalisation (what a latent is before the transformer sees it; ``denormalize_*`` is what the
decoder is given):

    scale/shift (FLUX.1, SD3, Z-Image; AutoencoderKL):          (z - shift) * scale,  z / scale + shift
    per-channel mean/std (Qwen-Image, Wan; video VAEs):          (z - mean) / std,     z / (1 / std) + mean
    batch-norm statistics (FLUX.2; on the 2x2-patched latent):   (z - mean) / std,     z * std + mean
                                                                 with std = sqrt(running_var + eps)

The per-channel statistics broadcast over channel dim 1 of a latent of any rank.
"""

from __future__ import annotations

from typing import Sequence

import torch

from fastvideo.errors import ConfigError


# ---------------------------------------------------------------- geometry
def latent_hw(height: int, width: int, scale: int = 8) -> tuple[int, int]:
    """The latent grid (H, W) of an image height x width; both sides must be multiples of 2 * scale
    (a 2x2 patch of latent cells per token: 16 pixels for an 8x VAE)."""
    if height % (2 * scale) or width % (2 * scale):
        # ConfigError (a ValueError): the sizes come from --h/--w, so a run ends with this one line, exit 2
        raise ConfigError(f"image size {height}x{width} must be a multiple of {2 * scale} on both sides for this "
                          f"model ({scale} pixels a latent cell, 2x2 cells a token): choose --h/--w multiples "
                          f"of {2 * scale}")
    return height // scale, width // scale


def token_grid_hw(height: int, width: int, scale: int = 8) -> tuple[int, int]:
    """The token grid (H/2, W/2) of an image: one token per 2x2 patch of latent cells."""
    lh, lw = latent_hw(height, width, scale)
    return lh // 2, lw // 2


def vae_scale_factor(vae_config) -> int:
    """Pixels per latent cell (8 for every family today): 2 ** (number of VAE blocks - 1)."""
    blocks = vae_config["block_out_channels"] if isinstance(vae_config, dict) else vae_config.block_out_channels
    return 2 ** (len(blocks) - 1)


# ---------------------------------------------------------------- patches and tokens
def pack(z: torch.Tensor) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, F (H/2)(W/2), 4C]: each 2x2 patch of a frame becomes a token
    (diffusers' FluxPipeline._pack_latents for F = 1; QwenImagePipeline's on its [B, C, 1, H, W])."""
    b, c, f, h, w = z.shape
    x = z.reshape(b, c, f, h // 2, 2, w // 2, 2).permute(0, 2, 3, 5, 1, 4, 6)
    return x.reshape(b, f * (h // 2) * (w // 2), c * 4)


def unpack(x: torch.Tensor, frames: int, latent_h: int, latent_w: int) -> torch.Tensor:
    """[B, F (H/2)(W/2), 4C] -> [B, C, F, H, W]; the inverse of pack."""
    b, length, c4 = x.shape
    if length != frames * (latent_h // 2) * (latent_w // 2):
        raise ValueError(f"{length} tokens do not make {frames} frame(s) of a {latent_h}x{latent_w} latent grid")
    c = c4 // 4
    z = x.reshape(b, frames, latent_h // 2, latent_w // 2, c, 2, 2).permute(0, 4, 1, 2, 5, 3, 6)
    return z.reshape(b, c, frames, latent_h, latent_w)


def pack_image(z: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/2)(W/2), 4C]: pack of the one-frame latent (FLUX.1's packing)."""
    return pack(z.unsqueeze(2))


def unpack_image(x: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """[B, (H/2)(W/2), 4C] -> [B, C, H, W]; the inverse of pack_image."""
    return unpack(x, 1, latent_h, latent_w).squeeze(2)


def patchify(z: torch.Tensor) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, 4C, F, H/2, W/2]: channel c * 4 + 2 i + j holds cell (2 y + i, 2 x + j)
    (Flux2Pipeline._patchify_latents for F = 1)."""
    b, c, f, h, w = z.shape
    x = z.reshape(b, c, f, h // 2, 2, w // 2, 2).permute(0, 1, 4, 6, 2, 3, 5)
    return x.reshape(b, c * 4, f, h // 2, w // 2)


def unpatchify(z: torch.Tensor) -> torch.Tensor:
    """[B, 4C, F, h, w] -> [B, C, F, 2h, 2w]; the inverse of patchify."""
    b, c4, f, h, w = z.shape
    x = z.reshape(b, c4 // 4, 2, 2, f, h, w).permute(0, 1, 4, 5, 2, 6, 3)
    return x.reshape(b, c4 // 4, f, 2 * h, 2 * w)


def unpatchify_image(z: torch.Tensor) -> torch.Tensor:
    """[B, 4C, h, w] -> [B, C, 2h, 2w] (Flux2Pipeline._unpatchify_latents)."""
    return unpatchify(z.unsqueeze(2)).squeeze(2)


def to_tokens(z: torch.Tensor) -> torch.Tensor:
    """[B, C, *grid] -> [B, prod(grid), C]: one token per cell, channels last (a view)."""
    return z.flatten(2).transpose(1, 2)


def from_tokens(x: torch.Tensor, *grid: int) -> torch.Tensor:
    """[B, prod(grid), C] -> [B, C, *grid] with grid (F, H, W) or (H, W); the inverse of to_tokens."""
    b, length, c = x.shape
    if length != _prod(grid):
        raise ValueError(f"{length} tokens do not make a {'x'.join(map(str, grid))} grid")
    return x.transpose(1, 2).reshape(b, c, *grid)


def _prod(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


# ---------------------------------------------------------------- positions
def positions(frames: int, h: int, w: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """[F h w, 3]: each token's (frame, row, column) on an F x h x w token grid, in token order.
    FLUX.1's image ids are positions(1, h, w) (column 0 is the frame: 0 for an image)."""
    f_ = torch.arange(frames, device=device, dtype=dtype).view(frames, 1, 1).expand(frames, h, w)
    rows = torch.arange(h, device=device, dtype=dtype).view(1, h, 1).expand(frames, h, w)
    cols = torch.arange(w, device=device, dtype=dtype).view(1, 1, w).expand(frames, h, w)
    return torch.stack([f_, rows, cols], dim=-1).reshape(frames * h * w, 3)


# ---------------------------------------------------------------- VAE normalisation
def _cfg(config, key, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def scale_shift(vae_config) -> tuple[float, float]:
    """(scaling_factor, shift_factor or 0.0) of an AutoencoderKL config (FLUX.1, SD3, Z-Image)."""
    return _cfg(vae_config, "scaling_factor"), (_cfg(vae_config, "shift_factor") or 0.0)


def normalize_scale_shift(z: torch.Tensor, vae_config) -> torch.Tensor:
    """The encoder's latent -> the transformer's: (z - shift) * scale (the pipelines' encode)."""
    scale, shift = scale_shift(vae_config)
    return (z - shift) * scale


def denormalize_scale_shift(z: torch.Tensor, vae_config) -> torch.Tensor:
    """The transformer's latent -> the decoder's: z / scale + shift (the pipelines' decode)."""
    scale, shift = scale_shift(vae_config)
    return z / scale + shift


def channel_view(values, like: torch.Tensor) -> torch.Tensor:
    """Per-channel statistics (a sequence or a tensor of C values) as [1, C, 1, ...] with like's rank,
    device and dtype, to broadcast over channel dim 1."""
    stats = torch.as_tensor(values) if not isinstance(values, torch.Tensor) else values
    return stats.view(1, -1, *([1] * (like.ndim - 2))).to(like.device, like.dtype)


def normalize_mean_std(z: torch.Tensor, mean, std) -> torch.Tensor:
    """(z - mean) / std per channel (QwenImageEditPlusPipeline._encode_vae_image; Wan's encode)."""
    return (z - channel_view(mean, z)) / channel_view(std, z)


def denormalize_mean_std(z: torch.Tensor, mean, std) -> torch.Tensor:
    """z / (1 / std) + mean per channel, the pipelines' own arithmetic (QwenImagePipeline's and
    WanPipeline's decode divide by latents_std = 1 / std, computed in z's dtype)."""
    inv_std = 1.0 / channel_view(std, z)
    return z / inv_std + channel_view(mean, z)


def batch_norm_stats(vae, ndim: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """FLUX.2's VAE batch-norm running mean and std = sqrt(running_var + batch_norm_eps) of the
    patched latent, each [1, 4C, 1, ...] of rank ``ndim`` (5: [1, 4C, 1, 1, 1]; 4 for an image's
    [B, 4C, h, w]), on the VAE's device and dtype."""
    bn = vae.bn
    shape = (1, -1, *([1] * (ndim - 2)))
    mean = bn.running_mean.view(shape)
    std = torch.sqrt(bn.running_var.view(shape) + _cfg(vae.config, "batch_norm_eps"))
    return mean, std


def normalize_batch_norm(z: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(z - mean) / std on the patched latent (Flux2Pipeline's encode of a reference image)."""
    return (z - mean.to(z.device, z.dtype)) / std.to(z.device, z.dtype)


def denormalize_batch_norm(z: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """z * std + mean on the patched latent (Flux2Pipeline's decode)."""
    return z * std.to(z.device, z.dtype) + mean.to(z.device, z.dtype)


def to_unit_range(image: torch.Tensor) -> torch.Tensor:
    """A decoder's output in [-1, 1] -> float32 in [0, 1] (VaeImageProcessor's denormalize)."""
    return (image.float() / 2 + 0.5).clamp(0, 1)


def decode_scale_shift(vae, z: torch.Tensor) -> torch.Tensor:
    """An AutoencoderKL's normalised latent z [B, C, H, W] -> images [B, 3, 8H, 8W] float32 in [0, 1]:
    z / scale + shift, cast to the VAE's dtype, decoded (the pipelines' non-latent output path)."""
    z = denormalize_scale_shift(z, vae.config).to(dtype=next(vae.parameters()).dtype)
    return to_unit_range(vae.decode(z, return_dict=False)[0])
