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
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch

import fastvideo.models.zimage.components as C
import fastvideo.models.zimage.flops as F
from fastvideo.models import base
from fastvideo.models.base import EmbeddingShapeError, LatentLayout, StoredTensor, TensorConditioning
from fastvideo.models.flops import VAE_16CH_CONFIG

MODEL_HINT = ("the embeddings were made with another text encoder (Z-Image uses Qwen3-4B, 2560 wide) — "
              "re-run preprocessing with --model_path pointing at this model")
RECORD_KEYS = ("prompt_embeds", "prompt_mask", "neg_prompt_embeds", "neg_prompt_mask")


class ZImageFamily(base.ModelFamily, base.FamilyCostModel):
    """Z-Image (6B; base or Turbo). guidance_scale: ZImagePipeline's classifier-free guidance scale
    (> 0: on; None: its default 5.0); quantize_timestep: round the scheduler's timestep down to an
    integer, 1000 sigma -> floor(1000 sigma) (DanceGRPO's convention; ZImagePipeline passes it
    unrounded: --no_quantize_timestep)."""

    name = "zimage"
    library_line = "current"  # diffusers >= 0.36 (ZImageTransformer2DModel), transformers 5 (Qwen3)
    export_class_name = "ZImageTransformer2DModel"
    storage = (
        StoredTensor("prompt_embeds", "prompt_embed_path", "prompt_embed"),
        StoredTensor("prompt_mask", "prompt_mask_path", "prompt_mask"),
        StoredTensor("neg_prompt_embeds", "negative_prompt_embed_path", "negative_prompt_embed"),
        StoredTensor("neg_prompt_mask", "negative_prompt_mask_path", "negative_prompt_mask"),
    )
    json_keys = ("prompt_embed_path", "prompt_mask_path", "negative_prompt_embed_path", "negative_prompt_mask_path",
                 "caption")
    max_sequence_length_limit = 512  # ZImagePipeline's max_sequence_length default
    text_components = ("text_encoder", "tokenizer")
    text_encoder_components = ("text_encoder",)
    training_components = ("transformer", "vae", "text_encoder")

    def __init__(self, guidance_scale: float | None = None, quantize_timestep: bool = False):
        self.guidance_scale = None if guidance_scale is None else float(guidance_scale)
        self.quantize_timestep = quantize_timestep

    @property
    def scale(self) -> float:
        """The guidance scale the velocity uses (the pipeline's convention: 0 is none)."""
        return C.DEFAULT_GUIDANCE if self.guidance_scale is None else self.guidance_scale

    @property
    def velocity_passes(self) -> int:
        """Transformer passes (in samples) per velocity: 2 under classifier-free guidance."""
        return 2 if self.scale > 0 else 1

    # -- loading
    def check_folder(self, path, components=None) -> Path:
        return C.check_zimage_folder(path, components)

    def folder_error(self, message: str) -> Exception:
        return C.ZImageFolderError(message)

    def transformer_class(self):
        from diffusers import ZImageTransformer2DModel

        return ZImageTransformer2DModel

    def load_transformer(self, root, subfolder, device, dtype):
        return C.load_transformer(root, subfolder, device, dtype)

    def adapt_for_device(self, transformer, device) -> None:
        C.adapt_for_device(transformer, device)

    def load_vae(self, path, device="cpu", dtype=torch.float32):
        return C.load_vae(path, device, dtype)

    def load_text_encoders(self, path, device="cpu", dtype=torch.float32):
        return C.load_text_encoder(path, device, dtype)

    def block_classes(self):
        from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock

        return (ZImageTransformerBlock,)

    def blocks(self, model) -> list[torch.nn.Module]:
        """Noise-refiner, context-refiner, then the main blocks (execution order)."""
        model = getattr(model, "module", model)
        return list(model.noise_refiner) + list(model.context_refiner) + list(model.layers)

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

    # -- conditioning
    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        embeds, mask = C.encode_prompts(encoders, list(prompts), max_sequence_length)
        neg, neg_mask = C.encode_prompts(encoders, [""], max_sequence_length)
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
                                      f"prompt_mask [L], got {tuple(mask.shape)}; re-run the preprocessing")
        if negative.shape != embed.shape or neg_mask.shape != mask.shape:
            raise EmbeddingShapeError(f"prompt {idx}: the negative (empty-prompt) embedding {tuple(negative.shape)} "
                                      f"differs in shape from the prompt's {tuple(embed.shape)} in {where!r}: it was not "
                                      "made by Z-Image preprocessing (--model_family zimage); re-run it into an empty folder")
        dims = tuple(embed.shape)
        base.check_first_dims(idx, dims, first_dims, where)
        return dict(record), dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        seq, width = dims
        cap = C._cfg(transformer_config, "cap_feat_dim")
        if cap is not None and width != cap:
            raise EmbeddingShapeError(f"prompt embeddings have width {width} but the transformer expects "
                                      f"cap_feat_dim {cap}: {MODEL_HINT}")
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
    def layout(self, height, width, vae, transformer=None, device=None) -> LatentLayout:
        scale = 2 ** (len(C._cfg(vae.config, "block_out_channels")) - 1)
        if transformer is not None:
            channels = 4 * int(getattr(transformer, "module", transformer).config.in_channels)
        else:
            channels = 4 * int(C._cfg(vae.config, "latent_channels"))
        return self._layout(height, width, *C.latent_hw(height, width, scale), channels)

    @staticmethod
    def _layout(height, width, lat_h, lat_w, channels) -> LatentLayout:
        return LatentLayout(height=height, width=width, tokens=((lat_h // 2) * (lat_w // 2), channels),
                            latent_hw=(lat_h, lat_w), extras={"latent_h": lat_h, "latent_w": lat_w})

    def nominal_layout(self, height, width, transformer_config) -> LatentLayout:
        """FLUX.1's VAE: 8 pixels per latent cell, 2x2 cells per token."""
        return self._layout(height, width, *C.latent_hw(height, width, 8), 4 * transformer_config["in_channels"])

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["prompt_mask"],
                                  cond["neg_prompt_embeds"], cond["neg_prompt_mask"], layout["latent_h"],
                                  layout["latent_w"], self.scale, self.quantize_timestep)

    def decode(self, vae, x0, layout) -> torch.Tensor:
        return C.decode_latents(vae, x0, layout["latent_h"], layout["latent_w"])

    # -- cost model (text_tokens: each prompt's Qwen3 token count)
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        b, m = batch * self.velocity_passes, "meta"
        lat_h, lat_w = layout["latent_h"], layout["latent_w"]
        return dict(x=[torch.empty(config["in_channels"], 1, lat_h, lat_w, device=m, dtype=dtype) for _ in range(b)],
                    t=torch.empty(b, device=m, dtype=dtype),
                    cap_feats=[torch.empty(text_tokens, config["cap_feat_dim"], device=m, dtype=dtype)
                               for _ in range(b)],
                    return_dict=False)

    def cond_numel(self, config, text_tokens) -> int:
        return text_tokens * (config["cap_feat_dim"] + 1)  # the embedding and its mask

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """One velocity's FLOPs (both guidance passes under CFG): "forward", "backward", "blocks"
        (the refiners and the main blocks) and the forward's parts."""
        b = batch * self.velocity_passes
        parts = F.transformer_flops_breakdown(config, image_tokens, text_tokens, b)
        return {**{k: v for k, v in parts.items() if k != "total"}, "forward": parts["total"],
                "blocks": parts["noise_refiner"] + parts["context_refiner"] + parts["layers"],
                "backward": F.transformer_backward_flops(config, image_tokens, text_tokens, b)}

    reference_name = "Z-Image (6B)"
    reference_vae_config = VAE_16CH_CONFIG

    @property
    def reference_config(self) -> dict:
        """Z-Image's transformer/config.json (F.Z_IMAGE_6B)."""
        return F.reference_config(F.Z_IMAGE_6B)
