"""Qwen-Image-Edit's own pieces (diffusers 0.42.1 QwenImageEditPlusPipeline, the 2509 / 2511 line);
everything else is Qwen-Image's (fastvideo.models.qwen_image.components).

The source image is read twice, as the pipeline does:

    source PIL image (w x h) --calculate_dimensions(384^2, w/h), Lanczos--> condition image
        -> Qwen2VLProcessor: "Picture 1: <|vision_start|><|image_pad|>...<|vision_end|>" + the
           instruction inside the edit template; Qwen2.5-VL (vision tower + language model), last
           hidden layer, the template's 64 prefix tokens dropped -> prompt_embeds [n, D] (the
           image's tokens included); the negative prompt " " likewise, with the same image
    source --calculate_dimensions(1024^2, w/h)--> VAE image [1, 3, 1, vh, vw] in [-1, 1]
        -> AutoencoderKLQwenImage mode, (z - latents_mean) / latents_std -> 2x2 packed
           image_latents [(vh/16)(vw/16), 64]
    velocity: transformer([x ; image_latents], img_shapes [(1, h/16, w/16), (1, vh/16, vw/16)])
              -> the first L tokens; true CFG as Qwen-Image's with the negative's own rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import fastvideo.models.qwen_image.components as QC
from fastvideo.models import latents as L
from fastvideo.models.base import EmbeddingShapeError

# QwenImageEditPlusPipeline's constants (diffusers 0.42.1 pipeline_qwenimage_edit_plus.py).
EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
EDIT_TEMPLATE_START_IDX = 64  # prompt_template_encode_start_idx
IMAGE_PROMPT = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"  # img_prompt_template
CONDITION_IMAGE_SIZE = 384 * 384  # the area of the image the VL encoder sees
VAE_IMAGE_SIZE = 1024 * 1024  # the area of the image the VAE encodes


def calculate_dimensions(target_area: float, ratio: float) -> tuple[int, int]:
    """The pipeline's (width, height) of area about ``target_area`` at aspect ``ratio`` = w / h,
    each side rounded to a multiple of 32."""
    width = math.sqrt(target_area * ratio)
    height = width / ratio
    return round(width / 32) * 32, round(height / 32) * 32


@dataclass
class EditEncoders:
    """Qwen2.5-VL with its Qwen2VLProcessor, and the VAE that encodes the source images."""

    text: QC.TextEncoder
    processor: object
    vae: torch.nn.Module

    @property
    def device(self) -> torch.device:
        return self.text.device


def load_edit_encoders(path, device="cpu", dtype=torch.float32) -> EditEncoders:
    from transformers import Qwen2VLProcessor

    root = QC.check_qwen_image_folder(path, ("text_encoder", "tokenizer", "vae"))
    processor = Qwen2VLProcessor.from_pretrained(root, subfolder="processor")
    return EditEncoders(QC.load_text_encoder(root, device, dtype), processor, QC.load_vae(root, device, dtype))


def _image_processor():
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=16)  # the pipeline's: 8 (VAE) x 2 (packing)


@torch.no_grad()
def encode_edit_prompt(enc: EditEncoders, prompt: str, condition_image) -> torch.Tensor:
    """One instruction with its condition image (PIL) -> embeddings [n, D]: the pipeline's
    _get_qwen_prompt_embeds for a batch of one (the template's 64 prefix tokens dropped; the image's
    tokens kept)."""
    text = EDIT_TEMPLATE.format(IMAGE_PROMPT.format(1) + prompt)
    inputs = enc.processor(text=[text], images=[condition_image], padding=True, return_tensors="pt").to(enc.device)
    out = enc.text.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                         pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                         output_hidden_states=True)
    rows = out.hidden_states[-1][0][inputs["attention_mask"][0].bool()]
    return rows[EDIT_TEMPLATE_START_IDX:]


def padded(rows: list[torch.Tensor], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-prompt rows [n_i, D] -> (embeds [P, length, D] zero past each prompt's n_i, mask [P, length]
    1 on them). EmbeddingShapeError when a prompt is longer than ``length``: the pipeline never cuts
    (the image's tokens come first, a cut would drop the instruction)."""
    longest = max(r.shape[0] for r in rows)
    if longest > length:
        raise EmbeddingShapeError(f"an instruction with its source image takes {longest} Qwen2.5-VL tokens (the "
                                  f"image's included) but --max_sequence_length is {length}: pass at least {longest}")
    embeds = rows[0].new_zeros(len(rows), length, rows[0].shape[-1])
    mask = rows[0].new_zeros(len(rows), length)
    for i, r in enumerate(rows):
        embeds[i, : r.shape[0]], mask[i, : r.shape[0]] = r, 1
    return embeds, mask


def source_sizes(width: int, height: int, condition_area: int = CONDITION_IMAGE_SIZE,
                 vae_area: int = VAE_IMAGE_SIZE) -> tuple[tuple[int, int], tuple[int, int]]:
    """((condition w, h), (VAE w, h)) of a width x height source, as the pipeline's __call__."""
    ratio = width / height
    return calculate_dimensions(condition_area, ratio), calculate_dimensions(vae_area, ratio)


@torch.no_grad()
def encode_source_latents(vae, vae_pixels: torch.Tensor) -> torch.Tensor:
    """VAE images [B, 3, vh, vw] in [-1, 1] -> packed, normalised latents [B, (vh/16)(vw/16), 64], as
    the pipeline's _encode_vae_image (the distribution's mode) and _pack_latents."""
    dtype = next(vae.parameters()).dtype
    z = vae.encode(vae_pixels.to(dtype).unsqueeze(2)).latent_dist.mode()
    return L.pack(L.normalize_mean_std(z, vae.config.latents_mean, vae.config.latents_std))


def _to_pils(pixels: torch.Tensor) -> list:
    """[P, 3, H, W] in [0, 1] -> P RGB PIL images, rounded to 8 bits as a saved PNG would be (kept here
    rather than imported from rewards/: models/ imports no higher layer)."""
    from PIL import Image

    u8 = pixels.detach().float().cpu().clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8).permute(0, 2, 3, 1)
    return [Image.fromarray(a.numpy(), mode="RGB") for a in u8]


def encode_sources(enc: EditEncoders, prompts: list[str], negative: str, pixels: torch.Tensor, max_len: int,
                   condition_area: int = CONDITION_IMAGE_SIZE, vae_area: int = VAE_IMAGE_SIZE) -> dict:
    """Instructions with their sources [P, 3, H, W] in [0, 1] (8-bit values) -> prompt_embeds,
    prompt_mask, neg_prompt_embeds, neg_prompt_mask (the negative with each prompt's image),
    image_latents [P, Ls, 64] and source_grid (vh/16, vw/16) as an int64 [2]."""
    proc = _image_processor()
    (cw, ch), (vw, vh) = source_sizes(pixels.shape[-1], pixels.shape[-2], condition_area, vae_area)
    pils = _to_pils(pixels)
    conds = [proc.resize(im, ch, cw) for im in pils]
    embeds, mask = padded([encode_edit_prompt(enc, p, c) for p, c in zip(prompts, conds)], max_len)
    neg, neg_mask = padded([encode_edit_prompt(enc, negative, c) for c in conds], max_len)
    vae_pixels = torch.cat([proc.preprocess(im, vh, vw) for im in pils]).to(enc.device)
    return {"prompt_embeds": embeds, "prompt_mask": mask, "neg_prompt_embeds": neg, "neg_prompt_mask": neg_mask,
            "image_latents": encode_source_latents(enc.vae, vae_pixels),
            "source_grid": torch.tensor([vh // 16, vw // 16], dtype=torch.int64)}


def edit_velocity(transformer, x, sigma, cond, latent_h: int, latent_w: int, true_cfg_scale: float,
                  quantize_timestep: bool = False) -> torch.Tensor:
    """v(x, sigma) float32 [B, L, 64] of the generated tokens x [B, L, 64]: the transformer on
    [x ; image_latents] with img_shapes [(1, h/2, w/2), (1, source grid)], the first L tokens kept;
    under true CFG ([cond; uncond] in one call, each with its own text and the same source) the
    pipeline's norm-rescaled combination."""
    b, n = x.shape[0], x.shape[1]
    src = cond["image_latents"]
    if src.shape[0] != b or src.shape[2] != x.shape[2]:
        raise ValueError(f"source latents {tuple(src.shape)} do not fit latents {tuple(x.shape)}")
    dtype = QC._model_dtype(transformer)
    guided = true_cfg_scale > 1.0
    embeds, mask = cond["prompt_embeds"].to(dtype), cond["prompt_mask"]
    if guided:
        embeds = torch.cat([embeds, cond["neg_prompt_embeds"].to(embeds)])
        mask = torch.cat([mask, cond["neg_prompt_mask"].to(mask)])
    text, text_mask = QC.trimmed(embeds, mask)
    latents = torch.cat([x, src.to(x)], dim=1).to(dtype)
    t = QC.timesteps(sigma, b, x.device, quantize_timestep)
    if guided:
        latents, t = torch.cat([latents, latents]), torch.cat([t, t])
    gh, gw = (int(v) for v in cond["source_grid"].tolist())
    shapes = [[(1, latent_h // 2, latent_w // 2), (1, gh, gw)]] * latents.shape[0]
    out = transformer(hidden_states=latents, timestep=t.to(dtype), encoder_hidden_states=text,
                      encoder_hidden_states_mask=text_mask, img_shapes=shapes, return_dict=False)[0][:, :n].float()
    return QC.true_cfg(out[:b], out[b:], true_cfg_scale) if guided else out
