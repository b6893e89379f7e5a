"""Qwen-Image-Edit (2509 / 2511, diffusers' QwenImageEditPlusPipeline) as a ModelFamily: Qwen-Image's
family (loading, the transformer class, latents, decoding, true CFG, FSDP blocks, FLOPs) plus a source
image per prompt that the VL text encoder sees and whose VAE latents join the token sequence.

Conditioning: TensorConditioning with, per sample, "prompt_embeds" [B, L, D] / "prompt_mask" [B, L]
(the instruction with its condition image's tokens, components.encode_edit_prompt), the negative
prompt's "neg_prompt_embeds" / "neg_prompt_mask" (per sample too: the negative is encoded with each
sample's image), "image_latents" [B, Ls, 64] and "source_image" [B, 3, H, W] in [0, 1] (what the
rewards see); shared "source_grid" int64 [2] (the source's token grid, its img_shapes entry). Stored
per prompt beside Qwen-Image's folders in image_latents/, source_image/ and source_grid/.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import torch

import fastvideo.models.qwen_image.components as QC
import fastvideo.models.qwen_image.flops as QF
import fastvideo.models.qwen_image_edit.components as C
from fastvideo.models import base, parts, record_checks
from fastvideo.models.base import EmbeddingShapeError, check_diffusers_folder, TensorConditioning
from fastvideo.models.qwen_image.family import QwenImageFamily

EDIT_HINT = parts.download_hint("Qwen-Image-Edit", "Qwen/Qwen-Image-Edit-2509", "qwen_image_edit")
PER_SAMPLE = ("prompt_embeds", "prompt_mask", "neg_prompt_embeds", "neg_prompt_mask", "image_latents", "source_image")


def check_edit_folder(path, components=None):
    """Qwen-Image's folder with the VL encoder's processor (transformers 5 writes
    processor/processor_config.json, older ones preprocessor_config.json: no file required)."""
    required = {**QC.REQUIRED_FILES, "processor": []}
    return check_diffusers_folder(path, required, EDIT_HINT, QC.QwenImageFolderError, "Qwen-Image-Edit model folder",
                                  components)


@dataclass
class PendingPrompts(TensorConditioning):
    """encode_prompts' result: the instructions, waiting for their source images (encode_sources
    encodes text and image together)."""

    prompts: list[str] = field(default_factory=list)
    max_sequence_length: int = 512


class QwenImageEditFamily(QwenImageFamily):
    """Qwen-Image-Edit-2509 / -2511; guidance_scale (true_cfg_scale) and quantize_timestep as Qwen-Image's.
    condition_area / vae_area: the areas the source is resized to for the VL encoder and for the VAE
    (the pipeline's 384^2 and 1024^2; vae_area is preprocessing's --source_vae_size, Flow-Factory's
    condition_image_size)."""

    name = "qwen_image_edit"
    pipeline_class_name = "QwenImageEditPlusPipeline"
    # A checkpoint's QwenImageTransformer2DModel says Qwen-Image (family_for_class_name): an edit
    # run's checkpoint is found by the model.family its config.json records.
    variant_of = "qwen_image"
    storage, json_keys = base.storage_with(QwenImageFamily, "image_latents", "source_image", "source_grid")
    parts = replace(QwenImageFamily.parts, check_folder=check_edit_folder, load_text_encoders=C.load_edit_encoders)
    text_components = ("text_encoder", "tokenizer", "processor", "vae")
    text_encoder_components = ("text_encoder", "vae")
    edits = True
    source_multiple = 1  # the pipeline resizes every source itself (calculate_dimensions)
    condition_area = C.CONDITION_IMAGE_SIZE

    def __init__(self, guidance_scale: float | None = None, quantize_timestep: bool = False,
                 vae_area: int = C.VAE_IMAGE_SIZE):
        super().__init__(guidance_scale, quantize_timestep)
        self.vae_area = int(vae_area)

    # -- conditioning
    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        return PendingPrompts({"row": torch.arange(len(prompts))}, {}, list(prompts), max_sequence_length)

    def encode_sources(self, encoders, cond, pixels) -> TensorConditioning:
        if not isinstance(cond, PendingPrompts):
            raise TypeError("encode_sources takes encode_prompts' result (the instructions, not yet encoded)")
        out = C.encode_sources(encoders, cond.prompts, QC.NEGATIVE_PROMPT, pixels, cond.max_sequence_length,
                               self.condition_area, self.vae_area)
        grid = out.pop("source_grid")
        out["source_image"] = pixels.to(out["image_latents"])
        return TensorConditioning(out, {"source_grid": grid})

    def source_images(self, cond) -> torch.Tensor:
        return cond["source_image"].float()

    def encoder_dims(self, encoders) -> dict[str, int]:
        return {"embed_dim": encoders.text.hidden_size, "latent_channels": int(encoders.vae.config.z_dim)}

    def record_shapes(self, max_sequence_length, encoder_dims):
        h, w = encoder_dims["source_height"], encoder_dims["source_width"]
        _, (vw, vh) = C.source_sizes(w, h, self.condition_area, self.vae_area)
        tokens = (vh // 16) * (vw // 16)
        return (*super().record_shapes(max_sequence_length, encoder_dims),
                (tokens, 4 * encoder_dims["latent_channels"]), (3, h, w), (2,))

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        return TensorConditioning({k: torch.stack([r[k] for r in records]) for k in PER_SAMPLE},
                                  {"source_grid": records[0]["source_grid"].to(torch.int64)})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (L, D, Ls, C, H, W)): Qwen-Image's text checks, the source tensors' shapes
        against each other and against prompt 0's."""
        rec, text_dims = super().check_record(idx, record, None, where)
        lat, pix, grid = record["image_latents"], record["source_image"], record["source_grid"]
        if lat.ndim != 2 or pix.ndim != 3 or pix.shape[0] != 3 or tuple(grid.shape) != (2,):
            raise EmbeddingShapeError(f"prompt {idx}: image_latents {tuple(lat.shape)} / source_image "
                                      f"{tuple(pix.shape)} / source_grid {tuple(grid.shape)} should be [Ls, C] / "
                                      "[3, H, W] / [2]; re-run the preprocessing")
        gh, gw = (int(v) for v in grid.tolist())
        if gh * gw != lat.shape[0]:
            raise EmbeddingShapeError(f"prompt {idx}: {lat.shape[0]} source tokens do not fill the source grid "
                                      f"{gh}x{gw}; re-run the preprocessing")
        dims = (*text_dims, lat.shape[0], lat.shape[1], pix.shape[1], pix.shape[2])
        record_checks.check_first_dims(idx, dims, first_dims, where, "(L, D, Ls, C, H, W)",
                              "two preprocessing runs or source sizes")
        return {**rec, "image_latents": lat, "source_image": pix, "source_grid": grid.to(torch.int64)}, dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        super().check_dims(dims[:2], transformer_config, max_sequence_length)
        if len(dims) > 3:
            record_checks.check_source_channels(dims[3], transformer_config)

    def check_cond(self, cond) -> None:
        embeds, lat = cond["prompt_embeds"], cond["image_latents"]
        if embeds.ndim != 3 or cond["neg_prompt_embeds"].shape != embeds.shape or lat.ndim != 3 \
                or lat.shape[0] != embeds.shape[0]:
            raise ValueError(f"prompt_embeds and neg_prompt_embeds must be [P, L, D] and image_latents [P, Ls, C], "
                             f"got {tuple(embeds.shape)}, {tuple(cond['neg_prompt_embeds'].shape)} and "
                             f"{tuple(lat.shape)}")

    def sequence_parallel_plan(self):
        """Qwen-Image's plan (models/qwen_image/sequence_parallel.py) on the whole image stream, the
        generated tokens then the source's: both are split after img_in (pos_embed's image rows, one
        table per img_shapes entry concatenated, follow), proj_out's gather restores [generated ; source]
        and edit_velocity keeps the generated part. Together they must divide by --sp_size (checked at
        start-up with the stored source latents' count: sequence_tokens). Under zero_cond_t (2511) each
        block's modulate_index follows the split too."""
        from fastvideo.models.qwen_image.sequence_parallel import qwen_image_plan

        return qwen_image_plan()

    def sequence_tokens(self, height, width, transformer_config, cond_dims=None):
        """The generated tokens and the source's (Ls of the stored image_latents: check_record's dims
        (L, D, Ls, C, H, W); unread: the generated tokens alone, the split refuses at its first forward)."""
        generated = self.nominal_layout(height, width, transformer_config).tokens[0]
        return generated + (int(cond_dims[2]) if cond_dims is not None and len(cond_dims) > 2 else 0)

    def cost_sequence_tokens(self, height, width, transformer_config):
        """The cost model's source (meta_inputs: the target's aspect at vae_area) counted as the start-up
        check counts a stored one."""
        gh, gw = self.source_grid_at(height, width)
        return self.sequence_tokens(height, width, transformer_config, (None, None, gh * gw))

    # -- sampling
    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.edit_velocity(transformer, x, sigma, cond, layout["latent_h"], layout["latent_w"], self.scale,
                               self.quantize_timestep)

    # -- cost model: the source assumed of the target's aspect, resized to vae_area (its tokens join the
    # sequence); preprocessing alone holds the text encoder (Qwen2.5-VL-7B with its vision tower)
    def source_grid_at(self, height: int, width: int) -> tuple[int, int]:
        """The source's token grid (rows, columns) for a height x width target: the pipeline's
        calculate_dimensions at vae_area and the target's aspect, 16 pixels per token."""
        vw, vh = C.calculate_dimensions(self.vae_area, width / height)
        return vh // 16, vw // 16

    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        inputs = super().meta_inputs(config, batch, layout, text_tokens, dtype)
        x, shapes = inputs["hidden_states"], inputs["img_shapes"]
        gh, gw = self.source_grid_at(layout["latent_h"], layout["latent_w"])
        src = x.new_empty(x.shape[0], gh * gw, x.shape[2])
        return {**inputs, "hidden_states": torch.cat([x, src], 1), "img_shapes": [s + [(1, gh, gw)] for s in shapes]}

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """image_tokens: the generated ones (a square target assumed for the source's grid)."""
        gh, gw = self.source_grid_at(1, 1)
        return super().transformer_flops(config, image_tokens + gh * gw, text_tokens, batch)

    def cond_numel_at(self, config, text_tokens, height, width) -> int:
        """Qwen-Image's text tensors (the instruction's and the negative's, each with its mask), the
        source latents [Ls, in_channels], its pixels [3, H, W] (the target's size assumed) and grid."""
        gh, gw = self.source_grid_at(height, width)
        return 2 * self.cond_numel(config, text_tokens) + gh * gw * config["in_channels"] + 3 * height * width + 2

    reference_name = "Qwen-Image-Edit-2509 (20B)"
    reference_text_encoder_params = QF.QWEN2_5_VL_7B_PARAMS
