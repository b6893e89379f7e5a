"""Qwen-Image building blocks: folder check, loading, Qwen2.5-VL prompt encoding, the (true-CFG)
velocity, the scheduler's size-dependent shift and decoding.

Works on real Qwen-Image folders (Qwen/Qwen-Image, diffusers layout) and on the tiny ones
``python -m fastvideo.tools.make_tiny_qwen_image`` writes. Everything that names diffusers' or
transformers' Qwen-Image / Qwen2.5-VL classes imports them inside a function: this module is
imported on the recipe line too (the registry), where those classes do not exist.

Shapes: image h x w -> AutoencoderKLQwenImage latent [B, 16, 1, h/8, w/8] (a video VAE: one frame;
normalised per channel, (z - latents_mean) / latents_std) -> packed [B, (h/16)(w/16), 64] (FLUX.1's
2x2 patches; QwenImagePipeline draws its noise in this layout and the transformer takes it as it
is). Text: the last hidden layer of Qwen2.5-VL on the prompt inside the pipeline's system template,
its first 34 tokens (the template's prefix) dropped: prompt_embeds [B, L, H] (H = 3584 for the 7B)
zero past each prompt's tokens, with prompt_mask [B, L] (1 on them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fastvideo.errors import UserError
from fastvideo.models import latents as L
from fastvideo.models import parts
from fastvideo.models.latents import latent_hw  # noqa: F401 (the family's C.latent_hw)
from fastvideo.models.parts import model_dtype as _model_dtype

# QwenImagePipeline's _pack_latents / _unpack_latents are FLUX.1's 2x2 packing with a frame axis of 1.
pack_latents, unpack_latents = L.pack_image, L.unpack_image

# QwenImagePipeline's constants (diffusers 0.42.1 pipeline_qwenimage.py).
PROMPT_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
                   "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}"
                   "<|im_end|>\n<|im_start|>assistant\n")
TEMPLATE_START_IDX = 34  # prompt_template_encode_start_idx: the template's prefix tokens, dropped
TOKENIZER_MAX_LENGTH = 1024  # tokenizer_max_length (the prompt's tokens after the prefix)
DEFAULT_TRUE_CFG = 4.0  # __call__'s true_cfg_scale; guidance is on for a scale > 1 with a negative prompt
# The negative prompt (the pipeline has none by default, so no guidance; Qwen-Image's model card and
# the pipeline's doc pass " ": "even an empty negative prompt like ' ' enables classifier-free guidance").
NEGATIVE_PROMPT = " "
# Qwen/Qwen-Image's scheduler/scheduler_config.json: the size-dependent shift's line.
# Qwen/Qwen-Image's scheduler_config.json shift_terminal: the scheduler stretches the shifted sigmas
# so that the last non-zero one is this (FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal).
SCHEDULER_SHIFT_TERMINAL = 0.02
SCHEDULER_SHIFT_DEFAULTS = {"base_image_seq_len": 256, "max_image_seq_len": 8192, "base_shift": 0.5, "max_shift": 0.9}
REQUIRED_FILES = parts.ONE_ENCODER_FILES
QWEN_IMAGE_DOWNLOAD_HINT = parts.download_hint("Qwen-Image", "Qwen/Qwen-Image", "qwen_image")


class QwenImageFolderError(UserError, FileNotFoundError):
    """A Qwen-Image model folder is missing, incomplete or not what the flags say."""


check_qwen_image_folder = parts.folder_checker(REQUIRED_FILES, QWEN_IMAGE_DOWNLOAD_HINT, QwenImageFolderError,
                                               "Qwen-Image model folder")
_cfg = parts.cfg


# ---------------------------------------------------------------- loading
def adapt_for_device(transformer, device) -> None:
    """On an NPU: npu_ops' fused RMSNorm for every RMS norm (the q/k norms of both streams, the text
    norm), and the attention processor with real-arithmetic RoPE and the device adapter's attention
    (qwen_image.npu). Elsewhere nothing."""
    from fastvideo.models.qwen_image.npu import adapt_qwen_image_for_npu  # here: it imports diffusers

    parts.adapt_for_npu(transformer, device, adapt_qwen_image_for_npu)


def load_transformer(root, subfolder, device, dtype):
    return parts.load_transformer("QwenImageTransformer2DModel", check_qwen_image_folder, adapt_for_device, root,
                                  subfolder, device, dtype)


def load_vae(path, device="cpu", dtype=torch.float32):
    return parts.load_vae("AutoencoderKLQwenImage", check_qwen_image_folder, path, device, dtype)


@dataclass
class TextEncoder(parts.EncoderHandle):
    """Qwen2.5-VL (the whole Qwen2_5_VLForConditionalGeneration the pipeline runs: its multimodal RoPE
    positions come from the attention mask there; hidden_size: its text_config's) and its tokenizer."""

    tokenizer: object
    model: torch.nn.Module


def load_text_encoder(path, device="cpu", dtype=torch.float32) -> TextEncoder:
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    root = check_qwen_image_folder(path, ("text_encoder", "tokenizer"))
    tokenizer = AutoTokenizer.from_pretrained(root, subfolder="tokenizer")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(root, subfolder="text_encoder", torch_dtype=dtype)
    return TextEncoder(tokenizer, model.requires_grad_(False).eval().to(device))


# ---------------------------------------------------------------- prompts
@torch.no_grad()
def encode_prompts(enc: TextEncoder, prompts: list[str], max_sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As QwenImagePipeline._get_qwen_prompt_embeds + encode_prompt: the prompts in the template,
    tokenised together (padded to the longest, at most 1024 + 34 tokens), Qwen2.5-VL's last hidden
    layer, each prompt's own rows with its first 34 (the template's prefix) dropped, cut to
    max_sequence_length. -> (prompt_embeds [B, max_sequence_length, H] in the encoder's dtype, zero
    past each prompt's tokens; prompt_mask [B, max_sequence_length] in the same dtype, 1 on them)."""
    texts = [PROMPT_TEMPLATE.format(p) for p in prompts]
    tokens = enc.tokenizer(texts, max_length=TOKENIZER_MAX_LENGTH + TEMPLATE_START_IDX, padding=True,
                           truncation=True, return_tensors="pt").to(enc.device)
    out = enc.model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, output_hidden_states=True)
    states = out.hidden_states[-1]
    keep = tokens.attention_mask.bool()
    embeds = states.new_zeros(len(texts), max_sequence_length, states.shape[-1])
    mask = states.new_zeros(len(texts), max_sequence_length)
    for i in range(len(texts)):
        rows = states[i][keep[i]][TEMPLATE_START_IDX:][:max_sequence_length]
        embeds[i, : rows.shape[0]] = rows
        mask[i, : rows.shape[0]] = 1
    return embeds, mask


def trimmed(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the pipeline passes for a batch: the rows up to the longest prompt's last token, and the
    mask as bool, or None when no row has padding (encode_prompt drops an all-ones mask)."""
    n = max(int((mask > 0.5).sum(dim=1).max()), 1)
    keep = mask[:, :n] > 0.5
    return embeds[:, :n], (None if bool(keep.all()) else keep)


# ---------------------------------------------------------------- schedule
def calculate_mu(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 8192,
                 base_shift: float = 0.5, max_shift: float = 0.9) -> float:
    """The pipeline's calculate_shift (a straight line in the image token count) with Qwen-Image's
    scheduler's end points as defaults."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * slope + (base_shift - slope * base_seq_len)


def scheduler_shift(scheduler_config: dict, height: int, width: int) -> float:
    """The shift s of the schedule s t / (1 + (s - 1) t) that the scheduler's exponential time shift
    with the pipeline's mu gives (exp(mu)); the config's static shift when it does not shift
    dynamically. The scheduler's shift_terminal stretch (Qwen-Image: 0.02) is not a shift: it is not
    in s; the family gives it as schedule_terminal (sampling.sde.stretch_to_terminal)."""
    if not scheduler_config.get("use_dynamic_shifting", False):
        return float(scheduler_config.get("shift", 1.0))
    lh, lw = latent_hw(height, width)
    keys = {k: scheduler_config.get(k, v) for k, v in SCHEDULER_SHIFT_DEFAULTS.items()}
    mu = calculate_mu((lh // 2) * (lw // 2), keys["base_image_seq_len"], keys["max_image_seq_len"],
                      keys["base_shift"], keys["max_shift"])
    return math.exp(mu)


# ---------------------------------------------------------------- velocity and decode
def timesteps(sigma, batch: int, device, quantize: bool = False) -> torch.Tensor:
    """The transformer's timestep [B] float32: the scheduler's timestep 1000 sigma divided by 1000, as
    the pipeline passes it, or floor(1000 sigma) / 1000 with ``quantize`` (DanceGRPO's convention)."""
    t = parts.per_sample_sigma(sigma, batch, device) * 1000.0
    return (torch.floor(t) if quantize else t) / 1000.0


def true_cfg(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """QwenImagePipeline's guidance: v_u + s (v_c - v_u), rescaled per token to v_c's norm (over the
    64 channels of a packed token)."""
    comb = uncond + scale * (cond - uncond)
    cond_norm = torch.norm(cond, dim=-1, keepdim=True)
    noise_norm = torch.norm(comb, dim=-1, keepdim=True)
    return comb * (cond_norm / noise_norm)


def _text_inputs(embeds, mask, neg_embeds, neg_mask, guided: bool):
    """The text rows of one call: [cond] or [cond; uncond] (the negative repeated), trimmed as the
    pipeline trims them; the mask None when nothing is padded."""
    if not guided:
        return trimmed(embeds, mask)
    b = embeds.shape[0]
    neg = neg_embeds.to(embeds.device, embeds.dtype).expand(b, -1, -1)
    neg_mask = neg_mask.to(mask.device, mask.dtype).expand(b, -1)
    return trimmed(torch.cat([embeds, neg]), torch.cat([mask, neg_mask]))


def predict_velocity(transformer, x, sigma, embeds, mask, neg_embeds, neg_mask, latent_h: int, latent_w: int,
                     true_cfg_scale: float, quantize_timestep: bool = False) -> torch.Tensor:
    """The flow-matching velocity float32 [B, L, 64] for packed latents x [B, L, 64]; embeds [B, Lt, D]
    with mask [B, Lt]; neg_embeds [Lt, D] with neg_mask [Lt] (the negative prompt's).

    As QwenImagePipeline: the transformer takes the packed tokens, the timestep sigma (1000 sigma /
    1000), img_shapes [(1, h/16, w/16)] and the text with its mask, and predicts the velocity;
    true_cfg_scale > 1 runs the conditional rows then the negative prompt's in the same call and
    combines them by true_cfg (norm-rescaled), in float32. Both rows carry gradient in the update."""
    b = x.shape[0]
    if embeds.shape[0] != b:
        raise ValueError(f"batch sizes differ: latents {b}, prompt_embeds {embeds.shape[0]}")
    dtype = _model_dtype(transformer)
    guided = true_cfg_scale > 1.0
    rows = 2 * b if guided else b
    text, text_mask = _text_inputs(embeds.to(dtype), mask, neg_embeds, neg_mask, guided)
    t = timesteps(sigma, b, x.device, quantize_timestep)
    latents = x.to(dtype)
    if guided:
        latents, t = torch.cat([latents, latents]), torch.cat([t, t])
    out = transformer(hidden_states=latents, timestep=t.to(dtype), encoder_hidden_states=text,
                      encoder_hidden_states_mask=text_mask, img_shapes=[[(1, latent_h // 2, latent_w // 2)]] * rows,
                      return_dict=False)[0].float()
    return true_cfg(out[:b], out[b:], true_cfg_scale) if guided else out


def decode_latents(vae, packed: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    """Packed latents [B, L, 64] -> images [B, 3, H, W] float32 in [0, 1], as the pipeline's decode:
    z / (1 / latents_std) + latents_mean on the one-frame grid [B, 16, 1, h, w], the decoder, frame 0."""
    z = L.unpack(packed, 1, latent_h, latent_w).to(next(vae.parameters()).dtype)
    z = L.denormalize_mean_std(z, vae.config.latents_mean, vae.config.latents_std)
    return L.to_unit_range(vae.decode(z, return_dict=False)[0][:, :, 0])
