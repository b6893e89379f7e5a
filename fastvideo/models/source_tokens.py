"""Editing families whose transformer reads the source image as extra latent tokens after the
generated ones (FLUX.1 Kontext, FLUX.2 [klein] editing): what they share.

Conditioning: the base family's text tensors plus, per sample, "image_latents" [B, Ls, C] (the
packed, normalised VAE latents of the source image) and "source_image" [B, 3, H, W] in [0, 1] (what
the rewards see), and shared "source_ids" [Ls, K] (the source tokens' position ids, K the base
family's id width). Stored per prompt in image_latents/, source_image/ and source_ids/. Several
reference images (max_references > 1: FLUX.2 [klein]) are one sequence: image_latents [N Ls, C] and
source_ids [N Ls, K] the references' in order (the family's ids tell them apart: reference_count),
source_image the first reference's pixels (what the rewards and grids show). A velocity
runs the transformer on [generated ; source] tokens with [image ids ; source ids] and keeps the
generated part; the source tokens also count in the sequence-parallel split, the cost model's inputs
and FLOPs.

A family mixes :class:`SourceTokens` in before its base family and says ``source_id_width`` and
``encode_source_latents(vae, pixels) -> (latents [B, Ls, C], ids [Ls, K])``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from fastvideo.models import base, record_checks
from fastvideo.models.base import EmbeddingShapeError, TensorConditioning
from fastvideo.models.latents import latent_hw, vae_scale_factor

SOURCE_NAMES = ("image_latents", "source_ids", "source_image")
PIXELS_PER_TOKEN = 16  # 8 pixels per latent cell, 2x2 cells per token (FLUX.1's packing, FLUX.2's patches)


@dataclass
class SourceEncoders:
    """The base family's text encoder(s) and the VAE that encodes the source images."""

    text: object
    vae: torch.nn.Module

    @property
    def device(self) -> torch.device:
        return self.text.device


def encoders_loader(load_text, load_vae):
    """An editing family's load_text_encoders (ComponentFunctions): its base family's text encoder(s)
    and the VAE that encodes the source images, as :class:`SourceEncoders`."""

    def load(path, device="cpu", dtype=torch.float32) -> SourceEncoders:
        return SourceEncoders(load_text(path, device=device, dtype=dtype), load_vae(path, device=device, dtype=dtype))

    return load


def with_vae(components: tuple[str, ...]) -> tuple[str, ...]:
    """A base family's text components plus the VAE (it encodes the sources: preprocessing's fingerprint)."""
    return components + ("vae",)


class SourceTokens:
    """Mixin for an editing family on a text-to-image base family (see the module docstring)."""

    source_id_width: int = 3
    text_dim_count: int = 3  # the base family's record dims before the source's (FLUX.1: L, D, P; FLUX.2: L, D)
    edits = True
    source_multiple = PIXELS_PER_TOKEN

    def encode_source_latents(self, vae, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__}.encode_source_latents")

    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        return super().encode_prompts(getattr(encoders, "text", encoders), prompts, max_sequence_length)

    def encode_sources(self, encoders, cond, pixels) -> TensorConditioning:
        """pixels [B, 3, H, W], or [B, N, 3, H, W] for N references (the first kept as source_image)."""
        latents, ids = self.encode_source_latents(encoders.vae, pixels.to(encoders.device))
        first = pixels[:, 0] if pixels.ndim == 5 else pixels
        per = {"image_latents": latents, "source_image": first.to(latents)}
        return TensorConditioning({**cond.tensors, **per}, {**cond.shared, "source_ids": ids})

    def reference_count(self, ids: torch.Tensor) -> int:
        """The reference images whose tokens ``ids`` [Ls, K] hold (one unless max_references > 1)."""
        return 1

    def source_images(self, cond) -> torch.Tensor:
        return cond["source_image"].float()  # of several references, the first

    def encoder_dims(self, encoders) -> dict[str, int]:
        vae = encoders.vae.config
        return {**super().encoder_dims(encoders.text), "latent_channels": int(vae.latent_channels),
                "vae_scale": vae_scale_factor(vae)}

    def record_shapes(self, max_sequence_length, encoder_dims):
        h, w = encoder_dims["source_height"], encoder_dims["source_width"]
        lat_h, lat_w = latent_hw(h, w, encoder_dims["vae_scale"])
        tokens = (lat_h // 2) * (lat_w // 2) * encoder_dims.get("source_references", 1)
        return (*super().record_shapes(max_sequence_length, encoder_dims),
                (tokens, 4 * encoder_dims["latent_channels"]), (tokens, self.source_id_width), (3, h, w))

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        cond = super().cond_from_tensors(records)
        per = {n: torch.stack([r[n] for r in records]) for n in ("image_latents", "source_image")}
        return TensorConditioning({**cond.tensors, **per}, {**cond.shared, "source_ids": records[0]["source_ids"]})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (*text dims, Ls, C, H, W)): the base family's checks, the source tensors' shapes
        against each other and against prompt 0's (first_dims)."""
        n = self.text_dim_count
        rec, text_dims = super().check_record(idx, record, first_dims[:n] if first_dims else None, where)
        lat, ids, pix = (record[n] for n in SOURCE_NAMES)
        k = self.source_id_width
        if lat.ndim != 2 or pix.ndim != 3 or pix.shape[0] != 3 or tuple(ids.shape) != (lat.shape[0], k):
            raise EmbeddingShapeError(
                f"prompt {idx}: image_latents {tuple(lat.shape)} / source_ids {tuple(ids.shape)} / source_image "
                f"{tuple(pix.shape)} should be [Ls, C] / [Ls, {k}] / [3, H, W]; re-run the preprocessing")
        refs = self.reference_count(ids)
        if lat.shape[0] * PIXELS_PER_TOKEN ** 2 != refs * pix.shape[1] * pix.shape[2]:
            raise EmbeddingShapeError(f"prompt {idx}: {lat.shape[0]} source tokens do not make {refs} {pix.shape[1]}x"
                                      f"{pix.shape[2]} source image(s) (16 pixels a token side); re-run the preprocessing")
        dims = (*text_dims, lat.shape[0], lat.shape[1], pix.shape[1], pix.shape[2])
        names = ", ".join(("L", "D", "P")[:n] + ("Ls", "C", "H", "W"))
        record_checks.check_first_dims(idx, dims, first_dims, where, f"({names})",
                              "two preprocessing runs or source sizes")
        return {**rec, "image_latents": lat, "source_ids": ids, "source_image": pix}, dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        n = self.text_dim_count
        super().check_dims(dims[:n], transformer_config, max_sequence_length)
        if len(dims) > n + 1:  # (ExpectedDims, a config object, has no in_channels: nothing to check)
            record_checks.check_source_channels(dims[n + 1], transformer_config)

    def check_cond(self, cond) -> None:
        super().check_cond(cond)
        lat, ids = cond["image_latents"], cond["source_ids"]
        k = self.source_id_width
        if lat.ndim != 3 or lat.shape[0] != cond["prompt_embeds"].shape[0] or tuple(ids.shape) != (lat.shape[1], k):
            raise ValueError(f"image_latents must be [P, Ls, C] with source_ids [Ls, {k}], got {tuple(lat.shape)} and "
                             f"{tuple(ids.shape)}")

    # -- sequence parallelism: the split divides [generated ; source]
    def sequence_tokens(self, height, width, transformer_config, cond_dims=None):
        """The generated tokens and the source's (Ls of the stored image_latents: check_record's dims
        (*text dims, Ls, C, H, W); unread: the generated tokens alone, the split refuses a source's at
        its first forward)."""
        generated = self.nominal_layout(height, width, transformer_config).tokens[0]
        n = self.text_dim_count
        return generated + (int(cond_dims[n]) if cond_dims is not None and len(cond_dims) > n else 0)

    def cost_sequence_tokens(self, height, width, transformer_config):
        """The cost model's source has the target's tokens (meta_inputs): counted as the start-up
        check counts a stored source (sequence_tokens with its Ls)."""
        generated = self.nominal_layout(height, width, transformer_config).tokens[0]
        return self.sequence_tokens(height, width, transformer_config, (None,) * self.text_dim_count + (generated,))

    # -- cost model: the transformer runs on the generated and the source tokens (the source assumed
    # the target's size), and its output projection on both
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        inputs = super().meta_inputs(config, batch, layout, text_tokens, dtype)
        x, ids = inputs["hidden_states"], inputs["img_ids"]
        return {**inputs, "hidden_states": torch.cat([x, x], 1), "img_ids": torch.cat([ids, ids], 0)}

    def cond_numel_at(self, config, text_tokens, height, width) -> int:
        """The base family's text tensors plus the source's: image_latents [Ls, C] and source_ids [Ls, K]
        (shared by a batch; counted per sample, a bound) with Ls the target's tokens, source_image [3, H, W]."""
        tokens, channels = self.nominal_layout(height, width, config).tokens
        return self.cond_numel(config, text_tokens) + tokens * (channels + self.source_id_width) + 3 * height * width

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        return super().transformer_flops(config, 2 * image_tokens, text_tokens, batch)
