"""FLUX.2 [klein] editing as a ModelFamily (--model_family flux2_edit, the current library line only):
FLUX.2's family (loading, Qwen3 text conditioning, true classifier-free guidance, latents, decoding,
FSDP blocks, FLOPs) plus a source image per prompt (or several references, up to max_references, the
JSONL "image" list: Flux2KleinPipeline(image=[...])), as Flux2KleinPipeline(image=...) runs it and as
Flow-Factory trains klein (examples/grpo/full/flux2_klein_base/default.yaml at a0b2bc5: an editing
dataset, condition_image_size 384).

The folder is a klein folder (Flux2KleinPipeline: the same checkpoint edits and generates), so this
family is chosen by name, never from the folder. Conditioning: FLUX.2's TensorConditioning with the
source tokens of models/source_tokens.py: per sample "image_latents" [B, Ls, 128] and "source_image"
[B, 3, H, W], shared "source_ids" [Ls, 4] = (10, row, column, 0). Sources are used at their own size
(sides multiples of 16, as the pipeline crops them); the pipeline shrinks a source above 1024 x 1024
pixels of area first, Flow-Factory above 384 x 384: give sources of that size (docs/editing.md).
Both guidance rows see the source (the pipeline's unconditional pass takes the same image tokens).
"""

from __future__ import annotations

from dataclasses import replace

import torch

import fastvideo.models.flux2.components as FC
import fastvideo.models.flux2_edit.components as C
from fastvideo.errors import ConfigError
from fastvideo.models import base
from fastvideo.models.flux2.family import Flux2Family
from fastvideo.models.source_tokens import SOURCE_NAMES, SourceTokens, encoders_loader, with_vae


class Flux2EditFamily(SourceTokens, Flux2Family):
    """FLUX.2 [klein] editing; guidance_scale and quantize_timestep as FLUX.2's."""

    name = "flux2_edit"
    # A checkpoint's Flux2Transformer2DModel says FLUX.2 (family_for_class_name): an editing run's
    # checkpoint is found by the model.family its config.json records.
    variant_of = "flux2"
    runs_on = "flux2"  # klein's own folders (preprocessing accepts them for this family)
    storage, json_keys = base.storage_with(Flux2Family, *SOURCE_NAMES)
    # FLUX.2's text encoder and the VAE that encodes the source images
    parts = replace(Flux2Family.parts, load_text_encoders=encoders_loader(FC.load_text_encoder, FC.load_vae))
    text_components, text_encoder_components = map(with_vae, (Flux2Family.text_components,
                                                              Flux2Family.text_encoder_components))
    source_id_width = 4  # FLUX.2's (time, row, column, layer): the source's time is 10
    stored_dtypes = {"source_ids": torch.long}  # FLUX.2's ids are integers (image_ids)
    text_dim_count = 2  # FLUX.2's records: (L, D)
    # Flux2KleinPipeline(image=[...]) takes any number of references and sets no bound; each one adds
    # its tokens to every transformer call, so a record gives at most this many (preprocessing refuses more)
    max_references = 4
    made_by = "FLUX.2 [klein] editing preprocessing (--model_family flux2_edit)"

    def check_source_size(self, height, width) -> None:
        """Flux2KleinPipeline's own rules for a reference image (Flux2ImageProcessor.check_image_input:
        sides of 64 pixels or more, aspect ratio 8 at most) and its area (above 1024 x 1024 it would
        shrink the source first, which this family does not)."""
        problem = None
        if min(height, width) < C.MIN_SOURCE_SIDE:
            problem = f"a side under {C.MIN_SOURCE_SIDE} pixels"
        elif max(height, width) > C.MAX_SOURCE_ASPECT * min(height, width):
            problem = f"an aspect ratio above {C.MAX_SOURCE_ASPECT}:1"
        elif height * width > C.MAX_SOURCE_AREA:
            problem = "more than 1024 x 1024 pixels"
        if problem:
            raise ConfigError(f"source images of {width}x{height} have {problem}, which Flux2KleinPipeline "
                                   "refuses or resizes: give sources of 64 to 1024 pixels a side (multiples of 16; "
                                   "Flow-Factory's klein uses 384 x 384)")

    def encode_source_latents(self, vae, pixels):
        return C.encode_source_latents(vae, pixels)

    def reference_count(self, ids) -> int:
        return C.reference_count(ids)

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.edit_velocity(transformer, x, sigma, cond, layout["image_ids"], self.scale, self.quantize_timestep)
