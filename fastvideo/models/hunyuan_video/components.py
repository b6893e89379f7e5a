"""HunyuanVideo building blocks: folder check, loading, Llama + CLIP prompt encoding, the velocity of
the guidance-distilled transformer on video latents and decoding to frames.

Works on real folders (hunyuanvideo-community/HunyuanVideo) and on the tiny ones ``python -m
fastvideo.tools.make_tiny_hunyuan_video`` writes, on both library lines (HunyuanVideoPipeline is in
diffusers 0.32 and 0.42). diffusers and transformers classes are imported inside the functions.

Shapes: a clip of F frames (F = 4k + 1) at h x w -> AutoencoderKLHunyuanVideo latent z [B, 16,
1 + (F - 1) / 4, h / 8, w / 8], scaled by the VAE's scaling_factor (0.476986; no shift); the rollout
holds it as one token per latent cell, channels last, [B, f h w, 16] (models/latents.py to_tokens),
and the transformer takes z itself (it patches 1x2x2 cells into its own tokens).
Text: Llama's hidden states two layers before the last on the prompt in the pipeline's template,
the template's first crop_start tokens cropped: [B, L, D] with its attention mask [B, L] (L =
max_sequence_length, 256 by default; D = 4096); CLIP's pooled output [B, P] (P = 768) of the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from fastvideo.errors import UserError
from fastvideo.models import latents as L
from fastvideo.models import parts
from fastvideo.models.parts import model_dtype as _model_dtype

# HunyuanVideoPipeline.__call__'s guidance_scale: the embedded guidance of the CFG-distilled model
# (the transformer's guidance input is 1000 x it; no classifier-free guidance), and the text length
# (max_sequence_length) of encode_prompt.
DEFAULT_GUIDANCE = 6.0
MAX_SEQUENCE_LENGTH = 256
CLIP_LENGTH = 77  # _get_clip_prompt_embeds' max_sequence_length
HIDDEN_LAYERS_TO_SKIP = 2  # _get_llama_prompt_embeds' num_hidden_layers_to_skip: hidden_states[-3]
TEMPORAL_SCALE = 4  # AutoencoderKLHunyuanVideo's temporal_compression_ratio
# The clips' frame rate: diffusers' HunyuanVideoPipeline example, export_to_video(output, "output.mp4",
# fps=15).
VIDEO_FPS = 15
REQUIRED_FILES = parts.required_files(2)
DOWNLOAD_HINT = parts.download_hint("HunyuanVideo", "hunyuanvideo-community/HunyuanVideo", "hunyuan_video")


class HunyuanVideoFolderError(UserError, FileNotFoundError):
    """A HunyuanVideo model folder is missing, incomplete or not what the flags say."""


check_folder = parts.folder_checker(REQUIRED_FILES, DOWNLOAD_HINT, HunyuanVideoFolderError,
                                    "HunyuanVideo model folder")


def latent_frames(num_frames: int) -> int:
    """Latent frames of a clip of ``num_frames`` (4k + 1) frames: k + 1 (prepare_latents)."""
    return (num_frames - 1) // TEMPORAL_SCALE + 1


def check_frames(num_frames: int, error=ValueError) -> int:
    """``num_frames`` when it is 4k + 1 >= 1 (the causal VAE's 4x in time), else ``error`` in one line."""
    if num_frames >= 1 and (num_frames - 1) % TEMPORAL_SCALE == 0:
        return num_frames
    below = 4 * max((num_frames - 1) // TEMPORAL_SCALE, 0) + 1
    raise error(f"--num_frames {num_frames}: HunyuanVideo's VAE takes 4k+1 frames (1, 5, ..., 53, ..., 129); use "
                f"{below} or {below + 4}")


# ---------------------------------------------------------------- loading
def adapt_for_device(transformer, device) -> None:
    """On the recipe line each sample's own attention mask (attention.py: diffusers 0.32 broadcasts sample
    h's mask to head h); on an NPU npu_ops' fused RMS norms (the q/k norms)."""
    from fastvideo.models.hunyuan_video.attention import per_sample_masks

    per_sample_masks(transformer)
    parts.adapt_for_npu(transformer, device)


load_transformer = partial(parts.load_transformer, "HunyuanVideoTransformer3DModel", check_folder, adapt_for_device)
load_vae = partial(parts.load_vae, "AutoencoderKLHunyuanVideo", check_folder)


@dataclass
class TextEncoders(parts.EncoderHandle):
    """Llama (``model``, a LlamaModel: the sequence embedding) and CLIP (CLIPTextModel: the pooled one),
    with their tokenizers."""

    llama_tokenizer: object
    model: torch.nn.Module
    clip_tokenizer: object
    clip: torch.nn.Module

    @property
    def pooled_size(self) -> int:
        return int(self.clip.config.hidden_size)


def load_llama_tokenizer(root):
    """path/tokenizer as PreTrainedTokenizerFast: its tokenizer.json as written (Llama-3's byte-level
    BPE). The folder's model_index.json names LlamaTokenizerFast, which transformers 5 aliases to a
    LlamaTokenizer that replaces the file's pre-tokenizer with SentencePiece's Metaspace and so
    splits every prompt differently (huggingface/transformers#45488; xdit-project/xDiT#685 reloads
    HunyuanVideo's tokenizer the same way); on transformers 4 both classes tokenise alike."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(root, subfolder="tokenizer")


def load_text_encoders(path, device="cpu", dtype=torch.float32) -> TextEncoders:
    """path/tokenizer + text_encoder (Llama) and path/tokenizer_2 + text_encoder_2 (CLIP), frozen."""
    import transformers

    root = check_folder(path, ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"))
    encoders = []
    for name, cls in (("text_encoder", transformers.LlamaModel), ("text_encoder_2", transformers.CLIPTextModel)):
        model = cls.from_pretrained(root, subfolder=name, torch_dtype=dtype)
        encoders.append(model.requires_grad_(False).eval().to(device))
    clip_tok = transformers.CLIPTokenizer.from_pretrained(root, subfolder="tokenizer_2")
    return TextEncoders(load_llama_tokenizer(root), encoders[0], clip_tok, encoders[1])


# ---------------------------------------------------------------- prompts
def prompt_template() -> dict:
    """HunyuanVideoPipeline's DEFAULT_PROMPT_TEMPLATE (its template and crop_start 95)."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    return DEFAULT_PROMPT_TEMPLATE


@torch.no_grad()
def encode_prompts(enc: TextEncoders, prompts: list[str], max_sequence_length: int = MAX_SEQUENCE_LENGTH):
    """As HunyuanVideoPipeline.encode_prompt: each prompt put in the template, tokenised to
    max_sequence_length + crop_start (padded, truncated), Llama's hidden states
    ``HIDDEN_LAYERS_TO_SKIP`` layers before the last under the attention mask, the first crop_start
    positions cropped from them and the mask; CLIP's pooled output of the prompt padded to 77.
    -> (embeds [B, L, D], mask [B, L] int64, pooled [B, P]) in the encoders' dtypes."""
    template = prompt_template()
    crop = int(template["crop_start"])
    tokens = enc.llama_tokenizer([template["template"].format(p) for p in prompts], max_length=max_sequence_length + crop,
                                 padding="max_length", truncation=True, return_tensors="pt",
                                 return_attention_mask=True)
    ids, mask = tokens.input_ids.to(enc.device), tokens.attention_mask.to(enc.device)
    states = enc.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    embeds = states[-(HIDDEN_LAYERS_TO_SKIP + 1)][:, crop:]
    clip_ids = enc.clip_tokenizer(prompts, padding="max_length", max_length=CLIP_LENGTH, truncation=True,
                                  return_tensors="pt").input_ids.to(enc.device)
    pooled = enc.clip(clip_ids, output_hidden_states=False).pooler_output
    return embeds, mask[:, crop:], pooled


# ---------------------------------------------------------------- velocity and decode
def timesteps(sigma, batch: int, device, quantize: bool = False) -> torch.Tensor:
    """The scheduler's timestep [B] float32: 1000 sigma (FlowMatchEulerDiscreteScheduler's, as the
    pipeline passes it), or floor(1000 sigma) with ``quantize`` (DanceGRPO's int(sigma * 1000),
    train_grpo_hunyuan.py at 15cc71d)."""
    t = parts.per_sample_sigma(sigma, batch, device) * 1000.0
    return torch.floor(t) if quantize else t


def predict_velocity(transformer, x, sigma, embeds, mask, pooled, grid: tuple[int, int, int], guidance_scale: float,
                     quantize_timestep: bool = False) -> torch.Tensor:
    """The flow-matching velocity float32 [B, L, C] for latent tokens x [B, L, C] (L = f h w, grid
    (f, h, w)); embeds [B, Lt, D], mask [B, Lt], pooled [B, P].

    As HunyuanVideoPipeline's loop: the transformer takes the latent video [B, C, f, h, w], the
    timestep, the Llama embeddings with their mask and CLIP's pooled embedding (all in its dtype) and
    the embedded guidance 1000 x guidance_scale in its dtype (DanceGRPO passes 6018.0 in bf16, which is
    6016, as the pipeline's 6.0 x 1000 in bf16); one pass, no classifier-free guidance."""
    b = x.shape[0]
    if embeds.shape[0] != b:
        raise ValueError(f"batch sizes differ: latents {b}, prompt_embeds {embeds.shape[0]}")
    dtype = _model_dtype(transformer)
    t = timesteps(sigma, b, x.device, quantize_timestep)
    guidance = torch.tensor([guidance_scale] * b, dtype=dtype, device=x.device) * 1000.0
    out = transformer(hidden_states=L.from_tokens(x, *grid).to(dtype), timestep=t,
                      encoder_hidden_states=embeds.to(dtype), encoder_attention_mask=mask.to(dtype),
                      pooled_projections=pooled.to(dtype), guidance=guidance, return_dict=False)[0]
    return L.to_tokens(out).float()


def decode_latents(vae, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """Latent tokens [B, f h w, C] -> frames [B, F, 3, H, W] float32 in [0, 1], as the pipeline's
    decode: z in the VAE's dtype / scaling_factor on [B, C, f, h, w], the causal decoder (F = 4 (f - 1)
    + 1 frames), then VideoProcessor's [-1, 1] -> [0, 1] per frame."""
    z = L.from_tokens(x, *grid).to(next(vae.parameters()).dtype) / vae.config.scaling_factor
    video = vae.decode(z, return_dict=False)[0]  # [B, 3, F, H, W]
    return L.to_unit_range(video.permute(0, 2, 1, 3, 4))
