"""Stable Diffusion 3 / 3.5 as a ModelFamily (--model_family sd3): three text encoders, unpatched
16-channel latents held channels-last, classifier-free guidance inside the velocity.

Conditioning: TensorConditioning with per-sample "prompt_embeds" [B, 77 + L, D] and "pooled"
[B, P], shared "neg_prompt_embeds" [77 + L, D] and "neg_pooled" [P] (the empty prompt's, for
classifier-free guidance). Stored per prompt: prompt_embed/, pooled_prompt_embeds/ and the empty
prompt's negative_prompt_embed/, negative_pooled_prompt_embeds/ (the same for every prompt; kept
per prompt so a dataset folder stays self-contained). Layout extras: "latent_h", "latent_w".

guidance_scale > 1 turns classifier-free guidance on (StableDiffusion3Pipeline's and Flow-GRPO's
rule; Flow-GRPO trains SD3.5-M at 4.5): each velocity is one batched transformer call on the
unconditional and conditional rows, in the rollout and in the update's log-probabilities alike,
and counts as 2 forward passes (velocity_passes).

The loading, the layout and decoding are DiffusersFamily's (fastvideo/models/diffusers_family.py),
set by the class attributes below.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

import fastvideo.models.sd3.components as C
import fastvideo.models.sd3.flops as F
from fastvideo.models import base, record_checks
from fastvideo.models.base import EmbeddingShapeError, TensorConditioning
from fastvideo.models.diffusers_family import ComponentFunctions, DiffusersFamily

MODEL_HINT = "the embeddings were made with another text encoder — re-run preprocessing with --model_path pointing at this model"


class SD3Family(DiffusersFamily):
    """SD3 / SD3.5. guidance_scale: classifier-free guidance scale (> 1: on); quantize_timestep:
    pass floor(1000 sigma) instead of 1000 sigma (StableDiffusion3Pipeline / Flow-GRPO)."""

    name = "sd3"
    export_class_name = "SD3Transformer2DModel"
    storage = base.stored_tensors({"prompt_embeds": "prompt_embed", "pooled": "pooled_prompt_embeds"}, negatives=True)
    json_keys = base.json_keys_of(storage)
    max_sequence_length_limit = 512  # StableDiffusion3Pipeline refuses longer T5 sequences
    text_components = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3")
    text_encoder_components = ("text_encoder", "text_encoder_2", "text_encoder_3")
    training_components = ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")

    parts = ComponentFunctions(
        check_folder=C.check_sd3_folder, folder_error=C.SD3FolderError, load_transformer=C.load_transformer,
        adapt_for_device=C.adapt_for_device, load_vae=C.load_vae, load_text_encoders=C.load_text_encoders,
        encode_prompts=C.encode_prompts, decode_latents=C.decode_latents,
        flops_breakdown=F.transformer_flops_breakdown, backward_flops=F.transformer_backward_flops)
    cfg_above = 1.0  # StableDiffusion3Pipeline's rule: classifier-free guidance for a scale > 1
    token_patch = 1  # one latent cell per token, channels last: the transformer patches the grid itself
    block_flop_parts = ("blocks",)

    def __init__(self, guidance_scale: float = 4.5, quantize_timestep: bool = False):
        super().__init__(guidance_scale, quantize_timestep)

    def block_classes(self):
        from diffusers.models.attention import JointTransformerBlock

        return (JointTransformerBlock,)

    def sequence_parallel_plan(self):
        from fastvideo.models.sd3.sequence_parallel import sd3_plan

        return sd3_plan()

    # -- conditioning
    def encode_prompts(self, encoders, prompts, max_sequence_length=256) -> TensorConditioning:
        embeds, pooled = C.encode_prompts(encoders, list(prompts), max_sequence_length)
        neg_embeds, neg_pooled = C.encode_prompts(encoders, [""], max_sequence_length)
        return TensorConditioning({"prompt_embeds": embeds, "pooled": pooled},
                                  {"neg_prompt_embeds": neg_embeds[0], "neg_pooled": neg_pooled[0]})

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        return TensorConditioning(
            {"prompt_embeds": torch.stack([r["prompt_embeds"] for r in records]),
             "pooled": torch.stack([r["pooled"] for r in records])},
            {"neg_prompt_embeds": records[0]["neg_prompt_embeds"], "neg_pooled": records[0]["neg_pooled"]})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (L, D, P)) with L the T5 length (prompt_embeds has 77 + L rows: dims[0] is
        max_sequence_length, as FLUX's); the negatives must have the prompt's shapes."""
        embed, pooled = record["prompt_embeds"], record["pooled"]
        if embed.ndim != 2 or pooled.ndim != 1:
            raise EmbeddingShapeError(f"prompt {idx}: prompt_embed {tuple(embed.shape)} / pooled {tuple(pooled.shape)} "
                                      "should be [77 + L, D] / [P] (one prompt per file); re-run the preprocessing")
        if record["neg_prompt_embeds"].shape != embed.shape or record["neg_pooled"].shape != pooled.shape:
            raise EmbeddingShapeError(f"prompt {idx}: the negative (empty-prompt) embeddings differ in shape from "
                                      f"the prompt's in {where!r}; re-run the preprocessing into an empty folder")
        if embed.shape[0] <= C.CLIP_TOKENS:
            raise EmbeddingShapeError(f"prompt {idx}: prompt_embed has {embed.shape[0]} rows, not 77 CLIP + T5 tokens: "
                                      f"{where!r} was not made by SD3 preprocessing (--model_family sd3)")
        dims = (embed.shape[0] - C.CLIP_TOKENS, embed.shape[1], pooled.shape[0])
        record_checks.check_first_dims(idx, dims, first_dims, where, "(L, D, P)")
        return dict(record), dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        seq, width, pooled = dims
        record_checks.check_width("prompt embeddings", width, transformer_config, "joint_attention_dim", MODEL_HINT)
        record_checks.check_width("pooled prompt embeddings", pooled, transformer_config, "pooled_projection_dim",
                         MODEL_HINT)
        if max_sequence_length is not None and seq != max_sequence_length:
            raise EmbeddingShapeError(f"prompt embeddings have 77 + {seq} tokens but 77 + {max_sequence_length} are "
                                      f"expected: re-run preprocessing with --max_sequence_length {max_sequence_length}")

    def encoder_dims(self, encoders) -> dict[str, int]:
        return {"embed_dim": int(encoders.t5.config.d_model),
                "pooled_dim": int(encoders.clip_l.config.projection_dim + encoders.clip_g.config.projection_dim)}

    def record_shapes(self, max_sequence_length, encoder_dims):
        seq = (C.CLIP_TOKENS + max_sequence_length, encoder_dims["embed_dim"])
        return seq, (encoder_dims["pooled_dim"],), seq, (encoder_dims["pooled_dim"],)

    def check_cond(self, cond) -> None:
        embeds, pooled = cond["prompt_embeds"], cond["pooled"]
        if embeds.ndim != 3 or pooled.ndim != 2:
            raise ValueError(f"prompt_embeds must be [P, Lt, D] and pooled [P, P'], got {tuple(embeds.shape)} and "
                             f"{tuple(pooled.shape)}")
        if cond["neg_prompt_embeds"].shape != embeds.shape[1:] or cond["neg_pooled"].shape != pooled.shape[1:]:
            raise ValueError("neg_prompt_embeds / neg_pooled must be one prompt's [Lt, D] / [P']")

    # -- sampling
    def sequence_tokens(self, height, width, transformer_config, cond_dims=None):
        """The patches pos_embed makes (the split's tokens), not the latent cells."""
        lat_h, lat_w = C.latent_hw(height, width, 8)
        patch = int(transformer_config.get("patch_size") or 2)
        return (lat_h // patch) * (lat_w // patch)

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["pooled"],
                                  cond["neg_prompt_embeds"], cond["neg_pooled"], layout["latent_h"],
                                  layout["latent_w"], self.guidance_scale, self.quantize_timestep)

    # -- cost model (text_tokens: the T5 length; the 77 CLIP tokens are added here)
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        b, m = batch * self.velocity_passes, "meta"
        return dict(
            hidden_states=torch.empty(b, config["in_channels"], *layout.latent_hw, device=m, dtype=dtype),
            encoder_hidden_states=torch.empty(b, C.CLIP_TOKENS + text_tokens, config["joint_attention_dim"],
                                              device=m, dtype=dtype),
            pooled_projections=torch.empty(b, config["pooled_projection_dim"], device=m, dtype=dtype),
            timestep=torch.empty(b, device=m, dtype=dtype), return_dict=False,
        )

    def cond_numel(self, config, text_tokens) -> int:
        return (C.CLIP_TOKENS + text_tokens) * config["joint_attention_dim"] + config["pooled_projection_dim"]

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """The base's count with the 77 CLIP tokens added; the joint blocks' part as "joint_blocks"."""
        flops = super().transformer_flops(config, image_tokens, C.CLIP_TOKENS + text_tokens, batch)
        return {**flops, "joint_blocks": flops["blocks"]}

    reference_name = "SD3.5-Medium"
    reference_vae_config = F.SD35_VAE_CONFIG

    @property
    def reference_config(self) -> dict:
        """stabilityai/stable-diffusion-3.5-medium's transformer/config.json."""
        from dataclasses import asdict

        cfg = asdict(F.SD35_MEDIUM)
        return {**cfg, "dual_attention_layers": list(cfg["dual_attention_layers"]), "sample_size": 128,
                "pos_embed_max_size": 384, "qk_norm": "rms_norm"}
