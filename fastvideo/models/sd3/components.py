"""Stable Diffusion 3 / 3.5 building blocks: folder check, loading, the three text encoders, latent
layout, the (classifier-free guided) velocity and decoding.

Works on real SD3/SD3.5 folders (stabilityai/stable-diffusion-3.5-medium) and on the tiny ones
``python -m fastvideo.tools.make_tiny_sd3`` writes. Shapes: image h x w -> VAE latent
[B, 16, h/8, w/8]; the rollout holds it channels-last as [B, (h/8)(w/8), 16] (one "token" per latent
cell; the transformer patchifies 2x2 itself). Text: CLIP-L and CLIP-G penultimate hidden states
concatenated [B, 77, 768 + 1280], zero-padded to T5's width and followed by T5's [B, L, 4096]:
prompt_embeds [B, 77 + L, 4096]; pooled: the two CLIP projections [B, 768 + 1280].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastvideo.errors import UserError
from fastvideo.models import latents as L
from fastvideo.models import parts
from fastvideo.models.latents import latent_hw  # noqa: F401 (the family's C.latent_hw)
from fastvideo.models.parts import model_dtype as _model_dtype

CLIP_TOKENS = 77  # both CLIP tokenizers' model_max_length; SD3's prompt embedding starts with them
REQUIRED_FILES = parts.required_files(3)
SD3_DOWNLOAD_HINT = parts.download_hint("SD3.5", "stabilityai/stable-diffusion-3.5-medium", "sd3")


class SD3FolderError(UserError, FileNotFoundError):
    """An SD3 model folder is missing or incomplete."""


check_sd3_folder = parts.folder_checker(REQUIRED_FILES, SD3_DOWNLOAD_HINT, SD3FolderError, "SD3 model folder")


def adapt_for_device(transformer, device) -> None:
    """On an NPU: the fused RMSNorm kernel for SD3.5's q/k norms (npu_ops swaps every RMS norm, of
    either class; SD3.5's are diffusers' RMSNorm on both library lines, and SD3 has no RoPE and no
    FLUX processor, so nothing else changes). Elsewhere nothing."""
    parts.adapt_for_npu(transformer, device)


def load_transformer(root, subfolder, device, dtype):
    from diffusers import SD3Transformer2DModel

    if subfolder is not None:
        check_sd3_folder(root, (subfolder,))
    from fastvideo.models.loading import from_pretrained_checked

    model = from_pretrained_checked(SD3Transformer2DModel, root, subfolder, dtype).to(device)
    adapt_for_device(model, device)
    return model


def load_vae(path, device="cpu", dtype=torch.float32):
    return parts.load_vae("AutoencoderKL", check_sd3_folder, path, device, dtype)


@dataclass
class TextEncoders:
    """CLIP-L, CLIP-G (CLIPTextModelWithProjection) and T5 with their tokenizers."""

    tokenizers: tuple
    clip_l: torch.nn.Module
    clip_g: torch.nn.Module
    t5: torch.nn.Module

    @property
    def device(self) -> torch.device:
        return next(self.t5.parameters()).device


def load_text_encoders(path, device="cpu", dtype=torch.float32) -> TextEncoders:
    from transformers import CLIPTextModelWithProjection, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

    root = check_sd3_folder(path, ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
                                   "text_encoder_3", "tokenizer_3"))
    toks = (CLIPTokenizer.from_pretrained(root, subfolder="tokenizer"),
            CLIPTokenizer.from_pretrained(root, subfolder="tokenizer_2"),
            T5TokenizerFast.from_pretrained(root, subfolder="tokenizer_3"))
    encs = [CLIPTextModelWithProjection.from_pretrained(root, subfolder="text_encoder", torch_dtype=dtype),
            CLIPTextModelWithProjection.from_pretrained(root, subfolder="text_encoder_2", torch_dtype=dtype),
            T5EncoderModel.from_pretrained(root, subfolder="text_encoder_3", torch_dtype=dtype)]
    for enc in encs:
        enc.requires_grad_(False).eval().to(device)
    return TextEncoders(toks, *encs)


def _clip(tokenizer, encoder, prompts, device):
    ids = tokenizer(prompts, padding="max_length", max_length=CLIP_TOKENS, truncation=True,
                    return_tensors="pt").input_ids.to(device)
    out = encoder(ids, output_hidden_states=True)
    return out.hidden_states[-2], out[0]  # penultimate layer [B, 77, W], projection [B, W]


@torch.no_grad()
def encode_prompts(enc: TextEncoders, prompts: list[str], max_sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As StableDiffusion3Pipeline.encode_prompt (clip_skip None): prompt_embeds [B, 77 + L, D_t5]
    and pooled [B, W_l + W_g]."""
    device = enc.device
    seq_l, pool_l = _clip(enc.tokenizers[0], enc.clip_l, prompts, device)
    seq_g, pool_g = _clip(enc.tokenizers[1], enc.clip_g, prompts, device)
    t5_ids = enc.tokenizers[2](prompts, padding="max_length", max_length=max_sequence_length, truncation=True,
                               add_special_tokens=True, return_tensors="pt").input_ids.to(device)
    t5 = enc.t5(t5_ids)[0]
    clip = torch.cat([seq_l, seq_g], dim=-1)
    clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
    return torch.cat([clip, t5.to(clip.dtype)], dim=-2), torch.cat([pool_l, pool_g], dim=-1)


_cfg = parts.cfg


def to_grid(x: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """Channels-last latents [B, h*w, C] -> the VAE/transformer layout [B, C, h, w]."""
    return L.from_tokens(x, latent_h, latent_w)


def from_grid(z: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, h*w, C]; the inverse of to_grid."""
    return L.to_tokens(z)


def timesteps(sigma, batch: int, device, quantize: bool) -> torch.Tensor:
    """The transformer's timestep [B] float32: 1000 sigma (StableDiffusion3Pipeline's scheduler
    timesteps, Flow-GRPO), or floor(1000 sigma) with ``quantize`` (DanceGRPO's convention)."""
    t = parts.per_sample_sigma(sigma, batch, device) * 1000.0
    return torch.floor(t) if quantize else t


def predict_velocity(transformer, x, sigma, embeds, pooled, neg_embeds, neg_pooled, latent_h: int, latent_w: int,
                     guidance_scale: float, quantize_timestep: bool) -> torch.Tensor:
    """SD3 velocity float32 [B, L, C] for channels-last latents x [B, L, C].

    embeds [B, Lt, D], pooled [B, P]; with guidance_scale > 1 (classifier-free guidance, as
    StableDiffusion3Pipeline and Flow-GRPO decide) the empty prompt's neg_embeds [Lt, D] /
    neg_pooled [P] run in the same batch (unconditional rows first, as the pipeline) and
    v = v_u + s (v_c - v_u) with v_u detached (Flow-GRPO); otherwise one conditional pass and the
    negatives are unused."""
    b = x.shape[0]
    if embeds.shape[0] != b or pooled.shape[0] != b:
        raise ValueError(f"batch sizes differ: latents {b}, prompt_embeds {embeds.shape[0]}, pooled {pooled.shape[0]}")
    dtype = _model_dtype(transformer)
    grid = to_grid(x, latent_h, latent_w).to(dtype)
    t = timesteps(sigma, b, x.device, quantize_timestep)
    guided = guidance_scale > 1.0
    if guided:
        grid, t = torch.cat([grid, grid]), torch.cat([t, t])
        embeds = torch.cat([neg_embeds.to(embeds.device, embeds.dtype).expand(b, *embeds.shape[1:]), embeds])
        pooled = torch.cat([neg_pooled.to(pooled.device, pooled.dtype).expand(b, *pooled.shape[1:]), pooled])
    out = transformer(hidden_states=grid, encoder_hidden_states=embeds.to(dtype), pooled_projections=pooled.to(dtype),
                      timestep=t, return_dict=False)[0]
    v = from_grid(out.float())
    if guided:
        v_u, v_c = v.chunk(2)
        # Flow-GRPO's compute_log_prob detaches the unconditional prediction: the update's
        # gradient flows through the conditional rows only (the value is unchanged).
        v_u = v_u.detach()
        v = v_u + guidance_scale * (v_c - v_u)
    return v


def decode_latents(vae, x: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """Channels-last latents [B, L, 16] -> images [B, 3, H, W] float32 in [0, 1] (z / scaling + shift)."""
    return L.decode_scale_shift(vae, to_grid(x, latent_h, latent_w))
