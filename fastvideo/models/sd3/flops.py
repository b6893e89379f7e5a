"""Analytic FLOPs of SD3 / SD3.5's transformer (diffusers 0.32's SD3Transformer2DModel, layer by
layer; tests/models/test_sd3.py checks them against FlopCounterMode on the tiny model).

Conventions: fastvideo.perf.flops. Lt is the joint text length, 77 CLIP tokens + the T5 length.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastvideo.models.flops import (HeadDims, TIMESTEP_PROJ_DIM, VAE_16CH_CONFIG, dims_from_config, embedder_flops,
                                    linear_flops, mlp_flops, qkv_attention_flops, token_counts,
                                    with_output_layers)


@dataclass(frozen=True)
class SD3Dims(HeadDims):
    """The SD3Transformer2DModel config keys that set its FLOPs (defaults: SD3.5-Medium)."""

    num_layers: int = 24
    num_attention_heads: int = 24
    attention_head_dim: int = 64
    joint_attention_dim: int = 4096
    caption_projection_dim: int = 1536
    pooled_projection_dim: int = 2048
    in_channels: int = 16
    out_channels: int = 16
    patch_size: int = 2
    dual_attention_layers: tuple = tuple(range(13))

    @classmethod
    def from_config(cls, cfg) -> "SD3Dims":
        return dims_from_config(cls, cfg, ("num_layers", "num_attention_heads", "attention_head_dim"),
                                "SD3Transformer2DModel", tuple_keys=("dual_attention_layers",))


SD35_MEDIUM = SD3Dims()


def joint_block_flops(d: SD3Dims, index: int, L: int, Lt: int, B: int = 1) -> int:
    """JointTransformerBlock ``index``: image (L) and text (Lt) streams, joint attention over L + Lt;
    the last block's text stream stops after attention (context_pre_only); dual-attention blocks
    (SD3.5's MMDiT-X) add a self-attention over the image tokens."""
    D, S = d.inner_dim, L + Lt
    last, dual = index == d.num_layers - 1, index in d.dual_attention_layers
    adaln = linear_flops(B, D, (9 if dual else 6) * D) + linear_flops(B, D, (2 if last else 6) * D)
    out = linear_flops(B * L, D, D) + (0 if last else linear_flops(B * Lt, D, D))
    total = adaln + qkv_attention_flops(B, S, D) + out + mlp_flops(B * (L + (0 if last else Lt)), D, 4 * D)
    if dual:  # attn2: its own q/k/v and output projection over the image tokens
        total += qkv_attention_flops(B, L, D) + linear_flops(B * L, D, D)
    return total


def transformer_flops_breakdown(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> dict[str, int]:
    """One SD3Transformer2DModel forward by part. image_tokens L = (h/16)(w/16) patches,
    text_tokens Lt = 77 + T5 length, batch B."""
    d = SD3Dims.from_config(cfg)
    L, Lt, B = token_counts(image_tokens, text_tokens, batch)
    D, p = d.inner_dim, d.patch_size
    parts = {
        "pos_embed": linear_flops(B * L, d.in_channels * p * p, D),  # the patchify conv
        "context_embedder": linear_flops(B * Lt, d.joint_attention_dim, d.caption_projection_dim),
        "time_embedder": embedder_flops(B, TIMESTEP_PROJ_DIM, D),
        "text_embedder": embedder_flops(B, d.pooled_projection_dim, D),
        "blocks": sum(joint_block_flops(d, i, L, Lt, B) for i in range(d.num_layers)),
    }
    return with_output_layers(parts, d, L, B)  # proj_out: D -> p * p * out_channels


def transformer_backward_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> int:
    """Backward of one forward, all weights trainable: twice the forward minus the input gradients
    of the layers fed only by data (patchify, context embedder, timestep and pooled projections)."""
    d = SD3Dims.from_config(cfg)
    p = transformer_flops_breakdown(d, image_tokens, text_tokens, batch)
    B, D = int(batch), d.inner_dim
    data_fed = (p["pos_embed"] + p["context_embedder"] + linear_flops(B, TIMESTEP_PROJ_DIM, D)
                + linear_flops(B, d.pooled_projection_dim, D))
    return 2 * p["total"] - data_fed


# SD3.5's VAE (AutoencoderKL) keys that set the decoder's FLOPs: FLUX.1's.
SD35_VAE_CONFIG = VAE_16CH_CONFIG
