"""The body every built-in diffusers family shares, so that a family's folder holds only what differs
from it: its encoders, its conditioning, the transformer's call and the schedule.

``DiffusersFamily`` (a ModelFamily with the cost-model role) does the loading through the functions
its components module lists in ``parts`` (``ComponentFunctions``), the guidance settings
(``guidance_scale`` / ``scale`` / ``velocity_passes``), the latent layout of a VAE grid held as
tokens [B, L, C] (2x2-packed: FLUX.1's packing; or one latent cell per token: SD3's), decoding, the
transformer's block lists and the FLOP summary of a family's FLOP breakdown.

``TextEmbedsFamily`` adds the conditioning of a family with one text encoder whose token embeddings
are the transformer's text input, per sample "prompt_embeds" [B, L, D] (and, when ``masked``,
"prompt_mask" [B, L], 1 on the prompt's tokens), and the negative prompt's, shared
"neg_prompt_embeds" [L, D] (and "neg_prompt_mask" [L]), for classifier-free guidance: Z-Image,
Qwen-Image (masked) and FLUX.2 (unmasked).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from fastvideo.models import base, record_checks
from fastvideo.models.base import EmbeddingShapeError, LatentLayout, TensorConditioning, config_value
from fastvideo.models.latents import latent_hw


@dataclass(frozen=True)
class ComponentFunctions:
    """The functions of a family's components module that DiffusersFamily calls."""

    check_folder: Callable[..., Path]  # (path, components=None) -> Path; raises folder_error naming what is missing
    folder_error: Callable[[str], Exception]  # its UserError class: a folder that is not what the flags say
    load_transformer: Callable[..., torch.nn.Module]  # (root, subfolder, device, dtype), device kernels applied
    adapt_for_device: Callable[..., None]  # (transformer, device): device-specific kernels
    load_vae: Callable[..., torch.nn.Module]  # (path, device, dtype)
    load_text_encoders: Callable[..., Any]  # (path, device, dtype) -> what encode_prompts takes
    encode_prompts: Callable[..., Any]  # (encoders, prompts, max_sequence_length) -> the encoders' tensors
    decode_latents: Callable[..., torch.Tensor]  # (vae, x [B, L, C], latent_h, latent_w) -> images [B, 3, H, W]
    # The masked text families' transformer call (TextEmbedsFamily.velocity): (transformer, x, sigma,
    # embeds, mask, neg_embeds, neg_mask, latent_h, latent_w, scale, quantize) -> v [B, L, C]; None
    # where the family's velocity calls its own.
    predict_velocity: Callable[..., torch.Tensor] | None = None
    # The FLOP breakdown (config, image_tokens, text_tokens, batch) -> {part: FLOPs, "total": ...} and the
    # backward's count (same arguments), for transformer_flops; None where the family counts its own.
    flops_breakdown: Callable[..., dict[str, int]] | None = None
    backward_flops: Callable[..., int] | None = None


def video_layout(height: int, width: int, latent_h: int, latent_w: int, channels: int, latent_frames: int,
                 num_frames: int) -> LatentLayout:
    """A video family's layout: one token per latent cell of f x h x w (f = ``latent_frames``), extras
    "grid" (f, h, w), "latent_h", "latent_w" and "num_frames" (the clip's frames)."""
    return LatentLayout(height=height, width=width, tokens=(latent_frames * latent_h * latent_w, channels),
                        latent_hw=(latent_h, latent_w),
                        extras={"grid": (latent_frames, latent_h, latent_w), "latent_h": latent_h, "latent_w": latent_w,
                                "num_frames": num_frames})


class DiffusersFamily(base.ModelFamily, base.FamilyCostModel):
    """A family of a diffusers pipeline. guidance_scale: its guidance scale (None: the stock pipeline's
    ``default_guidance_scale``, as the preflight and the cost model build it without settings);
    quantize_timestep: give the transformer floor(1000 sigma)-based timesteps (DanceGRPO's convention)."""

    parts: ComponentFunctions
    # The stock pipeline's guidance scale (guidance_scale None), and the scale above which its
    # classifier-free guidance runs (two transformer passes per velocity); cfg_above None: it never does.
    default_guidance_scale: float | None = None
    cfg_above: float | None = None
    # The transformer's lists of repeated blocks (attribute names), in execution order.
    block_lists: tuple[str, ...] = ("transformer_blocks",)
    # Latent cells per token side: 2 for FLUX.1's 2x2 packing (tokens [B, (h/2)(w/2), 4C]), 1 for one
    # cell per token (SD3: its transformer patches the grid itself).
    token_patch: int = 2
    # Whether the transformer's in_channels count one latent cell's channels rather than one token's
    # (Z-Image's transformer patches the cells of a token itself).
    in_channels_per_cell: bool = False
    # The FLOP breakdown's parts that are the repeated blocks (what activation checkpointing recomputes).
    block_flop_parts: tuple[str, ...] = ()

    def __init__(self, guidance_scale: float | None = None, quantize_timestep: bool = False):
        self.guidance_scale = None if guidance_scale is None else float(guidance_scale)
        self.quantize_timestep = quantize_timestep

    @property
    def scale(self) -> float | None:
        """The guidance scale the velocity uses."""
        return self.default_guidance_scale if self.guidance_scale is None else self.guidance_scale

    @property
    def velocity_passes(self) -> int:
        """Transformer passes (in samples) per velocity: 2 under classifier-free guidance."""
        return 2 if self.cfg_above is not None and self.scale > self.cfg_above else 1

    def cost_passes(self, config: Mapping) -> int:
        """Transformer passes per velocity with the transformer of ``config`` (the cost model's)."""
        return self.velocity_passes

    # -- loading
    def check_folder(self, path, components=None) -> Path:
        return self.parts.check_folder(path, components)

    def folder_error(self, message: str) -> Exception:
        return self.parts.folder_error(message)

    def transformer_class(self):
        """The diffusers class export_class_name names."""
        import diffusers

        return getattr(diffusers, self.export_class_name)

    def load_transformer(self, root, subfolder, device, dtype):
        return self.parts.load_transformer(root, subfolder, device, dtype)

    def adapt_for_device(self, transformer, device) -> None:
        self.parts.adapt_for_device(transformer, device)

    def load_vae(self, path, device="cpu", dtype=torch.float32):
        return self.parts.load_vae(path, device, dtype)

    def load_text_encoders(self, path, device="cpu", dtype=torch.float32):
        return self.parts.load_text_encoders(path, device, dtype)

    def blocks(self, model) -> list[torch.nn.Module]:
        """The blocks of block_lists in order (DDP/FSDP wrappers keep the diffusers model under .module)."""
        model = getattr(model, "module", model)
        return [block for name in self.block_lists for block in getattr(model, name)]

    # -- sampling
    def vae_geometry(self, vae_config) -> tuple[int, int]:
        """(pixels per latent cell, latent channels) of the VAE: AutoencoderKL's 2 ** (levels - 1)
        and latent_channels."""
        levels = len(config_value(vae_config, "block_out_channels"))
        return 2 ** (levels - 1), int(config_value(vae_config, "latent_channels"))

    def token_channels(self, in_channels: int) -> int:
        """Channels C of a token [B, L, C] for a transformer of ``in_channels``."""
        return self.token_patch ** 2 * in_channels if self.in_channels_per_cell else in_channels

    def layout(self, height, width, vae, transformer=None, device=None) -> LatentLayout:
        cell, latent_channels = self.vae_geometry(vae.config)
        if transformer is not None:
            channels = self.token_channels(int(getattr(transformer, "module", transformer).config.in_channels))
        else:
            channels = self.token_patch ** 2 * latent_channels
        return self._layout(height, width, *latent_hw(height, width, cell), channels, device)

    def nominal_layout(self, height, width, transformer_config) -> LatentLayout:
        """The family's standard VAE: 8 pixels per latent cell."""
        channels = self.token_channels(transformer_config["in_channels"])
        return self._layout(height, width, *latent_hw(height, width, 8), channels)

    def _layout(self, height, width, latent_h, latent_w, channels, device=None) -> LatentLayout:
        p = self.token_patch
        return LatentLayout(height=height, width=width, tokens=((latent_h // p) * (latent_w // p), channels),
                            latent_hw=(latent_h, latent_w), extras=self.layout_extras(latent_h, latent_w, device))

    def layout_extras(self, latent_h: int, latent_w: int, device=None) -> dict[str, Any]:
        """What velocity and decode read from a layout: the latent grid "latent_h", "latent_w"."""
        return {"latent_h": latent_h, "latent_w": latent_w}

    def decode(self, vae, x0, layout) -> torch.Tensor:
        return self.parts.decode_latents(vae, x0, layout["latent_h"], layout["latent_w"])

    # -- cost model
    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """One velocity's FLOPs (both guidance passes under CFG): the breakdown's parts, its total as
        "forward", "backward", and "blocks" (the block_flop_parts)."""
        b = batch * self.cost_passes(config)
        parts = self.parts.flops_breakdown(config, image_tokens, text_tokens, b)
        return {**{k: v for k, v in parts.items() if k != "total"}, "forward": parts["total"],
                "blocks": sum(parts[k] for k in self.block_flop_parts),
                "backward": self.parts.backward_flops(config, image_tokens, text_tokens, b)}


class TextEmbedsFamily(DiffusersFamily):
    """A family whose conditioning is one text encoder's token embeddings and the negative prompt's
    (the module docstring's tensors); stored per prompt in ``storage``'s order: the prompt's tensors,
    then the negative's."""

    # The one text encoder and its tokenizer (the preprocessing's fingerprint), and what training needs.
    text_components = ("text_encoder", "tokenizer")
    text_encoder_components = ("text_encoder",)
    training_components = ("transformer", "vae", "text_encoder")
    # Whether the embeddings come with their mask ("prompt_mask"; encode_prompts returns both).
    masked: bool = True
    # The negative prompt the pipeline encodes for classifier-free guidance.
    negative_prompt: str = ""
    # The transformer config's key for the embeddings' width D, and what to do about a mismatch.
    text_width_key: str = "joint_attention_dim"
    model_hint: str = ""
    # Who makes the stored records (the messages about a record that does not fit).
    made_by: str = ""

    @property
    def text_keys(self) -> tuple[str, ...]:
        """The per-sample tensors' names; the shared negatives are "neg_" + each."""
        return ("prompt_embeds", "prompt_mask") if self.masked else ("prompt_embeds",)

    def _text_tensors(self, encoders, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        out = self.parts.encode_prompts(encoders, prompts, max_sequence_length)
        return dict(zip(self.text_keys, out if self.masked else (out,)))

    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        tensors = self._text_tensors(encoders, list(prompts), max_sequence_length)
        negative = self._text_tensors(encoders, [self.negative_prompt], max_sequence_length)
        return TensorConditioning(tensors, {f"neg_{k}": t[0] for k, t in negative.items()})

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        return TensorConditioning({k: torch.stack([r[k] for r in records]) for k in self.text_keys},
                                  {f"neg_{k}": records[0][f"neg_{k}"] for k in self.text_keys})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (L, D)); the mask [L], the negative of the prompt's shape."""
        embed, negative = record["prompt_embeds"], record["neg_prompt_embeds"]
        mask, neg_mask = (record["prompt_mask"], record["neg_prompt_mask"]) if self.masked else (None, None)
        if self.masked and (embed.ndim != 2 or tuple(mask.shape) != embed.shape[:1]):
            mask_file = next(s.folder for s in self.storage if s.name == "prompt_mask")
            raise EmbeddingShapeError(f"prompt {idx}: prompt_embed {tuple(embed.shape)} should be [L, D] with a "
                                      f"{mask_file} [L], got {tuple(mask.shape)}; re-run the preprocessing")
        if not self.masked and embed.ndim != 2:
            raise EmbeddingShapeError(f"prompt {idx}: prompt_embed {tuple(embed.shape)} should be [L, D] (one prompt "
                                      "per file); re-run the preprocessing")
        if negative.shape != embed.shape or (mask is not None and neg_mask.shape != mask.shape):
            what = "the negative (empty-prompt) embedding" if self.negative_prompt == "" else \
                "the negative prompt's embedding"
            raise EmbeddingShapeError(f"prompt {idx}: {what} {tuple(negative.shape)} differs in shape from the "
                                      f"prompt's {tuple(embed.shape)} in {where!r}: it was not made by {self.made_by}; "
                                      "re-run it into an empty folder")
        dims = tuple(embed.shape)
        record_checks.check_first_dims(idx, dims, first_dims, where)
        return dict(record), dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        seq, width = dims
        record_checks.check_width("prompt embeddings", width, transformer_config, self.text_width_key, self.model_hint)
        record_checks.check_sequence_length(seq, max_sequence_length)

    def encoder_dims(self, encoders) -> dict[str, int]:
        return {"embed_dim": encoders.hidden_size}

    def record_shapes(self, max_sequence_length, encoder_dims):
        """(L, D) and, when masked, the mask's (L,); the prompt's, then the negative's."""
        one = ((max_sequence_length, encoder_dims["embed_dim"]),) + (((max_sequence_length,),) if self.masked else ())
        return one + one

    def check_cond(self, cond) -> None:
        embeds, negative = cond["prompt_embeds"], cond["neg_prompt_embeds"]
        if not self.masked:
            if embeds.ndim != 3 or negative.shape != embeds.shape[1:]:
                raise ValueError(f"prompt_embeds must be [P, L, D] and neg_prompt_embeds one prompt's [L, D], got "
                                 f"{tuple(embeds.shape)} and {tuple(negative.shape)}")
            return
        mask = cond["prompt_mask"]
        if embeds.ndim != 3 or mask.shape != embeds.shape[:2] or negative.shape != embeds.shape[1:]:
            raise ValueError(f"prompt_embeds must be [P, L, D] with prompt_mask [P, L] and neg_prompt_embeds one "
                             f"prompt's [L, D], got {tuple(embeds.shape)}, {tuple(mask.shape)} and "
                             f"{tuple(negative.shape)}")

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        """A masked family's: the prompt's and the negative's embeddings with their masks, the latent
        grid, the guidance scale (an unmasked family has its own)."""
        return self.parts.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["prompt_mask"],
                                           cond["neg_prompt_embeds"], cond["neg_prompt_mask"], layout["latent_h"],
                                           layout["latent_w"], self.scale, self.quantize_timestep)

    def cond_numel(self, config, text_tokens) -> int:
        """The embedding [L, D] (and its mask [L])."""
        return text_tokens * (config[self.text_width_key] + (1 if self.masked else 0))
