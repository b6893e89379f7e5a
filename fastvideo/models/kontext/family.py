"""FLUX.1 Kontext [dev] as a ModelFamily: FLUX.1's family (loading, text conditioning, latents,
decoding, FSDP blocks, FLOPs) plus a source image per prompt.

Conditioning: FLUX.1's TensorConditioning with, per sample, "image_latents" [B, Ls, 64] (the
packed, normalised VAE latents of the source image) and "source_image" [B, 3, H, W] in [0, 1] (what
the rewards see), and shared "source_ids" [Ls, 3] (column 0 = 1). Stored per prompt beside FLUX.1's
folders in image_latents/, source_image/ and source_ids/. The velocity runs the transformer on the
generated tokens followed by the source tokens and keeps the generated tokens' part
(components.kontext_velocity). Guidance-distilled like FLUX.1-dev: FluxKontextPipeline's default
guidance is 2.5 (--guidance_scale 2.5).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import torch

import fastvideo.models.flux.components as FC
import fastvideo.models.kontext.components as C
from fastvideo.models import base
from fastvideo.models.base import EmbeddingShapeError, TensorConditioning
from fastvideo.models.flux.family import FluxFamily

SOURCE_NAMES = ("image_latents", "source_ids", "source_image")


def load_encoders(path, device="cpu", dtype=torch.float32) -> C.KontextEncoders:
    """FLUX.1's text encoders and the VAE that encodes the source images."""
    return C.KontextEncoders(FC.load_text_encoders(path, device=device, dtype=dtype),
                             FC.load_vae(path, device=device, dtype=dtype))


class KontextFamily(FluxFamily):
    """FLUX.1 Kontext [dev]; guidance_scale and quantize_timestep as FLUX.1's."""

    name = "kontext"
    # The stock pipeline a folder's model_index.json names (its transformer class is FLUX.1's).
    pipeline_class_name = "FluxKontextPipeline"
    # A checkpoint's FluxTransformer2DModel says FLUX.1 (family_for_class_name): a Kontext run's
    # checkpoint is found by the model.family its config.json records.
    variant_of = "flux"
    storage, json_keys = base.storage_with(FluxFamily, *SOURCE_NAMES)
    parts = replace(FluxFamily.parts, load_text_encoders=load_encoders)
    text_components = FluxFamily.text_components + ("vae",)
    text_encoder_components = FluxFamily.text_encoder_components + ("vae",)
    edits = True
    source_multiple = 16  # 8 pixels per latent cell, 2x2 packing

    def __init__(self, guidance_scale: float = 2.5, quantize_timestep: bool = True):
        super().__init__(guidance_scale, quantize_timestep)

    # -- conditioning
    def sequence_parallel_plan(self):
        """FLUX.1's plan (models/flux/sequence_parallel.py) on Kontext's image sequence, the generated
        tokens then the source tokens: both are split after x_embedder (their RoPE rows follow, the
        source's column 0 = 1 included), and proj_out's gather restores [generated ; source] before
        kontext_velocity keeps the generated part. The two token counts together must divide by
        --sp_size (checked at start-up with the stored source latents' count: sequence_tokens)."""
        from fastvideo.models.flux.sequence_parallel import flux_plan

        return flux_plan()

    def sequence_tokens(self, height, width, transformer_config, cond_dims=None):
        """The generated tokens and the source's (Ls of the stored image_latents: check_record's dims
        (L, D, P, Ls, C, H, W); unread: the generated tokens alone, the split refuses a source's at
        its first forward): the split divides [generated ; source]."""
        generated = self.nominal_layout(height, width, transformer_config).tokens[0]
        return generated + (int(cond_dims[3]) if cond_dims is not None and len(cond_dims) > 3 else 0)

    def cost_sequence_tokens(self, height, width, transformer_config):
        """The cost model's source has the target's tokens (meta_inputs): counted as the start-up
        check counts a stored source (sequence_tokens with its Ls)."""
        generated = self.nominal_layout(height, width, transformer_config).tokens[0]
        return self.sequence_tokens(height, width, transformer_config, (None, None, None, generated))

    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        return super().encode_prompts(getattr(encoders, "text", encoders), prompts, max_sequence_length)

    def encode_sources(self, encoders, cond, pixels) -> TensorConditioning:
        latents, ids = C.encode_source_latents(encoders.vae, pixels.to(encoders.device))
        per = {"image_latents": latents, "source_image": pixels.to(latents)}
        return TensorConditioning({**cond.tensors, **per}, {**cond.shared, "source_ids": ids})

    def source_images(self, cond) -> torch.Tensor:
        return cond["source_image"].float()

    def encoder_dims(self, encoders) -> dict[str, int]:
        vae = encoders.vae.config
        return {**super().encoder_dims(encoders.text), "latent_channels": int(vae.latent_channels),
                "vae_scale": FC.vae_scale_factor(vae)}

    def record_shapes(self, max_sequence_length, encoder_dims):
        h, w = encoder_dims["source_height"], encoder_dims["source_width"]
        lat_h, lat_w = FC.latent_hw(h, w, encoder_dims["vae_scale"])
        tokens = (lat_h // 2) * (lat_w // 2)
        return (*super().record_shapes(max_sequence_length, encoder_dims),
                (tokens, 4 * encoder_dims["latent_channels"]), (tokens, 3), (3, h, w))

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        cond = super().cond_from_tensors(records)
        per = {n: torch.stack([r[n] for r in records]) for n in ("image_latents", "source_image")}
        return TensorConditioning({**cond.tensors, **per}, {**cond.shared, "source_ids": records[0]["source_ids"]})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (L, D, P, Ls, C, H, W)): FLUX.1's checks, the source tensors' shapes against
        each other and against prompt 0's (first_dims)."""
        rec, text_dims = super().check_record(idx, record, first_dims[:3] if first_dims else None, where)
        lat, ids, pix = (record[n] for n in SOURCE_NAMES)
        if lat.ndim != 2 or pix.ndim != 3 or pix.shape[0] != 3 or tuple(ids.shape) != (lat.shape[0], 3):
            raise EmbeddingShapeError(
                f"prompt {idx}: image_latents {tuple(lat.shape)} / source_ids {tuple(ids.shape)} / source_image "
                f"{tuple(pix.shape)} should be [Ls, C] / [Ls, 3] / [3, H, W]; re-run the preprocessing")
        if lat.shape[0] * 256 != pix.shape[1] * pix.shape[2]:
            raise EmbeddingShapeError(f"prompt {idx}: {lat.shape[0]} source tokens do not make a {pix.shape[1]}x"
                                      f"{pix.shape[2]} source image (16 pixels a token side); re-run the preprocessing")
        dims = (*text_dims, lat.shape[0], lat.shape[1], pix.shape[1], pix.shape[2])
        base.check_first_dims(idx, dims, first_dims, where, "(L, D, P, Ls, C, H, W)",
                              "two preprocessing runs or source sizes")
        return {**rec, "image_latents": lat, "source_ids": ids, "source_image": pix}, dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        super().check_dims(dims[:3], transformer_config, max_sequence_length)
        if len(dims) > 4:  # (ExpectedDims, a config object, has no in_channels: nothing to check)
            base.check_source_channels(dims[4], transformer_config)

    def check_cond(self, cond) -> None:
        super().check_cond(cond)
        lat, ids = cond["image_latents"], cond["source_ids"]
        if lat.ndim != 3 or lat.shape[0] != cond["prompt_embeds"].shape[0] or tuple(ids.shape) != (lat.shape[1], 3):
            raise ValueError(f"image_latents must be [P, Ls, C] with source_ids [Ls, 3], got {tuple(lat.shape)} and "
                             f"{tuple(ids.shape)}")

    # -- sampling
    def schedule_shift(self, height, width, sampling_steps) -> float:
        """FluxKontextPipeline's size-dependent shift (--pipeline_shift)."""
        return C.schedule_shift(height, width)

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.kontext_velocity(transformer, x, sigma, cond, layout["image_ids"], self.guidance_scale,
                                  self.quantize_timestep)

    # -- cost model: the transformer runs on the generated and the source tokens (the source assumed
    # the target's size), and its output projection on both
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        inputs = super().meta_inputs(config, batch, layout, text_tokens, dtype)
        x, ids = inputs["hidden_states"], inputs["img_ids"]
        return {**inputs, "hidden_states": torch.cat([x, x], 1), "img_ids": torch.cat([ids, ids], 0)}

    def cond_numel_at(self, config, text_tokens, height, width) -> int:
        """FLUX.1's text tensors plus the source's: image_latents [Ls, C] and source_ids [Ls, 3] (shared
        by a batch; counted per sample, a bound) with Ls the target's tokens, source_image [3, H, W]."""
        tokens, channels = self.nominal_layout(height, width, config).tokens
        return self.cond_numel(config, text_tokens) + tokens * (channels + 3) + 3 * height * width

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        return super().transformer_flops(config, 2 * image_tokens, text_tokens, batch)
