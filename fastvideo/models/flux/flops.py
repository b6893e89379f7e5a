"""Analytic FLOPs of FLUX.1's transformer (diffusers 0.32's FluxTransformer2DModel, layer by
layer; tests/perf checks them against FlopCounterMode on the tiny and small presets).

Conventions: fastvideo.perf.flops (a backward costs twice the forward minus the input gradients
nobody needs; gradient checkpointing re-runs the blocks' forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from fastvideo.models.flops import (HeadDims, TIMESTEP_PROJ_DIM, VAE_16CH_CONFIG, dims_from_config, embedder_flops,
                                    linear_flops, mlp_flops, qkv_attention_flops, token_counts,
                                    with_output_layers)


@dataclass(frozen=True)
class FluxDims(HeadDims):
    """The FluxTransformer2DModel config keys that set its FLOPs (defaults: FLUX.1-dev).

    axes_dims_rope is not here: RoPE is element-wise and costs no matmul FLOPs.
    """

    num_layers: int = 19  # double-stream (MMDiT) blocks
    num_single_layers: int = 38
    num_attention_heads: int = 24
    attention_head_dim: int = 128
    joint_attention_dim: int = 4096  # T5 width
    pooled_projection_dim: int = 768  # CLIP pooled width
    in_channels: int = 64
    out_channels: int | None = None
    patch_size: int = 1
    guidance_embeds: bool = True
    mlp_ratio: float = 4.0

    @classmethod
    def from_config(cls, cfg: "Mapping | FluxDims | object") -> "FluxDims":
        """From a transformer config dict (config.json), a diffusers FrozenDict/config object or FluxDims."""
        return dims_from_config(cls, cfg, ("num_layers", "num_single_layers", "num_attention_heads",
                                           "attention_head_dim"), "FluxTransformer2DModel")


FLUX_DEV = FluxDims()

def _embedder_flops(d: FluxDims, L: int, Lt: int, B: int) -> dict[str, int]:
    D = d.inner_dim
    t_embed = embedder_flops(B, TIMESTEP_PROJ_DIM, D)  # one per sample
    return {
        "x_embedder": linear_flops(B * L, d.in_channels, D),
        "context_embedder": linear_flops(B * Lt, d.joint_attention_dim, D),
        "time_embedder": t_embed,
        "guidance_embedder": t_embed if d.guidance_embeds else 0,
        "text_embedder": embedder_flops(B, d.pooled_projection_dim, D),
    }


def double_block_flops(d: FluxDims, L: int, Lt: int, B: int = 1) -> int:
    """One FluxTransformerBlock: separate image (L) and text (Lt) weights, joint attention over L+Lt."""
    D, F = d.inner_dim, d.mlp_dim
    S = L + Lt
    adaln = 2 * linear_flops(B, D, 6 * D)  # norm1 and norm1_context: 6 modulation vectors each
    out = linear_flops(B * S, D, D)  # to_out[0] (image) + to_add_out (text)
    # to_q/k/v on image tokens + add_q/k/v_proj on text tokens, joint attention; ff and ff_context
    return adaln + qkv_attention_flops(B, S, D) + out + mlp_flops(B * S, D, F)


def single_block_flops(d: FluxDims, L: int, Lt: int, B: int = 1) -> int:
    """One FluxSingleTransformerBlock on the concatenated L+Lt tokens (no attention output proj:
    proj_out maps the concatenated [attention, MLP] features (D + 4D) back to D)."""
    D, F = d.inner_dim, d.mlp_dim
    S = L + Lt
    adaln = linear_flops(B, D, 3 * D)
    return adaln + linear_flops(B * S, D, F) + qkv_attention_flops(B, S, D) + linear_flops(B * S, D + F, D)


def transformer_flops_breakdown(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> dict[str, int]:
    """FLOPs of one FluxTransformer2DModel forward, by part.

    cfg: FluxDims, a transformer config dict or config object. image_tokens L = (h/16)(w/16),
    text_tokens Lt (512 for FLUX.1-dev), batch B. Returns the embedders, "double_blocks",
    "single_blocks", "norm_out", "proj_out" and "total".
    """
    d = FluxDims.from_config(cfg)
    L, Lt, B = token_counts(image_tokens, text_tokens, batch)
    parts = _embedder_flops(d, L, Lt, B)
    parts["double_blocks"] = d.num_layers * double_block_flops(d, L, Lt, B)
    parts["single_blocks"] = d.num_single_layers * single_block_flops(d, L, Lt, B)
    return with_output_layers(parts, d, L, B)  # AdaLayerNormContinuous (scale, shift); proj_out on image tokens only


def transformer_forward_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> int:
    """FLOPs of one FLUX transformer forward pass (see transformer_flops_breakdown)."""
    return transformer_flops_breakdown(cfg, image_tokens, text_tokens, batch)["total"]


def transformer_block_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> int:
    """The blocks' share of a forward: what gradient checkpointing recomputes during backward."""
    p = transformer_flops_breakdown(cfg, image_tokens, text_tokens, batch)
    return p["double_blocks"] + p["single_blocks"]


def transformer_backward_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> int:
    """Backward of one forward (all weights trainable): weight gradients everywhere, input
    gradients everywhere except the layers fed only by data (latents, T5/CLIP embeddings and the
    sinusoidal timestep features do not require grad)."""
    d = FluxDims.from_config(cfg)
    p = transformer_flops_breakdown(d, image_tokens, text_tokens, batch)
    B, D = int(batch), d.inner_dim
    data_fed = (p["x_embedder"] + p["context_embedder"]
                + linear_flops(B, TIMESTEP_PROJ_DIM, D) * (2 if d.guidance_embeds else 1)
                + linear_flops(B, d.pooled_projection_dim, D))
    return 2 * p["total"] - data_fed


# FLUX.1-dev's VAE (AutoencoderKL) keys that set the decoder's FLOPs.
FLUX_DEV_VAE_CONFIG = VAE_16CH_CONFIG
