"""FLUX building blocks: load a diffusers-layout folder, pack latents, ids, encode, velocity, decode.

Works on real FLUX.1-dev folders and on the tiny random-weight folders that
``python -m fastvideo.tools.make_tiny_flux`` writes (same layout, same config keys).

Shapes (FLUX.1-dev): image h x w -> latent [B, 16, h/8, w/8] -> packed [B, (h/16)(w/16), 64].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.errors import UserError
from fastvideo.models import latents as L
from fastvideo.models import parts
from fastvideo.models.base import WEIGHT_SUFFIXES  # noqa: F401 (re-exported)
from fastvideo.models.latents import latent_hw, vae_scale_factor  # noqa: F401 (the family's C.latent_hw, ...)
from fastvideo.models.loading import from_pretrained_checked
from fastvideo.models.parts import model_dtype as _model_dtype

# Sub-folders of a diffusers FLUX folder and the files that must be in each.
REQUIRED_FILES = parts.required_files(2)
FLUX_DOWNLOAD_HINT = parts.download_hint("FLUX.1-dev", "black-forest-labs/FLUX.1-dev", "flux")


class FluxFolderError(UserError, FileNotFoundError):
    """A FLUX model folder is missing or incomplete."""


check_flux_folder = parts.folder_checker(REQUIRED_FILES, FLUX_DOWNLOAD_HINT, FluxFolderError, "FLUX model folder")


def adapt_for_device(transformer, device) -> None:
    """Apply the device-specific kernels (today: NPU only; nothing elsewhere) before wrapping."""
    parts.adapt_for_npu(transformer, device)


def load_transformer(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """FluxTransformer2DModel from ``path/transformer`` (fp32 master weights by default).

    On NPU the attention norms (diffusers' RMSNorm on 0.32, torch.nn.RMSNorm on 0.42), RoPE and attention
    processor are adapted (fastvideo.models.npu_ops).
    """
    from diffusers import FluxTransformer2DModel

    root = check_flux_folder(path, ("transformer",))
    model = from_pretrained_checked(FluxTransformer2DModel, root, "transformer", dtype)
    model.to(device)
    adapt_for_device(model, device)
    return model


def load_vae(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    return parts.load_vae("AutoencoderKL", check_flux_folder, path, device, dtype)


@dataclass
class TextEncoders:
    """CLIP (pooled embedding) and T5 (sequence embedding) encoders with their tokenizers."""

    clip_tokenizer: object
    clip_encoder: torch.nn.Module
    t5_tokenizer: object
    t5_encoder: torch.nn.Module

    @property
    def device(self) -> torch.device:
        return next(self.t5_encoder.parameters()).device


def load_text_encoders(
    path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> TextEncoders:
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

    root = check_flux_folder(path, ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"))
    clip_tok = CLIPTokenizer.from_pretrained(root, subfolder="tokenizer")
    clip = CLIPTextModel.from_pretrained(root, subfolder="text_encoder", torch_dtype=dtype)
    t5_tok = T5TokenizerFast.from_pretrained(root, subfolder="tokenizer_2")
    t5 = T5EncoderModel.from_pretrained(root, subfolder="text_encoder_2", torch_dtype=dtype)
    for enc in (clip, t5):
        enc.requires_grad_(False).eval().to(device)
    return TextEncoders(clip_tok, clip, t5_tok, t5)


@torch.no_grad()
def encode_prompts(
    encoders: TextEncoders, prompts: list[str], max_sequence_length: int = 512
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode prompts the way FluxPipeline does (no attention masks, padded to max length).

    Returns prompt_embeds [B, max_sequence_length, D_t5], pooled [B, D_clip], text_ids [L, 3] (zeros).
    """
    device = encoders.device
    clip_max = encoders.clip_tokenizer.model_max_length
    clip_ids = encoders.clip_tokenizer(
        prompts, padding="max_length", max_length=clip_max, truncation=True, return_tensors="pt"
    ).input_ids.to(device)
    pooled = encoders.clip_encoder(clip_ids, output_hidden_states=False).pooler_output
    t5_ids = encoders.t5_tokenizer(
        prompts, padding="max_length", max_length=max_sequence_length, truncation=True, return_tensors="pt"
    ).input_ids.to(device)
    prompt_embeds = encoders.t5_encoder(t5_ids, output_hidden_states=False)[0]
    text_ids = torch.zeros(max_sequence_length, 3, dtype=prompt_embeds.dtype, device=device)
    return prompt_embeds, pooled, text_ids


def _cfg(config, key):
    return config[key] if isinstance(config, dict) else getattr(config, key)


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/2)(W/2), 4C]: 2x2 patches become tokens (fastvideo.models.latents)."""
    return L.pack_image(latents)


def unpack_latents(packed: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """[B, (H/2)(W/2), 4C] -> [B, C, H, W]; the inverse of pack_latents."""
    return L.unpack_image(packed, latent_h, latent_w)


def image_ids(latent_h: int, latent_w: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """[(H/2)(W/2), 3]: column 0 zero (the frame of a one-frame latent), column 1 the token's row,
    column 2 its column."""
    return L.positions(1, latent_h // 2, latent_w // 2, device=device, dtype=dtype)


def text_ids(seq_len: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """[seq_len, 3] zeros: FLUX gives text tokens no position."""
    return torch.zeros(seq_len, 3, device=device, dtype=dtype)


def unnormalize_latents(latents: torch.Tensor, vae_config) -> torch.Tensor:
    """Undo the VAE's latent normalisation: z / scaling_factor + shift_factor."""
    return L.denormalize_scale_shift(latents, vae_config)


def decode_latents(vae, packed: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """Packed latents [B, L, 64] -> images [B, 3, H, W] float32 in [0, 1]."""
    return L.decode_scale_shift(vae, unpack_latents(packed, latent_h, latent_w))


def has_guidance_embeds(transformer: torch.nn.Module) -> bool:
    """Whether the transformer has FLUX.1-dev's guidance embedding (FLUX.1-schnell has none);
    DDP/FSDP wrappers keep the diffusers model under .module."""
    config = getattr(getattr(transformer, "module", transformer), "config", None)
    return bool(getattr(config, "guidance_embeds", True))


def predict_velocity(
    transformer: torch.nn.Module,
    latents: torch.Tensor,
    sigma: torch.Tensor | float,
    prompt_embeds: torch.Tensor,
    pooled: torch.Tensor,
    text_ids: torch.Tensor,
    image_ids: torch.Tensor,
    guidance_scale: float = 3.5,
    quantize_timestep: bool = True,
) -> torch.Tensor:
    """FLUX velocity v(x, sigma) float32 [B, L, C] for latents [B, L, C].

    sigma: a float, a 0-d tensor or per-sample [B] (the update phase mixes timesteps).
    prompt_embeds [B, Lt, D], pooled [B, P'], text_ids [Lt, 3], image_ids [L, 3].
    The transformer gets timestep = floor(1000 sigma) / 1000 when quantize_timestep (upstream),
    else sigma (diffusers), and guidance = guidance_scale per sample (FLUX.1-dev's guidance
    embedding; there is no classifier-free guidance; none for a model without it, FLUX.1-schnell).
    Pure tensor ops: no host synchronisation.
    """
    b = latents.shape[0]
    if prompt_embeds.shape[0] != b or pooled.shape[0] != b:
        raise ValueError(
            f"batch sizes differ: latents {b}, prompt_embeds {prompt_embeds.shape[0]}, pooled {pooled.shape[0]}"
        )
    sig = parts.per_sample_sigma(sigma, b, latents.device)
    # Same float32 arithmetic as upstream's int(sigma * 1000) / 1000 (sigma > 0, so floor == int).
    timestep = torch.floor(sig * 1000.0) / 1000.0 if quantize_timestep else sig
    guidance = torch.full((b,), float(guidance_scale), dtype=torch.float32, device=latents.device)
    if not has_guidance_embeds(transformer):  # FLUX.1-schnell: no guidance embedding to feed
        guidance = None
    dtype = _model_dtype(transformer)
    out = transformer(
        hidden_states=latents.to(dtype),
        encoder_hidden_states=prompt_embeds.to(dtype),
        pooled_projections=pooled.to(dtype),
        timestep=timestep,
        img_ids=image_ids,
        txt_ids=text_ids,
        guidance=guidance,
        return_dict=False,
    )[0]
    return out.float()
