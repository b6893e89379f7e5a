"""FLUX.1 Kontext [dev] as a ModelFamily: FLUX.1's family (loading, text conditioning, latents,
decoding, FSDP blocks, FLOPs) plus a source image per prompt.

Conditioning: FLUX.1's TensorConditioning with, per sample, "image_latents" [B, Ls, 64] (the
packed, normalised VAE latents of the source image) and "source_image" [B, 3, H, W] in [0, 1] (what
the rewards see), and shared "source_ids" [Ls, 3] (column 0 = 1). Stored per prompt beside FLUX.1's
folders in image_latents/, source_image/ and source_ids/. The velocity runs the transformer on the
generated tokens followed by the source tokens and keeps the generated tokens' part
(components.kontext_velocity). The source tokens' records, checks, split and cost are
models/source_tokens.py's, shared with FLUX.2 [klein] editing. Guidance-distilled like FLUX.1-dev: FluxKontextPipeline's default
guidance is 2.5 (--guidance_scale 2.5).
"""

from __future__ import annotations

from dataclasses import replace

import torch

import fastvideo.models.flux.components as FC
import fastvideo.models.kontext.components as C
from fastvideo.models import base
from fastvideo.models.flux.family import FluxFamily
from fastvideo.models.source_tokens import SOURCE_NAMES, SourceTokens, encoders_loader, with_vae


class KontextFamily(SourceTokens, FluxFamily):
    """FLUX.1 Kontext [dev]; guidance_scale and quantize_timestep as FLUX.1's."""

    name = "kontext"
    # The stock pipeline a folder's model_index.json names (its transformer class is FLUX.1's).
    pipeline_class_name = "FluxKontextPipeline"
    # A checkpoint's FluxTransformer2DModel says FLUX.1 (family_for_class_name): a Kontext run's
    # checkpoint is found by the model.family its config.json records.
    variant_of = "flux"
    storage, json_keys = base.storage_with(FluxFamily, *SOURCE_NAMES)
    # FLUX.1's text encoders and the VAE that encodes the source images
    parts = replace(FluxFamily.parts, load_text_encoders=encoders_loader(FC.load_text_encoders, FC.load_vae))
    text_components, text_encoder_components = map(with_vae, (FluxFamily.text_components,
                                                              FluxFamily.text_encoder_components))
    source_id_width = 3  # FLUX.1's (0 | 1, row, column): the source's column 0 is 1

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

    def encode_source_latents(self, vae, pixels):
        return C.encode_source_latents(vae, pixels)

    # -- sampling
    def schedule_shift(self, height, width, sampling_steps) -> float:
        """FluxKontextPipeline's size-dependent shift (--pipeline_shift)."""
        return C.schedule_shift(height, width)

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.kontext_velocity(transformer, x, sigma, cond, layout["image_ids"], self.guidance_scale,
                                  self.quantize_timestep)
