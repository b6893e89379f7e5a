"""Wan building blocks: folder check, loading, umT5 prompt encoding, the (CFG) velocity on video
latents and decoding to frames.

Works on real Wan folders (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, -14B-Diffusers, Wan2.2-TI2V-5B-Diffusers)
and on the tiny ones ``python -m fastvideo.tools.make_tiny_wan`` writes. Everything that names
diffusers' or transformers' Wan / umT5 classes imports them inside a function: this module is
imported on the recipe line too (the registry), where those classes do not exist.

Shapes: a clip of F frames (F = 4k + 1) at h x w -> AutoencoderKLWan latent z [B, C, 1 + (F - 1) / 4,
h / s, w / s] (Wan2.1: C = 16, s = 8; Wan2.2's VAE: C = 48, s = 16), normalised per channel
(z - latents_mean) / latents_std; the rollout holds it as one token per latent cell, channels last,
[B, f h w, C] (models/latents.py to_tokens; WanPipeline draws its noise as z, the same numbers in
another order), and the transformer takes z itself (it patches 1x2x2 cells into its own tokens).
Text: umT5's last hidden state on the cleaned prompt padded to max_sequence_length, zero past the
prompt's tokens (its EOS included): [B, L, D] (D = 4096 for umt5-xxl), no mask.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from fastvideo import devices
from fastvideo.errors import UserError
from fastvideo.models import latents as L
from fastvideo.models import parts
from fastvideo.models.parts import model_dtype as _model_dtype

# WanPipeline.__call__'s guidance_scale (CFG on for a scale > 1) and its negative prompt when none is
# given (encode_prompt: negative_prompt or "").
DEFAULT_GUIDANCE = 5.0
NEGATIVE_PROMPT = ""
TEMPORAL_SCALE = 4  # AutoencoderKLWan's scale_factor_temporal (both VAEs): 4k + 1 frames -> k + 1 latent frames
REQUIRED_FILES = parts.ONE_ENCODER_FILES
WAN_DOWNLOAD_HINT = parts.download_hint("Wan", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "wan")


class WanFolderError(UserError, FileNotFoundError):
    """A Wan model folder is missing, incomplete or not what the flags say."""


check_wan_folder = parts.folder_checker(REQUIRED_FILES, WAN_DOWNLOAD_HINT, WanFolderError, "Wan model folder")


# The clips' frame rates (sample MP4s, fastvideo.video_io): Wan2.1's 16 fps (diffusers' Wan docs,
# docs/source/en/api/pipelines/wan.md: export_to_video(output, "output.mp4", fps=16) in every example);
# Wan2.2-TI2V-5B's 24 fps (the Wan-AI/Wan2.2-TI2V-5B-Diffusers model card's diffusers example,
# export_to_video(output, "5bit2v_output.mp4", fps=24), 121 frames at 704x1280: 5 s).
WAN21_FPS, TI2V_FPS = 16, 24


def expand_timesteps(root) -> bool:
    """WanPipeline's ``expand_timesteps`` of the folder's model_index.json (Wan2.2-TI2V-5B: true, a
    timestep per latent token); False when the file is absent or does not say."""
    index = Path(root) / "model_index.json"
    try:
        return bool(json.loads(index.read_text(encoding="utf-8")).get("expand_timesteps", False))
    except (OSError, ValueError, AttributeError):
        return False


def latent_frames(num_frames: int) -> int:
    """Latent frames of a clip of ``num_frames`` (4k + 1) frames: k + 1 (WanPipeline.prepare_latents)."""
    return (num_frames - 1) // TEMPORAL_SCALE + 1


def check_num_frames(num_frames: int, error=ValueError) -> int:
    """``num_frames`` when it is 4k + 1 >= 1 (the VAE's temporal compression), else ``error`` in one line."""
    if num_frames < 1 or (num_frames - 1) % TEMPORAL_SCALE:
        k = max((num_frames - 1) // TEMPORAL_SCALE, 0)
        raise error(f"--num_frames {num_frames}: Wan's VAE takes 4k+1 frames (1 = single images, 5, 9, ..., 81); "
                    f"use {4 * k + 1} or {4 * k + 5}")
    return num_frames


# ---------------------------------------------------------------- loading
def keep_time_dtype(transformer) -> None:
    """WanTimeTextImageEmbedding reads its dtype as next(time_embedder.parameters()), which FSDP1
    (use_orig_params=False) leaves empty inside the flattened root unit: give the time embedder a
    fallback, a one-element buffer of the dtype its weights were built in (the forward is unchanged)."""
    embedder = getattr(transformer, "condition_embedder", None)
    time = getattr(embedder, "time_embedder", None)
    if time is None or isinstance(time, _TimeEmbedding):
        return
    probe = next(time.parameters())
    time.__class__ = type("TimeEmbedding", (_TimeEmbedding, type(time)), {})
    where = "cpu" if probe.is_meta else probe.device  # a meta-built model: a real buffer the loader moves
    time.register_buffer("dtype_probe", torch.zeros(1, dtype=probe.dtype, device=where), persistent=False)


class _TimeEmbedding:
    def parameters(self, recurse: bool = True):
        own = list(torch.nn.Module.parameters(self, recurse))
        return iter(own or [self.dtype_probe])


def adapt_for_device(transformer, device) -> None:
    """keep_time_dtype; on an NPU npu_ops' fused kernels for the RMS norms (q/k norms across heads)
    and the attention through the device adapter (wan.npu)."""
    from fastvideo.models.wan.npu import adapt_wan_for_npu  # here: it imports diffusers

    keep_time_dtype(transformer)
    parts.adapt_for_npu(transformer, device, adapt_wan_for_npu)


load_transformer = partial(parts.load_transformer, "WanTransformer3DModel", check_wan_folder, adapt_for_device)
# A two-expert folder's low-noise expert (Wan2.2-A14B's transformer_2/, the transformer's files).
check_second_expert = parts.folder_checker({"transformer_2": REQUIRED_FILES["transformer"]}, WAN_DOWNLOAD_HINT,
                                           WanFolderError, "two-expert Wan model folder")
load_second_expert = partial(parts.load_transformer, "WanTransformer3DModel", check_second_expert, adapt_for_device)
load_vae = partial(parts.load_vae, "AutoencoderKLWan", check_wan_folder)


@dataclass
class TextEncoder(parts.EncoderHandle):
    """umT5's encoder (UMT5EncoderModel) and its tokenizer."""

    tokenizer: object
    model: torch.nn.Module

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.d_model)


def load_text_encoder(path, device="cpu", dtype=torch.float32) -> TextEncoder:
    return TextEncoder(*parts.load_text_encoder("UMT5EncoderModel", check_wan_folder, path, device, dtype))


# ---------------------------------------------------------------- prompts
@torch.no_grad()
def encode_prompts(enc: TextEncoder, prompts: list[str], max_sequence_length: int) -> torch.Tensor:
    """As WanPipeline._get_t5_prompt_embeds: each prompt cleaned (the pipeline's prompt_clean: ftfy
    when installed, HTML unescaped, whitespace collapsed), tokenised to max_sequence_length (padded,
    truncated, EOS appended), umT5's last hidden state under the attention mask, each row zeroed past
    its prompt's tokens. -> [B, max_sequence_length, D] in the encoder's dtype."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    tokens = enc.tokenizer([prompt_clean(p) for p in prompts], padding="max_length", max_length=max_sequence_length,
                           truncation=True, add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    ids, mask = tokens.input_ids.to(enc.device), tokens.attention_mask.to(enc.device)
    states = enc.model(ids, mask).last_hidden_state
    keep = (torch.arange(states.shape[1], device=states.device)[None, :] < mask.gt(0).sum(dim=1, keepdim=True))
    return states * keep.unsqueeze(-1).to(states.dtype)


# ---------------------------------------------------------------- velocity and decode
def timesteps(sigma, batch: int, device, quantize: bool = False) -> torch.Tensor:
    """The scheduler's timestep [B] float32: 1000 sigma (FlowMatchEulerDiscreteScheduler's), or
    floor(1000 sigma) with ``quantize`` (DanceGRPO's convention)."""
    t = parts.per_sample_sigma(sigma, batch, device) * 1000.0
    return torch.floor(t) if quantize else t


def token_timesteps(t: torch.Tensor, frames: int, latent_h: int, latent_w: int, patch,
                    given_first: bool = False) -> torch.Tensor:
    """Wan2.2-TI2V's per-token timesteps [B, f (h/p) (w/p)] (WanPipeline with expand_timesteps: every
    token of a text-to-video sample at the step's timestep); ``given_first`` (WanImageToVideoPipeline
    with expand_timesteps: first_frame_mask * t) the first frame's tokens at 0, the given first frame."""
    per_frame = (latent_h // patch[1]) * (latent_w // patch[2])
    t = t[:, None].expand(t.shape[0], frames * per_frame)
    if given_first:
        t = torch.cat([torch.zeros_like(t[:, :per_frame]), t[:, per_frame:]], dim=1)
    return t


def predict_velocity(transformer, x, sigma, embeds, neg_embeds, grid: tuple[int, int, int], guidance_scale: float,
                     quantize_timestep: bool = False, per_token: bool = False,
                     guidance_scale_2: float | None = None, image: dict | None = None,
                     given_first: bool = False) -> torch.Tensor:
    """The flow-matching velocity float32 [B, L, C] for latent tokens x [B, L, C] (L = f h w, grid
    (f, h, w)); embeds [B, Lt, D], neg_embeds [Lt, D] (the negative prompt's).

    As WanPipeline: the transformer takes the latent video [B, C, f, h, w], the timestep (per token
    with ``per_token``: Wan2.2-TI2V's expand_timesteps) and the text, and predicts the velocity;
    guidance_scale > 1 runs the conditional and the negative prompt's rows (here in one batched call:
    Wan's text has no mask, each row is computed alone) and combines them v_u + s (v_c - v_u) in float32.
    Two experts (models/wan/experts.py, Wan2.2-A14B): each row goes to the expert of its timestep, the
    high-noise one with ``guidance_scale``, the low-noise one with ``guidance_scale_2`` (None: the same);
    whether guidance runs is guidance_scale's (WanPipeline's do_classifier_free_guidance).
    image (image-to-video, models/wan_i2v): per-row "condition" [B, Cc, f, h, w], concatenated after the
    latents' channels, and "image_embeds" [B, N, Di] (the CLIP features; absent for a folder without
    an image encoder), both rows of the guidance alike (WanImageToVideoPipeline); ``given_first`` (with
    ``per_token``: Wan2.2-TI2V-5B image-to-video) the first frame's tokens at timestep 0 (token_timesteps)."""
    from fastvideo.models.wan.experts import WanExperts, expert_rows, stand_in

    b = x.shape[0]
    if embeds.shape[0] != b:
        raise ValueError(f"batch sizes differ: latents {b}, prompt_embeds {embeds.shape[0]}")
    model = getattr(transformer, "module", transformer)
    t = timesteps(sigma, b, x.device, quantize_timestep)
    guided = guidance_scale > 1.0
    if not isinstance(model, WanExperts):
        return _velocity(transformer, transformer, model.config, x, t, embeds, neg_embeds, grid,
                         guidance_scale, guided, per_token, image, given_first)
    scales = (guidance_scale, guidance_scale if guidance_scale_2 is None else guidance_scale_2)
    shared = torch.as_tensor(sigma).ndim == 0 or devices.world_size() == 1
    calls = expert_rows(t, model.boundary_timestep, shared)
    if len(calls) == 1:  # every row with one expert
        return _velocity(partial(transformer, calls[0][0]), transformer, model.config, x, t, embeds, neg_embeds,
                         grid, scales[calls[0][0]], guided, per_token, image, given_first)
    parts_, order, unused = [], [], 0.0
    for expert, rows in calls:
        idx = rows if not stand_in(rows) else torch.zeros(1, dtype=torch.long, device=rows.device)
        rows_image = None if image is None else {k: v[idx] for k, v in image.items()}
        v = _velocity(partial(transformer, expert), transformer, model.config, x[idx], t[idx], embeds[idx],
                      neg_embeds, grid, scales[expert], guided, per_token, rows_image, given_first)
        if stand_in(rows):
            unused = v.sum() * 0.0  # in the graph (its units' backward runs on every rank), adds nothing
            continue
        parts_.append(v)
        order.append(rows)
    return torch.cat(parts_)[torch.argsort(torch.cat(order))] + unused


def _velocity(call, transformer, config, x, t, embeds, neg_embeds, grid, guidance_scale: float, guided: bool,
              per_token: bool, image: dict | None = None, given_first: bool = False) -> torch.Tensor:
    """One transformer's (guided) velocity [B, L, C] float32 at timesteps t [B] (``call`` its forward)."""
    b = x.shape[0]
    dtype = _model_dtype(transformer)
    if per_token:
        t = token_timesteps(t, *grid, tuple(config.patch_size), given_first)
    z = L.from_tokens(x, *grid).to(dtype)
    text = embeds.to(dtype)
    extra = {}
    if image is not None:  # image-to-video: torch.cat([latents, condition], dim=1), the CLIP features
        z = torch.cat([z, image["condition"].to(dtype)], dim=1)
        if image.get("image_embeds") is not None:
            extra["encoder_hidden_states_image"] = image["image_embeds"].to(dtype)
    if guided:
        text = torch.cat([text, neg_embeds.to(text.device, dtype).expand(b, -1, -1)])
        z, t = torch.cat([z, z]), torch.cat([t, t])
        extra = {k: torch.cat([v, v]) for k, v in extra.items()}
    out = call(hidden_states=z, timestep=t, encoder_hidden_states=text, return_dict=False, **extra)[0]
    v = L.to_tokens(out).float()
    return v[b:] + guidance_scale * (v[:b] - v[b:]) if guided else v


def decode_latents(vae, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """Latent tokens [B, f h w, C] -> frames [B, F, 3, H, W] float32 in [0, 1], as the pipeline's
    decode: z / (1 / latents_std) + latents_mean on [B, C, f, h, w], the causal decoder (F = 4 (f - 1)
    + 1 frames), then VideoProcessor's [-1, 1] -> [0, 1] per frame."""
    z = L.from_tokens(x, *grid).to(next(vae.parameters()).dtype)
    z = L.denormalize_mean_std(z, vae.config.latents_mean, vae.config.latents_std)
    video = vae.decode(z, return_dict=False)[0]  # [B, 3, F, H, W]
    return L.to_unit_range(video.permute(0, 2, 1, 3, 4))
