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

The loading, the records and their checks, the layout and decoding are TextEmbedsFamily's
(fastvideo/models/diffusers_family.py), set by the class attributes below (unmasked embeddings).
"""

from __future__ import annotations

from pathlib import Path

import torch

import fastvideo.models.flux2.components as C
import fastvideo.models.flux2.flops as F
from fastvideo.models import base
from fastvideo.models.base import config_value
from fastvideo.models.diffusers_family import ComponentFunctions, TextEmbedsFamily


class Flux2Family(TextEmbedsFamily):
    """FLUX.2 [klein] (4B, 9B; base or step-distilled) and [dev]. guidance_scale: klein's classifier-free
    guidance scale (> 1: on; None: the pipelines' 4.0), dev's embedded guidance; quantize_timestep: pass
    floor(1000 sigma) / 1000 instead of sigma (Flux2KleinPipeline passes sigma: --no_quantize_timestep)."""

    name = "flux2"
    library_line = "current"  # diffusers >= 0.40 (Flux2Transformer2DModel, AutoencoderKLFlux2), transformers 5 (Qwen3)
    export_class_name = "Flux2Transformer2DModel"
    storage = base.stored_tensors({"prompt_embeds": "prompt_embed"}, negatives=True)
    json_keys = base.json_keys_of(storage)
    max_sequence_length_limit = 512  # Flux2KleinPipeline's tokenizer_max_length
    parts = ComponentFunctions(
        check_folder=C.check_flux2_folder, folder_error=C.Flux2FolderError, load_transformer=C.load_transformer,
        adapt_for_device=C.adapt_for_device, load_vae=C.load_vae, load_text_encoders=C.load_text_encoder,
        encode_prompts=C.encode_prompts, decode_latents=C.decode_latents,
        flops_breakdown=F.transformer_flops_breakdown, backward_flops=F.transformer_backward_flops)
    default_guidance_scale = C.DEFAULT_GUIDANCE
    # Double-stream blocks, then single-stream blocks (execution order).
    block_lists = ("transformer_blocks", "single_transformer_blocks")
    block_flop_parts = ("double_blocks", "single_blocks")
    masked = False
    negative_prompt = ""  # Flux2KleinPipeline's negative prompt is always the empty one
    model_hint = ("the embeddings were made with another text encoder (FLUX.2 [klein] 4B uses Qwen3-4B: 7680 wide, "
                  "9B Qwen3-8B: 12288, FLUX.2 [dev] Mistral-Small-3.1-24B: 15360) — re-run preprocessing with "
                  "--model_path pointing at this model")
    made_by = "FLUX.2 preprocessing (--model_family flux2)"

    def __init__(self, guidance_scale: float | None = None, quantize_timestep: bool = False):
        super().__init__(guidance_scale, quantize_timestep)
        self.variant: str | None = None  # "klein" / "dev" once a folder was checked or loaded

    @property
    def velocity_passes(self) -> int:
        """Transformer passes (in samples) per velocity: 2 under classifier-free guidance (klein), 1 on
        dev (its scale goes into the guidance embedding)."""
        return 2 if self.scale > 1.0 and self.variant != "dev" else 1

    def cost_passes(self, config) -> int:
        """2 under klein's classifier-free guidance on a transformer without a guidance embedding."""
        return 2 if self.velocity_passes == 2 and not config_value(config, "guidance_embeds", True) else 1

    def _note_variant(self, root) -> None:
        self.variant = C.variant(root) or self.variant

    def schedule_shift(self, height, width, sampling_steps) -> float:
        return C.schedule_shift(height, width, sampling_steps)

    # -- loading: the folder's variant noted, a distilled checkpoint refused with guidance
    def check_folder(self, path, components=None) -> Path:
        root = super().check_folder(path, components)
        C.check_guidance(root, self.guidance_scale)
        self._note_variant(root)
        return root

    def load_transformer(self, root, subfolder, device, dtype):
        C.check_guidance(root, self.guidance_scale)
        self._note_variant(root)
        return super().load_transformer(root, subfolder, device, dtype)

    def load_text_encoders(self, path, device="cpu", dtype=torch.float32):
        self._note_variant(path)
        return super().load_text_encoders(path, device, dtype)

    def sequence_parallel_plan(self):
        """Image tokens and their position ids split at the forward's input, gathered after
        proj_out; models/flux2/sequence_parallel.py ([klein] and [dev])."""
        from fastvideo.models.flux2.sequence_parallel import flux2_plan

        return flux2_plan()

    def block_classes(self):
        from diffusers.models.transformers.transformer_flux2 import Flux2SingleTransformerBlock, Flux2TransformerBlock

        return (Flux2TransformerBlock, Flux2SingleTransformerBlock)

    # -- conditioning
    def encoder_dims(self, encoders) -> dict[str, int]:
        """D: the stacked hidden layers' width."""
        return {"embed_dim": len(C.TEXT_LAYERS) * encoders.hidden_size}

    # -- sampling
    def layout_extras(self, latent_h, latent_w, device=None):
        """The token grid "grid_h", "grid_w" (h/16 x w/16) and its "image_ids" [L, 4] on the device."""
        grid_h, grid_w = latent_h // 2, latent_w // 2
        return {"image_ids": C.image_ids(grid_h, grid_w, device), "grid_h": grid_h, "grid_w": grid_w}

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["neg_prompt_embeds"],
                                  layout["image_ids"], self.scale, self.quantize_timestep)

    def decode(self, vae, x0, layout) -> torch.Tensor:
        return C.decode_latents(vae, x0, layout["grid_h"], layout["grid_w"])

    # -- cost model (text_tokens: the Qwen3 sequence length)
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        b, m = batch * self.cost_passes(config), "meta"
        return dict(
            hidden_states=torch.empty(b, layout.tokens[0], config["in_channels"], device=m, dtype=dtype),
            encoder_hidden_states=torch.empty(b, text_tokens, config["joint_attention_dim"], device=m, dtype=dtype),
            timestep=torch.empty(b, device=m, dtype=dtype),
            guidance=torch.empty(b, device=m, dtype=dtype) if config.get("guidance_embeds", True) else None,
            img_ids=layout["image_ids"].to(m), txt_ids=C.text_ids(text_tokens).to(m), return_dict=False,
        )

    reference_name = "FLUX.2-klein-4B"
    reference_vae_config = F.FLUX2_VAE_CONFIG

    @property
    def reference_config(self) -> dict:
        """FLUX.2 [klein] 4B's transformer/config.json (F.KLEIN_4B)."""
        return F.reference_config(F.KLEIN_4B)
