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
from fastvideo.models.base import WEIGHT_SUFFIXES, check_diffusers_folder  # noqa: F401 (WEIGHT_SUFFIXES: re-exported)
from fastvideo.models.loading import from_pretrained_checked

# Sub-folders of a diffusers FLUX folder and the files that must be in each.
REQUIRED_FILES = {
    "transformer": ["config.json"],
    "vae": ["config.json"],
    "text_encoder": ["config.json"],
    "tokenizer": [],
    "text_encoder_2": ["config.json"],
    "tokenizer_2": [],
    "scheduler": ["scheduler_config.json"],
}
FLUX_DOWNLOAD_HINT = (
    "Put a diffusers-layout FLUX.1-dev folder there (for example the black-forest-labs/FLUX.1-dev "
    "repository, downloaded to data/flux), or build a tiny test model with "
    "`python -m fastvideo.tools.make_tiny_flux data/flux`."
)


class FluxFolderError(UserError, FileNotFoundError):
    """A FLUX model folder is missing or incomplete."""


def check_flux_folder(path: str | Path, components: tuple[str, ...] | None = None) -> Path:
    """Check that ``path`` is a diffusers FLUX folder holding ``components`` (default: all).

    Raises FluxFolderError naming every missing piece and how to get it.
    """
    return check_diffusers_folder(path, REQUIRED_FILES, FLUX_DOWNLOAD_HINT, FluxFolderError, "FLUX model folder",
                                  components)


def adapt_for_device(transformer, device) -> None:
    """Apply the device-specific kernels (today: NPU only; nothing elsewhere) before wrapping."""
    from fastvideo import devices

    if devices.is_npu(device):
        # Imported lazily: npu_ops is the one module besides fastvideo.devices allowed to name the NPU stack.
        from fastvideo.models import npu_ops

        npu_ops.maybe_adapt_for_npu(transformer, device)


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
    from diffusers import AutoencoderKL

    root = check_flux_folder(path, ("vae",))
    vae = AutoencoderKL.from_pretrained(root, subfolder="vae", torch_dtype=dtype)
    vae.requires_grad_(False).eval().to(device)
    return vae


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


def vae_scale_factor(vae_config) -> int:
    """Pixels per latent cell (8 for FLUX): 2 ** (number of VAE blocks - 1)."""
    return 2 ** (len(_cfg(vae_config, "block_out_channels")) - 1)


def _cfg(config, key):
    return config[key] if isinstance(config, dict) else getattr(config, key)


def latent_hw(height: int, width: int, scale: int = 8) -> tuple[int, int]:
    """Latent grid size for an image; both sides must be multiples of 2 * scale (16 for FLUX)."""
    if height % (2 * scale) or width % (2 * scale):
        raise ValueError(f"image size {height}x{width} must be a multiple of {2 * scale} on both sides")
    return height // scale, width // scale


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/2)(W/2), 4C]: 2x2 patches become tokens."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(packed: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """[B, (H/2)(W/2), 4C] -> [B, C, H, W]; the inverse of pack_latents."""
    b, length, c4 = packed.shape
    if length != (latent_h // 2) * (latent_w // 2):
        raise ValueError(f"{length} tokens do not make a {latent_h}x{latent_w} latent grid")
    c = c4 // 4
    x = packed.view(b, latent_h // 2, latent_w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, latent_h, latent_w)


def image_ids(latent_h: int, latent_w: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """[(H/2)(W/2), 3]: column 0 zero, column 1 the token's row, column 2 its column."""
    h, w = latent_h // 2, latent_w // 2
    rows = torch.arange(h, device=device, dtype=dtype).view(h, 1).expand(h, w)
    cols = torch.arange(w, device=device, dtype=dtype).view(1, w).expand(h, w)
    return torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(h * w, 3)


def text_ids(seq_len: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """[seq_len, 3] zeros: FLUX gives text tokens no position."""
    return torch.zeros(seq_len, 3, device=device, dtype=dtype)


def unnormalize_latents(latents: torch.Tensor, vae_config) -> torch.Tensor:
    """Undo the VAE's latent normalisation: z / scaling_factor + shift_factor."""
    shift = _cfg(vae_config, "shift_factor") or 0.0
    return latents / _cfg(vae_config, "scaling_factor") + shift


def decode_latents(vae, packed: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """Packed latents [B, L, 64] -> images [B, 3, H, W] float32 in [0, 1]."""
    z = unnormalize_latents(unpack_latents(packed, latent_h, latent_w), vae.config)
    z = z.to(dtype=next(vae.parameters()).dtype)
    image = vae.decode(z, return_dict=False)[0]
    return (image.float() / 2 + 0.5).clamp(0, 1)


def _model_dtype(module: torch.nn.Module) -> torch.dtype:
    dtype = getattr(module, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else next(module.parameters()).dtype


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
    sig = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device)
    sig = sig.expand(b) if sig.ndim == 0 else sig.reshape(b)
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
