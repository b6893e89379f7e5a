"""FLUX.1 as a ModelFamily: T5 sequence + CLIP pooled conditioning, 2x2-packed 16-channel latents.

Conditioning: TensorConditioning with per-sample "prompt_embeds" [B, Lt, D] and "pooled" [B, P'],
shared "text_ids" [Lt, 3]. Layout extras: "image_ids" [L, 3] (on the device), "latent_h",
"latent_w". Stored per prompt in upstream DanceGRPO's folders (prompt_embed/,
pooled_prompt_embeds/, text_ids/) under its videos2caption.json keys.

The loading, the layout and decoding are DiffusersFamily's (fastvideo/models/diffusers_family.py),
set by the class attributes below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

import fastvideo.models.flux.components as C
from fastvideo.models import base, record_checks
from fastvideo.models.base import EmbeddingShapeError, StoredTensor, TensorConditioning
from fastvideo.models.diffusers_family import ComponentFunctions, DiffusersFamily
import fastvideo.models.flux.flops as F

MODEL_HINT = (
    "the embeddings were made with another text encoder — re-run preprocessing with --model_path "
    "pointing at this model"
)


@dataclass(frozen=True)
class ExpectedDims:
    """What a transformer needs from the embeddings; None means "do not check"."""

    joint_attention_dim: int | None = None  # T5 width D
    pooled_projection_dim: int | None = None  # CLIP width P
    max_sequence_length: int | None = None  # L

    @classmethod
    def from_transformer_config(cls, config: Any, max_sequence_length: int | None = None) -> "ExpectedDims":
        """From a FluxTransformer2DModel config (the object or a dict like transformer/config.json)."""
        return cls(base.config_value(config, "joint_attention_dim"), base.config_value(config, "pooled_projection_dim"),
                   max_sequence_length)


def check_expected(dims: tuple[int, int, int], expected: ExpectedDims) -> None:
    """Raise EmbeddingShapeError when embeddings of (L, D, P) = dims do not fit ``expected``."""
    seq_len, width, pooled = dims
    record_checks.check_width("prompt embeddings", width, expected, "joint_attention_dim", MODEL_HINT)
    record_checks.check_width("pooled prompt embeddings", pooled, expected, "pooled_projection_dim", MODEL_HINT)
    record_checks.check_sequence_length(seq_len, expected.max_sequence_length)


def load_transformer(root, subfolder, device, dtype):
    """FluxTransformer2DModel of a model folder (subfolder "transformer": checked as a FLUX folder)
    or of a transformer folder itself (subfolder None), device kernels applied."""
    if subfolder == "transformer":
        return C.load_transformer(root, device=device, dtype=dtype)
    from diffusers import FluxTransformer2DModel

    from fastvideo.models.loading import from_pretrained_checked

    model = from_pretrained_checked(FluxTransformer2DModel, root, None, dtype).to(device)
    C.adapt_for_device(model, device)
    return model


class FluxFamily(DiffusersFamily):
    """FLUX.1 (dev). guidance_scale: FLUX.1-dev's guidance embedding (no classifier-free guidance);
    quantize_timestep: pass the transformer floor(1000 sigma) / 1000 (upstream DanceGRPO) instead
    of sigma (diffusers' FluxPipeline)."""

    name = "flux"
    export_class_name = "FluxTransformer2DModel"
    storage = (
        StoredTensor("prompt_embeds", "prompt_embed_path", "prompt_embed"),
        StoredTensor("pooled", "pooled_prompt_embeds_path", "pooled_prompt_embeds"),
        StoredTensor("text_ids", "text_ids", "text_ids"),
    )
    # videos2caption.json's key order (upstream's), the caption last.
    json_keys = ("prompt_embed_path", "text_ids", "pooled_prompt_embeds_path", "caption")
    # FluxPipeline refuses longer T5 sequences; FLUX.1-dev was trained with 512.
    max_sequence_length_limit = 512
    text_components = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
    text_encoder_components = ("text_encoder", "text_encoder_2")
    # What a base model folder must hold to train (the tokenizers are checked by preprocessing).
    training_components = ("transformer", "vae", "text_encoder", "text_encoder_2")

    parts = ComponentFunctions(
        check_folder=C.check_flux_folder, folder_error=C.FluxFolderError, load_transformer=load_transformer,
        adapt_for_device=C.adapt_for_device, load_vae=C.load_vae, load_text_encoders=C.load_text_encoders,
        encode_prompts=C.encode_prompts, decode_latents=C.decode_latents)
    # The transformer's blocks in order: double-stream, then single-stream.
    block_lists = ("transformer_blocks", "single_transformer_blocks")

    def __init__(self, guidance_scale: float = 3.5, quantize_timestep: bool = True):
        super().__init__(guidance_scale, quantize_timestep)

    def block_classes(self):
        from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock

        return (FluxTransformerBlock, FluxSingleTransformerBlock)

    def sequence_parallel_plan(self):
        from fastvideo.models.flux.sequence_parallel import flux_plan

        return flux_plan()

    # -- conditioning
    def encode_prompts(self, encoders, prompts, max_sequence_length=512) -> TensorConditioning:
        embeds, pooled, text_ids = C.encode_prompts(encoders, prompts, max_sequence_length)
        return TensorConditioning({"prompt_embeds": embeds, "pooled": pooled}, {"text_ids": text_ids})

    def cond_from_tensors(self, records: Sequence[Mapping[str, torch.Tensor]]) -> TensorConditioning:
        embeds = torch.stack([r["prompt_embeds"] for r in records])
        pooled = torch.stack([r["pooled"] for r in records])
        return TensorConditioning({"prompt_embeds": embeds, "pooled": pooled}, {"text_ids": records[0]["text_ids"]})

    def check_record(self, idx, record, first_dims=None, where: str = ""):
        """-> (record with text_ids [L, 3], (L, D, P)); first_dims: prompt 0's, to refuse a mix."""
        embed, pooled, ids = record["prompt_embeds"], record["pooled"], record["text_ids"]
        if embed.ndim != 2 or pooled.ndim != 1:
            raise EmbeddingShapeError(
                f"prompt {idx}: prompt_embed {tuple(embed.shape)} / pooled {tuple(pooled.shape)} should be "
                "[L, D] / [P] (one prompt per file); re-run the preprocessing"
            )
        if ids.shape == (3,):  # DanceGRPO's layout: one row, repeated over the sequence at use
            ids = ids.unsqueeze(0).expand(embed.shape[0], 3).clone()
        dims = (embed.shape[0], embed.shape[1], pooled.shape[0])
        if first_dims is not None and (dims != first_dims or ids.shape != (dims[0], 3)):
            raise EmbeddingShapeError(
                f"prompt {idx} has (L, D, P) = {dims} and text_ids {tuple(ids.shape)} but prompt 0 has "
                f"{first_dims}: {where!r} mixes two preprocessing runs — re-run it into an empty folder"
            )
        return {"prompt_embeds": embed, "pooled": pooled, "text_ids": ids}, dims

    def check_dims(self, dims, transformer_config, max_sequence_length=None) -> None:
        if isinstance(transformer_config, ExpectedDims):
            expected = transformer_config
        else:
            expected = ExpectedDims.from_transformer_config(transformer_config, max_sequence_length)
        check_expected(dims, expected)

    def encoder_dims(self, encoders) -> dict[str, int]:
        return {"embed_dim": int(encoders.t5_encoder.config.d_model),
                "pooled_dim": int(encoders.clip_encoder.config.hidden_size)}

    def record_shapes(self, max_sequence_length, encoder_dims):
        L = max_sequence_length
        return (L, encoder_dims["embed_dim"]), (encoder_dims["pooled_dim"],), (3,)

    def stored_record(self, record):
        """text_ids as upstream DanceGRPO writes them: one [3] row (FLUX's text ids are all zeros),
        which upstream's trainer repeats over the sequence and check_record expands to [L, 3]."""
        return {**record, "text_ids": record["text_ids"][0]}

    # -- sampling
    def layout_extras(self, latent_h, latent_w, device=None):
        """The tokens' "image_ids" [L, 3] on the device, and the latent grid."""
        return {"image_ids": C.image_ids(latent_h, latent_w, device=device),
                **super().layout_extras(latent_h, latent_w)}

    def velocity(self, transformer, x, sigma, cond, layout) -> torch.Tensor:
        return C.predict_velocity(transformer, x, sigma, cond["prompt_embeds"], cond["pooled"], cond["text_ids"],
                                  layout["image_ids"], self.guidance_scale, self.quantize_timestep)

    def check_cond(self, cond) -> None:
        """Shapes of a prompt-level Conditioning: prompt_embeds [P, Lt, D], pooled [P, P'], text_ids [Lt, 3]."""
        embeds, pooled, text_ids = cond["prompt_embeds"], cond["pooled"], cond["text_ids"]
        if embeds.ndim != 3 or pooled.ndim != 2:
            raise ValueError(
                f"prompt_embeds must be [P, Lt, D] and pooled [P, P'], got {tuple(embeds.shape)} and "
                f"{tuple(pooled.shape)}"
            )
        if tuple(text_ids.shape) != (embeds.shape[1], 3):
            raise ValueError(f"text_ids must be [Lt={embeds.shape[1]}, 3], got {tuple(text_ids.shape)}")

    # -- cost model
    def meta_inputs(self, config, batch, layout, text_tokens, dtype) -> dict:
        m = "meta"
        return dict(
            hidden_states=torch.empty(batch, layout.tokens[0], config["in_channels"], device=m, dtype=dtype),
            encoder_hidden_states=torch.empty(batch, text_tokens, config["joint_attention_dim"], device=m,
                                              dtype=dtype),
            pooled_projections=torch.empty(batch, config["pooled_projection_dim"], device=m, dtype=dtype),
            timestep=torch.empty(batch, device=m, dtype=dtype),
            guidance=torch.empty(batch, device=m, dtype=dtype) if config.get("guidance_embeds", True) else None,
            img_ids=C.image_ids(layout["latent_h"], layout["latent_w"]).to(m), txt_ids=C.text_ids(text_tokens).to(m),
            return_dict=False,
        )

    def cond_numel(self, config, text_tokens) -> int:
        return text_tokens * config["joint_attention_dim"] + config["pooled_projection_dim"]

    def transformer_flops(self, config, image_tokens, text_tokens, batch=1):
        """{"forward", "backward", "blocks" (what checkpointing recomputes)} and the forward's parts."""
        return {**F.transformer_flops_breakdown(config, image_tokens, text_tokens, batch),
                "forward": F.transformer_forward_flops(config, image_tokens, text_tokens, batch),
                "backward": F.transformer_backward_flops(config, image_tokens, text_tokens, batch),
                "blocks": F.transformer_block_flops(config, image_tokens, text_tokens, batch)}

    reference_name = "FLUX.1-dev"
    reference_vae_config = F.FLUX_DEV_VAE_CONFIG

    @property
    def reference_config(self) -> dict:
        """FLUX.1-dev's transformer config (the cost model's default): its FLOP dims as diffusers
        keys, and its RoPE axes (the meta-device build needs them)."""
        from dataclasses import asdict

        return {**{k: v for k, v in asdict(F.FLUX_DEV).items() if k != "mlp_ratio"}, "axes_dims_rope": [16, 56, 56]}
