"""FLUX.2 [klein] and [dev] as a ModelFamily (--model_family flux2, the current library line only): one
text encoder (three hidden layers stacked per token: klein's Qwen3, dev's Mistral-3), 2x2-patched
32-channel latents normalised by the VAE's batch-norm statistics, true classifier-free guidance on
the klein base checkpoints, a guidance embedding on dev.

The variant is the folder's: model_index.json's _class_name Flux2Pipeline is dev (Mistral-3 text
encoding; the transformer's guidance_embeds takes the scale, one pass), Flux2KleinPipeline is klein.
The transformer, VAE, latents, schedule and decode are the same code for both.

Conditioning: TensorConditioning with per-sample "prompt_embeds" [B, L, D] and shared
"neg_prompt_embeds" [L, D] (the empty prompt's, for guidance; Flux2KleinPipeline's negative prompt
is always ""). Stored per prompt: prompt_embed/ and negative_prompt_embed/ (the same negative for
every prompt, kept per prompt so a dataset folder stays self-contained). Layout extras: "image_ids"
[L, 4] (on the device), "grid_h", "grid_w" (the token grid, h/16 x w/16).

guidance_scale > 1 turns guidance on (the pipeline's rule; its default is 4.0): one batched
transformer call on the unconditional and conditional rows per velocity, counted as 2 passes. A
step-distilled checkpoint (model_index.json ``is_distilled``) runs without guidance, and
check_folder refuses it with a scale above 1. None (the family built without settings, as the
preflight and the cost model do): the pipeline's default 4.0, without the distilled check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch

import fastvideo.models.flux2.components as C
import fastvideo.models.flux2.flops as F
from fastvideo.models import base
from fastvideo.models.base import EmbeddingShapeError, LatentLayout, StoredTensor, TensorConditioning

MODEL_HINT = ("the embeddings were made with another text encoder (FLUX.2 [klein] 4B uses Qwen3-4B: 7680 wide, 9B "
              "Qwen3-8B: 12288, FLUX.2 [dev] Mistral-Small-3.1-24B: 15360) — re-run preprocessing with --model_path "
              "pointing at this model")


class Flux2Family(base.ModelFamily, base.FamilyCostModel):
    """FLUX.2 [klein] (4B, 9B; base or step-distilled) and [dev]. guidance_scale: klein's classifier-free
    guidance scale (> 1: on; None: the pipelines' 4.0), dev's embedded guidance; quantize_timestep: pass floor(1000 sigma) / 1000
    instead of sigma (Flux2KleinPipeline passes sigma: --no_quantize_timestep)."""

    name = "flux2"
    library_line = "current"  # diffusers >= 0.40 (Flux2Transformer2DModel, AutoencoderKLFlux2), transformers 5 (Qwen3)
    export_class_name = "Flux2Transformer2DModel"
    storage = (
        StoredTensor("prompt_embeds", "prompt_embed_path", "prompt_embed"),
        StoredTensor("neg_prompt_embeds", "negative_prompt_embed_path", "negative_prompt_embed"),
    )
    json_keys = ("prompt_embed_path", "negative_prompt_embed_path", "caption")
    max_sequence_length_limit = 512  # Flux2KleinPipeline's tokenizer_max_length
    text_components = ("text_encoder", "tokenizer")
    text_encoder_components = ("text_encoder",)
    training_components = ("transformer", "vae", "text_encoder")

    def __init__(self, guidance_scale: float | None = None, quantize_timestep: bool = False):
        self.guidance_scale = None if guidance_scale is None else float(guidance_scale)
        self.quantize_timestep = quantize_timestep
        self.variant: str | None = None  # "klein" / "dev" once a folder was checked or loaded

    @property
    def scale(self) -> float:
        """The guidance scale the velocity uses."""
        return C.DEFAULT_GUIDANCE if self.guidance_scale is None else self.guidance_scale

    @property
    def velocity_passes(self) -> int:
        """Transformer passes (in samples) per velocity: 2 under classifier-free guidance (klein), 1 on
        dev (its scale goes into the guidance embedding)."""
        return 2 if self.scale > 1.0 and self.variant != "dev" else 1

    def _note_variant(self, root) -> None:
        self.variant = C.variant(root) or self.variant

    def schedule_shift(self, height, width, sampling_steps) -> float:
        return C.schedule_shift(height, width, sampling_steps)

    # -- loading
    def check_folder(self, path, components=None) -> Path:
        root = C.check_flux2_folder(path, components)
        C.check_guidance(root, self.guidance_scale)
        self._note_variant(root)
        return root

    def folder_error(self, message: str) -> Exception:
        return C.Flux2FolderError(message)

    def transformer_class(self):
        from diffusers import Flux2Transformer2DModel

        return Flux2Transformer2DModel

    def load_transformer(self, root, subfolder, device, dtype):
        C.check_guidance(root, self.guidance_scale)
        self._note_variant(root)
        return C.load_transformer(root, subfolder, device, dtype)

    def sequence_parallel_plan(self):
        """Image tokens and their position ids split at the forward's input, gathered after
        proj_out; models/flux2/sequence_parallel.py ([klein] and [dev])."""
        from fastvideo.models.flux2.sequence_parallel import flux2_plan

        return flux2_plan()

    def adapt_for_device(self, transformer, device) -> None:
        C.adapt_for_device(transformer, device)

    def load_vae(self, path, device="cpu", dtype=torch.float32):
        return C.load_vae(path, device, dtype)

    def load_text_encoders(self, path, device="cpu", dtype=torch.float32):
        self._note_variant(path)
        return C.load_text_encoder(path, device, dtype)

    def block_classes(self):
        from diffusers.models.transformers.transformer_flux2 import Flux2SingleTransformerBlock, Flux2TransformerBlock

        return (Flux2TransformerBlock, Flux2SingleTransformerBlock)

    def blocks(self, model) -> list[torch.nn.Module]:
        """Double-stream blocks, then single-stream blocks (execution order)."""
        model = getattr(model, "module", model)
        return list(model.transformer_blocks) + list(model.single_transformer_blocks)

    # -- conditioning
    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        embeds = C.encode_prompts(encoders, list(prompts), max_sequence_length)
        negative = C.encode_prompts(encoders, [""], max_sequence_length)[0]
        return TensorConditioning({"prompt_embeds": embeds}, {"neg_prompt_embeds": negative})

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        return TensorConditioning({"prompt_embeds": torch.stack([r["prompt_embeds"] for r in records])},
                                  {"neg_prompt_embeds": records[0]["neg_prompt_embeds"]})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record, (L, D)); the negative must have the prompt's shape."""
        embed, negative = record["prompt_embeds"], record["neg_prompt_embeds"]
        if embed.ndim != 2:
            raise EmbeddingShapeError(f"prompt {idx}: prompt_embed {tuple(embed.shape)} should be [L, D] (one prompt "
                                      "per file); re-run the preprocessing")
        if negative.shape != embed.shape:
            raise EmbeddingShapeError(f"prompt {idx}: the negative (empty-prompt) embedding {tuple(negative.shape)} "
                                      f"differs in shape from the prompt's {tuple(embed.shape)} in {where!r}: it was not "
                                      "made by FLUX.2 preprocessing (--model_family flux2); re-run it into an empty folder")
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
        return {"embed_dim": len(C.TEXT_LAYERS) * encoders.hidden_size}

    def record_shapes(self, max_sequence_length, encoder_dims):
        seq = (max_sequence_length, encoder_dims["embed_dim"])
        return seq, seq

    def check_cond(self, cond) -> None:
        embeds = cond["prompt_embeds"]
        if embeds.ndim != 3 or cond["neg_prompt_embeds"].shape != embeds.shape[1:]:
            raise ValueError(f"prompt_embeds must be [P, L, D] and neg_prompt_embeds one prompt's [L, D], got "
                             f"{tuple(embeds.shape)} and {tuple(cond['neg_prompt_embeds'].shape)}")

    # -- sampling
    def layout(self, height, width, vae, transformer=None, device=None) -> LatentLayout:
        scale = 2 ** (len(C._cfg(vae.config, "block_out_channels")) - 1)
        if transformer is not None:
            channels = C._config(transformer).in_channels
        else:
            channels = 4 * int(C._cfg(vae.config, "latent_channels"))
        return self._layout(height, width, *C.grid_hw(height, width, scale), channels, device)

    @staticmethod
    def _layout(height, width, grid_h, grid_w, channels, device=None) -> LatentLayout:
        return LatentLayout(height=height, width=width, tokens=(grid_h * grid_w, channels),
                            latent_hw=(2 * grid_h, 2 * grid_w),
                            extras={"image_ids": C.image_ids(grid_h, grid_w, device), "grid_h": grid_h, "grid_w": grid_w})

    def nominal_layout(self, height, width, transformer_config) -> LatentLayout:
        """FLUX.2's VAE: 8 pixels per latent cell, 2x2 cells per token."""
        return self._layout(height, width, *C.grid_hw(height, width, 8), transformer_config["in_channels"])

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["neg_prompt_embeds"],
                                  layout["image_ids"], self.scale, self.quantize_timestep)

    def decode(self, vae, x0, layout) -> torch.Tensor:
        return C.decode_latents(vae, x0, layout["grid_h"], layout["grid_w"])

    # -- cost model (text_tokens: the Qwen3 sequence length)
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        guided = self.velocity_passes == 2 and not config.get("guidance_embeds", True)
        b, m = batch * (2 if guided else 1), "meta"
        return dict(
            hidden_states=torch.empty(b, layout.tokens[0], config["in_channels"], device=m, dtype=dtype),
            encoder_hidden_states=torch.empty(b, text_tokens, config["joint_attention_dim"], device=m, dtype=dtype),
            timestep=torch.empty(b, device=m, dtype=dtype),
            guidance=torch.empty(b, device=m, dtype=dtype) if config.get("guidance_embeds", True) else None,
            img_ids=layout["image_ids"].to(m), txt_ids=C.text_ids(text_tokens).to(m), return_dict=False,
        )

    def cond_numel(self, config, text_tokens) -> int:
        return text_tokens * config["joint_attention_dim"]

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """One velocity's FLOPs (both guidance passes under CFG): "forward", "backward", "blocks"
        and the forward's parts."""
        guided = self.velocity_passes == 2 and not C._cfg(config, "guidance_embeds", True)
        b = batch * (2 if guided else 1)
        parts = F.transformer_flops_breakdown(config, image_tokens, text_tokens, b)
        return {**{k: v for k, v in parts.items() if k != "total"}, "forward": parts["total"],
                "blocks": parts["double_blocks"] + parts["single_blocks"],
                "backward": F.transformer_backward_flops(config, image_tokens, text_tokens, b)}

    reference_name = "FLUX.2-klein-4B"
    reference_vae_config = F.FLUX2_VAE_CONFIG

    @property
    def reference_config(self) -> dict:
        """FLUX.2 [klein] 4B's transformer/config.json (F.KLEIN_4B)."""
        return F.reference_config(F.KLEIN_4B)

