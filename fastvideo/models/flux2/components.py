"""FLUX.2 [klein] and [dev] building blocks: folder check, loading, Qwen3 (klein) or Mistral-3 (dev,
mistral_text.py) prompt encoding, latent packing with the VAE's batch-norm statistics, the
(classifier-free guided, or guidance-embedded) velocity, the schedule's shift and decoding.

Works on real FLUX.2 [klein] folders (black-forest-labs/FLUX.2-klein-4B, -9B, their -base
variants), FLUX.2 [dev] ones (black-forest-labs/FLUX.2-dev) and on the tiny ones ``python -m fastvideo.tools.make_tiny_flux2`` writes. Everything
that names diffusers' or transformers' FLUX.2 classes imports them inside a function: this module
is imported on the recipe line too (the registry), where those classes do not exist.

Shapes: image h x w -> VAE latent [B, 32, h/8, w/8] -> 2x2 patches [B, 128, h/16, w/16] ->
normalised by the VAE's batch-norm running statistics -> tokens [B, (h/16)(w/16), 128] (the
pipeline draws its noise directly in the normalised patch space). Text: the Qwen3 hidden states
after layers 9, 18 and 27, stacked per token: prompt_embeds [B, L, 3 H] (H = 2560 for Qwen3-4B,
4096 for Qwen3-8B; L = max_sequence_length, 512 in the pipeline).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from fastvideo.errors import UserError
from fastvideo.models import latents as L
from fastvideo.models import parts, qwen3_text
import fastvideo.models.flux2.mistral_text as mistral_text
from fastvideo.models.flux2.mistral_text import MistralEncoder
from fastvideo.models.parts import model_dtype as _model_dtype
from fastvideo.models.qwen3_text import TextEncoder

# Flux2KleinPipeline's encode_prompt defaults (diffusers 0.42.1 pipeline_flux2_klein.py).
TEXT_LAYERS = (9, 18, 27)
DEFAULT_GUIDANCE = 4.0  # the pipeline's guidance_scale default (true CFG on a base checkpoint)
REQUIRED_FILES = parts.ONE_ENCODER_FILES
FLUX2_DOWNLOAD_HINT = (
    parts.download_hint("FLUX.2", "black-forest-labs/FLUX.2-klein-base-4B", "flux2", " [--variant dev]")
    + " FLUX.2 [dev]: `huggingface-cli download black-forest-labs/FLUX.2-dev --local-dir data/flux2_dev`."
    + parts.gated_note("black-forest-labs/FLUX.2-dev")
)
# model_index.json's _class_name of each variant: the pipeline that says how prompts are encoded.
DEV_PIPELINE, KLEIN_PIPELINE = "Flux2Pipeline", "Flux2KleinPipeline"


class Flux2FolderError(UserError, FileNotFoundError):
    """A FLUX.2 model folder is missing, incomplete or not what the flags say."""


check_flux2_folder = parts.folder_checker(REQUIRED_FILES, FLUX2_DOWNLOAD_HINT, Flux2FolderError,
                                          "FLUX.2 model folder")


def _model_index(root: str | Path) -> dict | None:
    try:
        index = json.loads((Path(root) / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return index if isinstance(index, dict) else None


def is_distilled(root: str | Path) -> bool | None:
    """model_index.json's ``is_distilled`` (the step-distilled klein checkpoints: True; the base
    ones: False), or None when the folder has no readable model_index.json."""
    index = _model_index(root)
    return None if index is None else bool(index.get("is_distilled", False))


def variant(root: str | Path) -> str | None:
    """"dev" for a Flux2Pipeline folder (FLUX.2 [dev]: Mistral-3, guidance embedding), "klein" for a
    Flux2KleinPipeline one, None when model_index.json is unreadable or names neither."""
    name = (_model_index(root) or {}).get("_class_name")
    return {DEV_PIPELINE: "dev", KLEIN_PIPELINE: "klein"}.get(name)


def check_guidance(root: str | Path, guidance_scale: float | None) -> None:
    """A distilled checkpoint with classifier-free guidance asked for: the pipeline ignores the scale
    there (with a warning); a training run would double its cost for a different model, so refuse."""
    if guidance_scale is not None and guidance_scale > 1.0 and is_distilled(root):
        raise Flux2FolderError(
            f"{str(root)!r} is a step-distilled FLUX.2 [klein] (model_index.json is_distilled: true), which runs "
            f"without classifier-free guidance, but --guidance_scale is {guidance_scale:g}: pass --guidance_scale 1 "
            "(or train the base checkpoint, e.g. FLUX.2-klein-base-4B, with guidance)")


def adapt_for_device(transformer, device) -> None:
    """On an NPU: the fused RMSNorm kernel for FLUX.2's q/k norms (torch.nn.RMSNorm; npu_ops swaps
    every RMS norm). FLUX.2's RoPE already avoids float64 there (diffusers downcasts it for NPU
    tensors) and its attention goes through diffusers' dispatcher (SDPA). Elsewhere nothing."""
    parts.adapt_for_npu(transformer, device)


def load_transformer(root, subfolder, device, dtype):
    return parts.load_transformer("Flux2Transformer2DModel", check_flux2_folder, adapt_for_device, root, subfolder,
                                  device, dtype)


def load_vae(path, device="cpu", dtype=torch.float32):
    return parts.load_vae("AutoencoderKLFlux2", check_flux2_folder, path, device, dtype)


def load_text_encoder(path, device="cpu", dtype=torch.float32) -> TextEncoder | MistralEncoder:
    """The folder's text encoder without its head, and its tokenizer: klein's Qwen3, or dev's Mistral
    decoder and PixtralProcessor (model_index.json's pipeline says which)."""
    root = check_flux2_folder(path, ("text_encoder", "tokenizer"))
    if variant(root) == "dev":
        return mistral_text.load_text_encoder(root, device, dtype)
    return qwen3_text.load_text_encoder(root, device, dtype)


def encode_prompts(enc: TextEncoder | MistralEncoder, prompts: list[str], max_sequence_length: int,
                   layers: tuple[int, ...] = TEXT_LAYERS) -> torch.Tensor:
    """As Flux2KleinPipeline.encode_prompt (chat template with thinking off): the hidden states after
    ``layers`` (index 0 is the embedding), stacked per token -> prompt_embeds [B, L, len(layers) * H]
    in the encoder's dtype. A Mistral encoder (dev): Flux2Pipeline.encode_prompt (its system message,
    layers 10, 20, 30; ``layers`` is klein's)."""
    if isinstance(enc, MistralEncoder):
        return mistral_text.encode_prompts(enc, list(prompts), max_sequence_length)
    states, _ = qwen3_text.hidden_states(enc, list(prompts), max_sequence_length, enable_thinking=False)
    stacked = torch.stack([states[k] for k in layers], dim=1)  # [B, n, L, H]
    b, n, length, h = stacked.shape
    return stacked.permute(0, 2, 1, 3).reshape(b, length, n * h)


# ---------------------------------------------------------------- geometry
_cfg = parts.cfg


def grid_hw(height: int, width: int, scale: int = 8) -> tuple[int, int]:
    """The token grid of an image: one token per 2x2 patch of VAE latent cells."""
    return L.token_grid_hw(height, width, scale)


def image_ids(grid_h: int, grid_w: int, device=None) -> torch.Tensor:
    """[h w, 4] (t, row, column, l) = (0, i, j, 0) in row-major order (Flux2KleinPipeline._prepare_latent_ids)."""
    ids = L.positions(1, grid_h, grid_w, device=device, dtype=torch.long)
    return torch.cat([ids, torch.zeros_like(ids[:, :1])], dim=-1)


def text_ids(length: int, device=None) -> torch.Tensor:
    """[L, 4] = (0, 0, 0, l): FLUX.2 gives text tokens a position on the fourth RoPE axis."""
    ids = torch.zeros(length, 4, dtype=torch.long, device=device)
    ids[:, 3] = torch.arange(length, device=device)
    return ids


def to_grid(x: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
    """Tokens [B, h w, C] -> [B, C, h, w] (the inverse of the pipeline's _pack_latents)."""
    return L.from_tokens(x, grid_h, grid_w)


def unpatchify(z: torch.Tensor) -> torch.Tensor:
    """[B, 4C, h, w] -> [B, C, 2h, 2w]: channel c*4 + 2i + j goes to pixel (2y + i, 2x + j)."""
    return L.unpatchify_image(z)


def empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """FLUX.2's schedule shift exponent (the pipeline's compute_empirical_mu): two straight lines in
    the token count, fitted at 10 and 200 steps, interpolated in the step count; above 4300 tokens
    the 200-step line alone."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    m_200 = a2 * image_seq_len + b2
    if image_seq_len > 4300:
        return float(m_200)
    m_10 = a1 * image_seq_len + b1
    slope = (m_200 - m_10) / 190.0
    return float(slope * num_steps + (m_200 - 200.0 * slope))


def schedule_shift(height: int, width: int, steps: int) -> float:
    """The scheduler's exponential time shift exp(mu) / (exp(mu) + 1/t - 1) is the shifted schedule
    s t / (1 + (s - 1) t) with s = exp(mu): the shift that reproduces the pipeline's sigmas."""
    gh, gw = grid_hw(height, width)
    return math.exp(empirical_mu(gh * gw, steps))


# ---------------------------------------------------------------- velocity and decode
def _config(transformer):
    return getattr(transformer, "module", transformer).config


def timesteps(sigma, batch: int, device, quantize: bool) -> torch.Tensor:
    """The transformer's timestep [B] float32 (it multiplies by 1000 itself): the pipeline's scheduler
    timestep 1000 sigma divided by 1000 again (its rounding, bit for bit), or floor(1000 sigma) / 1000
    with ``quantize`` (DanceGRPO's convention)."""
    t = parts.per_sample_sigma(sigma, batch, device) * 1000.0
    return (torch.floor(t) if quantize else t) / 1000.0


def predict_velocity(transformer, x, sigma, embeds, neg_embeds, img_ids, guidance_scale: float,
                     quantize_timestep: bool) -> torch.Tensor:
    """FLUX.2 velocity float32 [B, L, C] for tokens x [B, L, C]; embeds [B, Lt, D], neg_embeds [Lt, D]
    (the empty prompt's), img_ids [L, 4].

    guidance_scale > 1 is true classifier-free guidance as Flux2KleinPipeline (base checkpoints):
    v = v_u + s (v_c - v_u), the unconditional rows run in the same batch (first) and, as in
    Flow-Factory's FLUX.2 [klein] trainer, carry gradient too; otherwise one conditional pass. A
    transformer with a guidance embedding (FLUX.2 [dev]) gets the scale there instead, as FLUX.1-dev."""
    b = x.shape[0]
    if embeds.shape[0] != b:
        raise ValueError(f"batch sizes differ: latents {b}, prompt_embeds {embeds.shape[0]}")
    config = _config(transformer)
    dtype = _model_dtype(transformer)
    t = timesteps(sigma, b, x.device, quantize_timestep)
    distilled_guidance = bool(_cfg(config, "guidance_embeds", True))  # diffusers' default
    cfg = guidance_scale > 1.0 and not distilled_guidance
    hidden, context = x.to(dtype), embeds.to(dtype)
    if cfg:
        hidden, t = torch.cat([hidden, hidden]), torch.cat([t, t])
        context = torch.cat([neg_embeds.to(context.device, dtype).expand(b, *context.shape[1:]), context])
    guidance = torch.full_like(t, float(guidance_scale)) if distilled_guidance else None
    out = transformer(hidden_states=hidden, encoder_hidden_states=context, timestep=t, img_ids=img_ids,
                      txt_ids=text_ids(context.shape[1], x.device), guidance=guidance, return_dict=False)[0]
    v = out.float()
    if cfg:
        v_u, v_c = v.chunk(2)
        v = v_u + guidance_scale * (v_c - v_u)
    return v


def latent_statistics(vae) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's batch-norm running mean and std (sqrt(var + eps)) of the patched latents, [1, 4C, 1, 1]."""
    return L.batch_norm_stats(vae, ndim=4)


def decode_latents(vae, x: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
    """Tokens [B, L, 4C] -> images [B, 3, H, W] float32 in [0, 1]: the batch-norm statistics undone,
    the 2x2 patches unfolded, the VAE decoder (as the pipeline's non-latent output path)."""
    z = to_grid(x, grid_h, grid_w)
    z = L.denormalize_batch_norm(z, *latent_statistics(vae))
    image = vae.decode(unpatchify(z).to(_model_dtype(vae)), return_dict=False)[0]
    return L.to_unit_range(image)
