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

The loading, the records and their checks, the layout, the velocity and decoding are
TextEmbedsFamily's (fastvideo/models/diffusers_family.py), set by the class attributes below.
"""

from __future__ import annotations

import torch

import fastvideo.models.qwen_image.components as C
import fastvideo.models.qwen_image.flops as F
from fastvideo.models import base
from fastvideo.models.base import config_value
from fastvideo.models.diffusers_family import ComponentFunctions, TextEmbedsFamily
from fastvideo.models.flops import VAE_16CH_CONFIG

# AutoencoderKLQwenImage's decoder as the cost model's 2D AutoencoderKL count reads it: Qwen-Image's
# widths (base 96 x [1, 2, 4, 4]), 2 residual blocks per level plus one, 16 latent channels. Its
# causal 3x3x3 convolutions on one frame add time taps over padding the 2D count leaves out.
QWEN_IMAGE_VAE_CONFIG = {**VAE_16CH_CONFIG, "block_out_channels": [96, 192, 384, 384], "use_post_quant_conv": True}


class QwenImageFamily(TextEmbedsFamily):
    """Qwen-Image (20B). guidance_scale: QwenImagePipeline's true_cfg_scale (> 1: on; None: its default
    4.0); quantize_timestep: round the scheduler's timestep down to an integer, 1000 sigma ->
    floor(1000 sigma) (DanceGRPO's convention; the pipeline passes it unrounded: --no_quantize_timestep)."""

    name = "qwen_image"
    library_line = "current"  # diffusers >= 0.35 (QwenImagePipeline), transformers 5 (Qwen2.5-VL)
    export_class_name = "QwenImageTransformer2DModel"
    storage = base.stored_tensors({"prompt_embeds": "prompt_embed", "prompt_mask": "prompt_embeds_mask"}, negatives=True)
    json_keys = base.json_keys_of(storage)
    max_sequence_length_limit = 1024  # QwenImagePipeline.check_inputs refuses more
    parts = ComponentFunctions(
        check_folder=C.check_qwen_image_folder, folder_error=C.QwenImageFolderError,
        load_transformer=C.load_transformer, adapt_for_device=C.adapt_for_device, load_vae=C.load_vae,
        load_text_encoders=C.load_text_encoder, encode_prompts=C.encode_prompts, decode_latents=C.decode_latents,
        predict_velocity=C.predict_velocity, flops_breakdown=F.transformer_flops_breakdown,
        backward_flops=F.transformer_backward_flops)
    default_guidance_scale = C.DEFAULT_TRUE_CFG
    cfg_above = 1.0  # the pipeline's true CFG: on for a scale > 1
    block_flop_parts = ("transformer_blocks",)
    cost_depth_key = "num_layers"  # its only stack, 60 identical blocks: the memory model measures 2-4 (perf.memory)
    negative_prompt = C.NEGATIVE_PROMPT
    model_hint = ("the embeddings were made with another text encoder (Qwen-Image uses Qwen2.5-VL-7B, 3584 wide) — "
                  "re-run preprocessing with --model_path pointing at this model")
    made_by = "Qwen-Image preprocessing (--model_family qwen_image)"

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

    def block_classes(self):
        from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

        return (QwenImageTransformerBlock,)

    # -- sampling
    def schedule_shift(self, height, width, sampling_steps) -> float:
        """exp(mu) of Qwen-Image's scheduler for this image size (--pipeline_shift)."""
        return C.scheduler_shift({"use_dynamic_shifting": True, **C.SCHEDULER_SHIFT_DEFAULTS}, height, width)

    def schedule_terminal(self) -> float:
        """Qwen-Image's scheduler's shift_terminal (0.02): the rollout's grid is stretched to it."""
        return C.SCHEDULER_SHIFT_TERMINAL

    def vae_geometry(self, vae_config) -> tuple[int, int]:
        """AutoencoderKLQwenImage's: 2 ** (temporal downsamplings) pixels per cell, z_dim channels."""
        return 2 ** len(config_value(vae_config, "temperal_downsample")), int(config_value(vae_config, "z_dim"))

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

    reference_name = "Qwen-Image (20B)"
    reference_vae_config = QWEN_IMAGE_VAE_CONFIG

    @property
    def reference_config(self) -> dict:
        """Qwen-Image's transformer/config.json (F.QWEN_IMAGE_20B)."""
        return F.reference_config(F.QWEN_IMAGE_20B)
