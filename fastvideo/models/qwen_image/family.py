"""Qwen-Image as a ModelFamily (--model_family qwen_image, the current library line only): a Qwen2.5-VL
text encoder (its last hidden layer under QwenImagePipeline's system template, the template's 34
prefix tokens dropped), the 16-channel video VAE AutoencoderKLQwenImage on one frame with per-channel
latent statistics, a 60-block double-stream MMDiT on FLUX.1's packed 2x2 tokens, and the pipeline's
true classifier-free guidance (on for a scale > 1, default 4.0, with the negative prompt " ", the
combination rescaled to the conditional prediction's norm per token).

Conditioning: TensorConditioning with per-sample "prompt_embeds" [B, L, D] and "prompt_mask" [B, L]
(1 on the prompt's tokens; the embeddings are zero elsewhere) and shared "neg_prompt_embeds" [L, D]
and "neg_prompt_mask" [L] (the negative prompt's). Stored per prompt: prompt_embed/,
prompt_embeds_mask/, negative_prompt_embed/, negative_prompt_embeds_mask/ (the pipeline's names;
the mask in the embeddings' dtype). Layout extras: "latent_h", "latent_w" (the VAE grid).

guidance_scale: the pipeline's true_cfg_scale (None, the family built without settings as the
preflight and the cost model do: its 4.0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch

import fastvideo.models.qwen_image.components as C
import fastvideo.models.qwen_image.flops as F
from fastvideo.models import base
from fastvideo.models.base import EmbeddingShapeError, LatentLayout, StoredTensor, TensorConditioning

MODEL_HINT = ("the embeddings were made with another text encoder (Qwen-Image uses Qwen2.5-VL-7B, 3584 wide) — "
              "re-run preprocessing with --model_path pointing at this model")
RECORD_KEYS = ("prompt_embeds", "prompt_mask", "neg_prompt_embeds", "neg_prompt_mask")
# AutoencoderKLQwenImage's decoder as the cost model's 2D AutoencoderKL count reads it: Qwen-Image's
# widths (base 96 x [1, 2, 4, 4]), 2 residual blocks per level plus one, 16 latent channels. Its
# causal 3x3x3 convolutions on one frame add time taps over padding the 2D count leaves out.
QWEN_IMAGE_VAE_CONFIG = {
    "block_out_channels": [96, 192, 384, 384],
    "layers_per_block": 2,
    "latent_channels": 16,
    "out_channels": 3,
    "mid_block_add_attention": True,
    "use_post_quant_conv": True,
}


class QwenImageFamily(base.ModelFamily, base.FamilyCostModel):
    """Qwen-Image (20B). guidance_scale: QwenImagePipeline's true_cfg_scale (> 1: on; None: its default
    4.0); quantize_timestep: round the scheduler's timestep down to an integer, 1000 sigma ->
    floor(1000 sigma) (DanceGRPO's convention; the pipeline passes it unrounded: --no_quantize_timestep)."""

    name = "qwen_image"
    library_line = "current"  # diffusers >= 0.35 (QwenImagePipeline), transformers 5 (Qwen2.5-VL)
    export_class_name = "QwenImageTransformer2DModel"
    storage = (
        StoredTensor("prompt_embeds", "prompt_embed_path", "prompt_embed"),
        StoredTensor("prompt_mask", "prompt_embeds_mask_path", "prompt_embeds_mask"),
        StoredTensor("neg_prompt_embeds", "negative_prompt_embed_path", "negative_prompt_embed"),
        StoredTensor("neg_prompt_mask", "negative_prompt_embeds_mask_path", "negative_prompt_embeds_mask"),
    )
    json_keys = ("prompt_embed_path", "prompt_embeds_mask_path", "negative_prompt_embed_path",
                 "negative_prompt_embeds_mask_path", "caption")
    max_sequence_length_limit = 1024  # QwenImagePipeline.check_inputs refuses more
    text_components = ("text_encoder", "tokenizer")
    text_encoder_components = ("text_encoder",)
    training_components = ("transformer", "vae", "text_encoder")

    def __init__(self, guidance_scale: float | None = None, quantize_timestep: bool = False):
        self.guidance_scale = None if guidance_scale is None else float(guidance_scale)
        self.quantize_timestep = quantize_timestep

    @property
    def scale(self) -> float:
        """The true_cfg_scale the velocity uses (the pipeline's convention: guidance for > 1)."""
        return C.DEFAULT_TRUE_CFG if self.guidance_scale is None else self.guidance_scale

    @property
    def velocity_passes(self) -> int:
        """Transformer passes (in samples) per velocity: 2 under true classifier-free guidance."""
        return 2 if self.scale > 1.0 else 1

    # -- loading
    def check_folder(self, path, components=None) -> Path:
        return C.check_qwen_image_folder(path, components)

    def folder_error(self, message: str) -> Exception:
        return C.QwenImageFolderError(message)

    def transformer_class(self):
        from diffusers import QwenImageTransformer2DModel

        return QwenImageTransformer2DModel

    def load_transformer(self, root, subfolder, device, dtype):
        return C.load_transformer(root, subfolder, device, dtype)

    def meta_transformer(self, config, dtype):
        """The default's meta model with its RoPE tables made for real: QwenEmbedRope keeps them as plain
        tensor attributes (complex, no buffers), which loading the weights does not fill."""
        model = super().meta_transformer(config, dtype)
        rope = model.pos_embed
        with torch.device("cpu"):
            model.pos_embed = type(rope)(rope.theta, list(rope.axes_dim), rope.scale_rope)
        return model

    def sequence_parallel_plan(self):
        """Image tokens split after img_in (RoPE's image rows follow), gathered after proj_out;
        models/qwen_image/sequence_parallel.py."""
        from fastvideo.models.qwen_image.sequence_parallel import qwen_image_plan

        return qwen_image_plan()

    def adapt_for_device(self, transformer, device) -> None:
        C.adapt_for_device(transformer, device)

    def load_vae(self, path, device="cpu", dtype=torch.float32):
        return C.load_vae(path, device, dtype)

    def load_text_encoders(self, path, device="cpu", dtype=torch.float32):
        return C.load_text_encoder(path, device, dtype)

    def block_classes(self):
        from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

        return (QwenImageTransformerBlock,)

    def blocks(self, model) -> list[torch.nn.Module]:
        return list(getattr(model, "module", model).transformer_blocks)

    # -- conditioning
    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        embeds, mask = C.encode_prompts(encoders, list(prompts), max_sequence_length)
        neg, neg_mask = C.encode_prompts(encoders, [C.NEGATIVE_PROMPT], max_sequence_length)
        return TensorConditioning({"prompt_embeds": embeds, "prompt_mask": mask},
                                  {"neg_prompt_embeds": neg[0], "neg_prompt_mask": neg_mask[0]})

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        return TensorConditioning({k: torch.stack([r[k] for r in records]) for k in RECORD_KEYS[:2]},
                                  {k: records[0][k] for k in RECORD_KEYS[2:]})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (L, D)); masks [L], the negative of the prompt's shape."""
        embed, mask = record["prompt_embeds"], record["prompt_mask"]
        negative, neg_mask = record["neg_prompt_embeds"], record["neg_prompt_mask"]
        if embed.ndim != 2 or tuple(mask.shape) != embed.shape[:1]:
            raise EmbeddingShapeError(f"prompt {idx}: prompt_embed {tuple(embed.shape)} should be [L, D] with a "
                                      f"prompt_embeds_mask [L], got {tuple(mask.shape)}; re-run the preprocessing")
        if negative.shape != embed.shape or neg_mask.shape != mask.shape:
            raise EmbeddingShapeError(f"prompt {idx}: the negative prompt's embedding {tuple(negative.shape)} differs "
                                      f"in shape from the prompt's {tuple(embed.shape)} in {where!r}: it was not made "
                                      "by Qwen-Image preprocessing (--model_family qwen_image); re-run it into an "
                                      "empty folder")
        dims = tuple(embed.shape)
        base.check_first_dims(idx, dims, first_dims, where)
        return dict(record), dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        seq, width = dims
        joint = C._cfg(transformer_config, "joint_attention_dim")
        if joint is not None and width != joint:
            raise EmbeddingShapeError(f"prompt embeddings have width {width} but the transformer expects "
                                      f"joint_attention_dim {joint}: {MODEL_HINT}")
        base.check_sequence_length(seq, max_sequence_length)

    def encoder_dims(self, encoders) -> dict[str, int]:
        return {"embed_dim": encoders.hidden_size}

    def record_shapes(self, max_sequence_length, encoder_dims):
        seq, mask = (max_sequence_length, encoder_dims["embed_dim"]), (max_sequence_length,)
        return seq, mask, seq, mask

    def check_cond(self, cond) -> None:
        embeds, mask = cond["prompt_embeds"], cond["prompt_mask"]
        if embeds.ndim != 3 or mask.shape != embeds.shape[:2] or cond["neg_prompt_embeds"].shape != embeds.shape[1:]:
            raise ValueError(f"prompt_embeds must be [P, L, D] with prompt_mask [P, L] and neg_prompt_embeds one "
                             f"prompt's [L, D], got {tuple(embeds.shape)}, {tuple(mask.shape)} and "
                             f"{tuple(cond['neg_prompt_embeds'].shape)}")

    # -- sampling
    def schedule_shift(self, height, width, sampling_steps) -> float:
        """exp(mu) of Qwen-Image's scheduler for this image size (--pipeline_shift)."""
        return C.scheduler_shift({"use_dynamic_shifting": True, **C.SCHEDULER_SHIFT_DEFAULTS}, height, width)

    def schedule_terminal(self) -> float:
        """Qwen-Image's scheduler's shift_terminal (0.02): the rollout's grid is stretched to it."""
        return C.SCHEDULER_SHIFT_TERMINAL

    def layout(self, height, width, vae, transformer=None, device=None) -> LatentLayout:
        scale = 2 ** len(C._cfg(vae.config, "temperal_downsample"))
        if transformer is not None:
            channels = int(getattr(transformer, "module", transformer).config.in_channels)
        else:
            channels = 4 * int(C._cfg(vae.config, "z_dim"))
        return self._layout(height, width, *C.latent_hw(height, width, scale), channels)

    @staticmethod
    def _layout(height, width, lat_h, lat_w, channels) -> LatentLayout:
        return LatentLayout(height=height, width=width, tokens=((lat_h // 2) * (lat_w // 2), channels),
                            latent_hw=(lat_h, lat_w), extras={"latent_h": lat_h, "latent_w": lat_w})

    def nominal_layout(self, height, width, transformer_config) -> LatentLayout:
        """Qwen-Image's VAE: 8 pixels per latent cell, 2x2 cells per token."""
        return self._layout(height, width, *C.latent_hw(height, width, 8), transformer_config["in_channels"])

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["prompt_mask"],
                                  cond["neg_prompt_embeds"], cond["neg_prompt_mask"], layout["latent_h"],
                                  layout["latent_w"], self.scale, self.quantize_timestep)

    def decode(self, vae, x0, layout) -> torch.Tensor:
        return C.decode_latents(vae, x0, layout["latent_h"], layout["latent_w"])

    # -- cost model (text_tokens: the prompt's Qwen2.5-VL tokens after the template's prefix)
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        b, m = batch * self.velocity_passes, "meta"
        lat_h, lat_w = layout["latent_h"], layout["latent_w"]
        return dict(hidden_states=torch.empty(b, (lat_h // 2) * (lat_w // 2), config["in_channels"], device=m,
                                              dtype=dtype),
                    encoder_hidden_states=torch.empty(b, text_tokens, config["joint_attention_dim"], device=m,
                                                      dtype=dtype),
                    timestep=torch.empty(b, device=m, dtype=dtype),
                    img_shapes=[[(1, lat_h // 2, lat_w // 2)]] * b, return_dict=False)

    def cond_numel(self, config, text_tokens) -> int:
        return text_tokens * (config["joint_attention_dim"] + 1)  # the embedding and its mask

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """One velocity's FLOPs (both guidance passes under CFG): "forward", "backward", "blocks" and
        the forward's parts."""
        b = batch * self.velocity_passes
        parts = F.transformer_flops_breakdown(config, image_tokens, text_tokens, b)
        return {**{k: v for k, v in parts.items() if k != "total"}, "forward": parts["total"],
                "blocks": parts["transformer_blocks"],
                "backward": F.transformer_backward_flops(config, image_tokens, text_tokens, b)}

    reference_name = "Qwen-Image (20B)"
    reference_vae_config = QWEN_IMAGE_VAE_CONFIG

    @property
    def reference_config(self) -> dict:
        """Qwen-Image's transformer/config.json (F.QWEN_IMAGE_20B)."""
        return F.reference_config(F.QWEN_IMAGE_20B)
