"""Z-Image building blocks: folder check, loading, Qwen3 prompt encoding, the (guided) velocity,
the scheduler's shift and decoding.

Works on real Z-Image folders (Tongyi-MAI/Z-Image, Z-Image-Turbo) and on the tiny ones
``python -m fastvideo.tools.make_tiny_zimage`` writes. Everything that names diffusers' or
transformers' Z-Image / Qwen3 classes imports them inside a function: this module is imported on
the recipe line too (the registry), where those classes do not exist.

Shapes: image h x w -> VAE latent [B, 16, h/8, w/8] (FLUX.1's AutoencoderKL, z = (x - shift) x
scale; the pipeline draws its noise there) -> packed here as FLUX.1's 2x2-patch tokens
[B, (h/16)(w/16), 64] (the sampler's layout; the transformer gets the unpacked grid as the pipeline
gives it). Text: the Qwen3 hidden states of the second-to-last layer under the chat template (thinking
on, as ZImagePipeline), padded to max_sequence_length: prompt_embeds [B, L, H] (H = 2560 for
Qwen3-4B) with prompt_mask [B, L] (1 on the prompt's tokens): the pipeline passes each prompt's
unpadded tokens, the mask recovers them exactly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from fastvideo.errors import UserError
from fastvideo.models import latents as L
from fastvideo.models import parts, qwen3_text
from fastvideo.models.latents import latent_hw  # noqa: F401 (the family's C.latent_hw: both sides multiples of 16)
from fastvideo.models.parts import model_dtype as _model_dtype
from fastvideo.models.qwen3_text import TextEncoder

# The sampler holds FLUX.1's 2x2-patch tokens; decode is FLUX.1's (the same 16-channel AutoencoderKL:
# z / scaling_factor + shift_factor, the decoder, as the pipeline's non-latent path).
pack_latents, unpack_latents = L.pack_image, L.unpack_image

# ZImagePipeline's defaults (diffusers 0.42.1 pipeline_z_image.py).
HIDDEN_LAYER = -2  # encode_prompt reads hidden_states[-2]
DEFAULT_GUIDANCE = 5.0  # __call__'s guidance_scale; guidance is on for any scale > 0
SEQUENCE_MULTIPLE = 32  # transformer_z_image.SEQ_MULTI_OF: the forward pads each stream to a multiple of it
REQUIRED_FILES = parts.ONE_ENCODER_FILES
ZIMAGE_DOWNLOAD_HINT = parts.download_hint("Z-Image", "Tongyi-MAI/Z-Image", "zimage")


class ZImageFolderError(UserError, FileNotFoundError):
    """A Z-Image model folder is missing, incomplete or not what the flags say."""


check_zimage_folder = parts.folder_checker(REQUIRED_FILES, ZIMAGE_DOWNLOAD_HINT, ZImageFolderError,
                                           "Z-Image model folder")


def load_transformer(root, subfolder, device, dtype):
    return parts.load_transformer("ZImageTransformer2DModel", check_zimage_folder, adapt_for_device, root,
                                  subfolder, device, dtype)


def load_vae(path, device="cpu", dtype=torch.float32):
    return parts.load_vae("AutoencoderKL", check_zimage_folder, path, device, dtype)


def adapt_for_device(transformer, device) -> None:
    """On an NPU: npu_ops' fused RMSNorm for every RMS norm (the blocks' four norms, q/k norms, the
    caption embedder's), Z-Image's RoPE in real arithmetic and its masked attention through the
    device adapter. Elsewhere nothing."""
    from fastvideo.models.zimage.npu import adapt_zimage_for_npu  # here: it imports diffusers

    parts.adapt_for_npu(transformer, device, adapt_zimage_for_npu)


def load_text_encoder(path, device="cpu", dtype=torch.float32) -> TextEncoder:
    """The folder's Qwen3 decoder (without a head) and its tokenizer."""
    return qwen3_text.load_text_encoder(check_zimage_folder(path, ("text_encoder", "tokenizer")), device, dtype)


def encode_prompts(enc: TextEncoder, prompts: list[str], max_sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As ZImagePipeline._encode_prompt (chat template with thinking on, hidden_states[-2]) ->
    (prompt_embeds [B, L, H] in the encoder's dtype, zero past each prompt's tokens; prompt_mask
    [B, L] in the same dtype, 1 on the tokens the pipeline keeps)."""
    states, mask = qwen3_text.hidden_states(enc, list(prompts), max_sequence_length, enable_thinking=True)
    embeds = states[HIDDEN_LAYER]
    keep = mask.to(embeds.dtype)
    return embeds * keep[..., None], keep


def caption_list(embeds: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """[B, L, D] and [B, L] -> B tensors [L_i, D]: each prompt's own tokens (what the pipeline passes)."""
    return [e[m > 0.5] for e, m in zip(embeds, mask)]


# ---------------------------------------------------------------- geometry and schedule
_cfg = parts.cfg


def calculate_mu(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
                 base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """The pipeline's mu: a straight line in the image token count through (base_seq_len, base_shift)
    and (max_seq_len, max_shift)."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * slope + (base_shift - slope * base_seq_len)


def read_scheduler_config(root: str | Path) -> dict:
    """root/scheduler/scheduler_config.json (a ZImageFolderError when unreadable)."""
    path = Path(root) / "scheduler" / "scheduler_config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ZImageFolderError(f"cannot read {path} ({exc}). {ZIMAGE_DOWNLOAD_HINT}") from None


def scheduler_shift(scheduler_config: dict, height: int, width: int) -> float:
    """The shift s of the schedule s t / (1 + (s - 1) t) the pipeline's scheduler gives its linear
    sigmas at this image size: the config's static ``shift`` (Z-Image and Z-Image-Turbo ship
    use_dynamic_shifting false, shift 3.0, so the mu the pipeline computes is not used), or, with
    dynamic shifting, exp(mu) of the image's token count (the exponential time shift is that schedule)."""
    if not scheduler_config.get("use_dynamic_shifting", False):
        return float(scheduler_config.get("shift", 1.0))
    lh, lw = latent_hw(height, width)
    mu = calculate_mu((lh // 2) * (lw // 2), scheduler_config.get("base_image_seq_len", 256),
                      scheduler_config.get("max_image_seq_len", 4096), scheduler_config.get("base_shift", 0.5),
                      scheduler_config.get("max_shift", 1.15))
    return math.exp(mu)


# ---------------------------------------------------------------- velocity and decode
def timesteps(sigma, batch: int, device, quantize: bool = False) -> torch.Tensor:
    """The transformer's t [B] float32: the pipeline's (1000 - scheduler timestep) / 1000 with the
    timestep 1000 sigma (Z-Image's t runs from 0 at noise to 1 at the image), or floor(1000 sigma)
    with ``quantize`` (DanceGRPO's convention)."""
    timestep = parts.per_sample_sigma(sigma, batch, device) * 1000.0
    return (1000.0 - (torch.floor(timestep) if quantize else timestep)) / 1000.0


def predict_velocity(transformer, x, sigma, embeds, mask, neg_embeds, neg_mask, latent_h: int, latent_w: int,
                     guidance_scale: float, quantize_timestep: bool = False) -> torch.Tensor:
    """The flow-matching velocity float32 [B, L, 64] for packed latents x [B, L, 64]; embeds [B, Lt, D]
    with mask [B, Lt]; neg_embeds [Lt, D] with neg_mask [Lt] (the empty prompt's).

    As ZImagePipeline: the transformer predicts the negated velocity on the unpacked grid, one
    [16, 1, h, w] latent and one unpadded caption per sample; guidance_scale > 0 runs the
    conditional rows then the unconditional ones in the same call and combines them as
    v_c + s (v_c - v_u) (the pipeline's convention: scale 0 is no guidance, its default 5.0 is
    FLUX's 6.0). Both rows carry gradient in the update."""
    b = x.shape[0]
    if embeds.shape[0] != b:
        raise ValueError(f"batch sizes differ: latents {b}, prompt_embeds {embeds.shape[0]}")
    dtype = _model_dtype(transformer)
    t = timesteps(sigma, b, x.device, quantize_timestep)
    latents = list(unpack_latents(x, latent_h, latent_w).to(dtype).unsqueeze(2).unbind(0))  # B x [16, 1, h, w]
    captions = caption_list(embeds.to(dtype), mask)
    guided = guidance_scale > 0
    if guided:
        negative = neg_embeds.to(embeds.device, dtype)[neg_mask.to(embeds.device) > 0.5]
        latents, captions, t = latents + latents, captions + [negative] * b, torch.cat([t, t])
    out = transformer(latents, t, captions, return_dict=False)[0]
    pred = torch.stack([o.float() for o in out]).squeeze(2)  # [B (or 2B), 16, h, w]
    if guided:
        pos, neg = pred[:b], pred[b:]
        pred = pos + guidance_scale * (pos - neg)
    return pack_latents(-pred)



def decode_latents(vae, packed: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """Packed latents [B, L, 64] -> images [B, 3, H, W] float32 in [0, 1]: the 16-channel AutoencoderKL's
    z / scaling_factor + shift_factor and the decoder (as the pipeline's non-latent path)."""
    return L.decode_scale_shift(vae, unpack_latents(packed, latent_h, latent_w))
