"""Z-Image as a ModelFamily (--model_family zimage, the current library line only): one Qwen3 text
encoder (its second-to-last hidden layer, each prompt's own tokens), FLUX.1's 16-channel VAE, a
single-stream transformer that takes each sample's latent grid and unpadded caption, and
ZImagePipeline's classifier-free guidance (on for any scale > 0, default 5.0).

Conditioning: TensorConditioning with per-sample "prompt_embeds" [B, L, D] and "prompt_mask" [B, L]
(1 on the prompt's tokens; the embeddings are zero elsewhere) and shared "neg_prompt_embeds" [L, D]
and "neg_prompt_mask" [L] (the empty prompt's, ZImagePipeline's default negative). Stored per
prompt: prompt_embed/, prompt_mask/, negative_prompt_embed/, negative_prompt_mask/ (the mask in the
embeddings' dtype: preprocessing stores every file of a prompt in one dtype). Layout extras:
"latent_h", "latent_w" (the VAE grid; tokens are its 2x2 patches, FLUX.1's packing).

guidance_scale None (the family built without settings, as the preflight and the cost model do):
the pipeline's 5.0. Z-Image-Turbo is distilled to run without guidance: --guidance_scale 0.

The loading, the records and their checks, the layout, the velocity and decoding are
TextEmbedsFamily's (fastvideo/models/diffusers_family.py), set by the class attributes below.
"""

from __future__ import annotations

import torch

import fastvideo.models.zimage.components as C
import fastvideo.models.zimage.flops as F
from fastvideo.models import base
from fastvideo.models.diffusers_family import ComponentFunctions, TextEmbedsFamily
from fastvideo.models.flops import VAE_16CH_CONFIG


class ZImageFamily(TextEmbedsFamily):
    """Z-Image (6B; base or Turbo). guidance_scale: ZImagePipeline's classifier-free guidance scale
    (> 0: on; None: its default 5.0); quantize_timestep: round the scheduler's timestep down to an
    integer, 1000 sigma -> floor(1000 sigma) (DanceGRPO's convention; ZImagePipeline passes it
    unrounded: --no_quantize_timestep)."""

    name = "zimage"
    library_line = "current"  # diffusers >= 0.36 (ZImageTransformer2DModel), transformers 5 (Qwen3)
    export_class_name = "ZImageTransformer2DModel"
    storage = base.stored_tensors({"prompt_embeds": "prompt_embed", "prompt_mask": "prompt_mask"}, negatives=True)
    json_keys = base.json_keys_of(storage)
    max_sequence_length_limit = 512  # ZImagePipeline's max_sequence_length default
    parts = ComponentFunctions(
        check_folder=C.check_zimage_folder, folder_error=C.ZImageFolderError, load_transformer=C.load_transformer,
        adapt_for_device=C.adapt_for_device, load_vae=C.load_vae, load_text_encoders=C.load_text_encoder,
        encode_prompts=C.encode_prompts, decode_latents=C.decode_latents, predict_velocity=C.predict_velocity,
        flops_breakdown=F.transformer_flops_breakdown, backward_flops=F.transformer_backward_flops)
    default_guidance_scale = C.DEFAULT_GUIDANCE
    cfg_above = 0.0  # the pipeline's convention: guidance for any scale > 0
    # Noise-refiner, context-refiner, then the main blocks (execution order).
    block_lists = ("noise_refiner", "context_refiner", "layers")
    block_flop_parts = ("noise_refiner", "context_refiner", "layers")
    in_channels_per_cell = True  # the transformer patches each token's 2x2 cells itself
    # The empty prompt: ZImagePipeline's default negative.
    negative_prompt = ""
    text_width_key = "cap_feat_dim"
    model_hint = ("the embeddings were made with another text encoder (Z-Image uses Qwen3-4B, 2560 wide) — "
                  "re-run preprocessing with --model_path pointing at this model")
    made_by = "Z-Image preprocessing (--model_family zimage)"

    def block_classes(self):
        from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock

        return (ZImageTransformerBlock,)

    def sequence_parallel_plan(self):
        """Image tokens split after the image stream's embedding (noise refiner and main layers
        attend across the sequence group); models/zimage/sequence_parallel.py."""
        from fastvideo.models.zimage.sequence_parallel import zimage_plan

        return zimage_plan()

    def sequence_tokens(self, height, width, transformer_config, cond_dims=None):
        """The image tokens padded as the forward pads them (diffusers' SEQ_MULTI_OF, 32): the split
        divides the padded stream."""
        tokens = self.nominal_layout(height, width, transformer_config).tokens[0]
        return tokens + (-tokens) % C.SEQUENCE_MULTIPLE

    def attention_dims(self, transformer_config):
        """ZImageTransformer2DModel's n_heads and dim / n_heads."""
        heads = int(transformer_config["n_heads"])
        return heads, int(transformer_config["dim"]) // heads

    def sequence_channels(self, transformer_config):
        """The final layer's: in_channels x patch^2 x frame patch."""
        return int(transformer_config["in_channels"]) * int(transformer_config["all_patch_size"][0]) ** 2 * \
            int(transformer_config["all_f_patch_size"][0])

    # -- cost model (text_tokens: each prompt's Qwen3 token count)
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        b, m = batch * self.velocity_passes, "meta"
        lat_h, lat_w = layout["latent_h"], layout["latent_w"]
        return dict(x=[torch.empty(config["in_channels"], 1, lat_h, lat_w, device=m, dtype=dtype) for _ in range(b)],
                    t=torch.empty(b, device=m, dtype=dtype),
                    cap_feats=[torch.empty(text_tokens, config["cap_feat_dim"], device=m, dtype=dtype)
                               for _ in range(b)],
                    return_dict=False)

    reference_name = "Z-Image (6B)"
    reference_vae_config = VAE_16CH_CONFIG

    @property
    def reference_config(self) -> dict:
        """Z-Image's transformer/config.json (F.Z_IMAGE_6B)."""
        return F.reference_config(F.Z_IMAGE_6B)
