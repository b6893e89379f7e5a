"""Analytic FLOPs of FLUX.2's transformer (diffusers 0.42's Flux2Transformer2DModel, layer by layer;
tests/models/test_flux2.py checks them against FlopCounterMode on the tiny model), and the real
configurations the cost model knows.

Conventions: fastvideo.perf.flops. Unlike FLUX.1, FLUX.2 computes its adaLN modulation once per
forward for all blocks (three shared Flux2Modulation layers), has no pooled text embedding, a
SwiGLU MLP of ratio 3 (its input projection twice as wide) and, in the single-stream blocks, one
fused q/k/v + MLP-input projection and one fused attention + MLP output projection. No biases.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fastvideo.models.flops import (HeadDims, TIMESTEP_PROJ_DIM, dims_from_config, embedder_flops, linear_flops,
                                    qkv_attention_flops, token_counts, vae_decoder_config,
                                    with_output_layers)


@dataclass(frozen=True)
class Flux2Dims(HeadDims):
    """The Flux2Transformer2DModel config keys that set its FLOPs (defaults: FLUX.2 [klein] 4B's, but
    guidance_embeds: diffusers' default True, which FLUX.2-dev's config.json leaves to it)."""

    num_layers: int = 5  # double-stream blocks
    num_single_layers: int = 20
    num_attention_heads: int = 24
    attention_head_dim: int = 128
    joint_attention_dim: int = 7680  # 3 x Qwen3-4B's hidden size 2560
    in_channels: int = 128
    out_channels: int | None = None
    patch_size: int = 1
    mlp_ratio: float = 3.0
    guidance_embeds: bool = True
    timestep_guidance_channels: int = TIMESTEP_PROJ_DIM

    @classmethod
    def from_config(cls, cfg) -> "Flux2Dims":
        return dims_from_config(cls, cfg, ("num_layers", "num_single_layers", "num_attention_heads",
                                           "attention_head_dim"), "Flux2Transformer2DModel")


# black-forest-labs/FLUX.2-klein-4B and -9B (and their -base twins, the same transformer configs):
# transformer/config.json. 9B: 32 heads, 8 + 24 blocks, Qwen3-8B's 3 x 4096 text width.
KLEIN_4B = Flux2Dims(guidance_embeds=False)
KLEIN_9B = Flux2Dims(num_layers=8, num_single_layers=24, num_attention_heads=32, joint_attention_dim=12288,
                     guidance_embeds=False)
# black-forest-labs/FLUX.2-dev transformer/config.json: 8 double + 48 single blocks, 48 heads of 128
# (6144 wide), Mistral-Small-3.1's 3 x 5120 text width, the guidance embedding (diffusers' default).
DEV = Flux2Dims(num_layers=8, num_single_layers=48, num_attention_heads=48, joint_attention_dim=15360,
                guidance_embeds=True)
# The text encoders' sizes (Qwen3-4B / Qwen3-8B: 36 layers each; dev's Mistral3ForConditionalGeneration,
# Mistral-Small-3.1-24B: 40 layers 5120 wide, vocabulary 131072, its Pixtral tower and head included).
QWEN3_PARAMS = {"4B": 4.02e9, "8B": 8.19e9}
MISTRAL3_PARAMS = 24.011e9  # as transformers builds it (tests/models/test_flux2_dev.py)


def reference_config(d: Flux2Dims) -> dict:
    """The diffusers config of ``d`` (what from_config builds the real transformer from)."""
    return {**asdict(d), "axes_dims_rope": [32, 32, 32, 32], "rope_theta": 2000, "eps": 1e-6}


def double_block_flops(d: Flux2Dims, L: int, Lt: int, B: int = 1) -> int:
    """One Flux2TransformerBlock: separate image (L) and text (Lt) weights, joint attention over L + Lt,
    a SwiGLU MLP per stream (D -> 2F, F -> D). Its modulation is computed outside the block."""
    D, F, S = d.inner_dim, d.mlp_dim, L + Lt
    out = linear_flops(B * S, D, D)  # to_out[0] (image) + to_add_out (text)
    return qkv_attention_flops(B, S, D) + out + linear_flops(B * S, D, 2 * F) + linear_flops(B * S, F, D)


def single_block_flops(d: Flux2Dims, L: int, Lt: int, B: int = 1) -> int:
    """One Flux2SingleTransformerBlock on the L + Lt tokens: to_qkv_mlp_proj D -> 3D + 2F (its q/k/v
    part is qkv_attention_flops' projection count), attention, to_out (D + F) -> D."""
    D, F, S = d.inner_dim, d.mlp_dim, L + Lt
    return qkv_attention_flops(B, S, D) + linear_flops(B * S, D, 2 * F) + linear_flops(B * S, D + F, D)


def transformer_flops_breakdown(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> dict[str, int]:
    """One Flux2Transformer2DModel forward by part. image_tokens L = (h/16)(w/16), text_tokens Lt
    (512 in the pipeline), batch B."""
    d = Flux2Dims.from_config(cfg)
    L, Lt, B = token_counts(image_tokens, text_tokens, batch)
    D = d.inner_dim
    t_embed = embedder_flops(B, d.timestep_guidance_channels, D)
    parts = {
        "x_embedder": linear_flops(B * L, d.in_channels, D),
        "context_embedder": linear_flops(B * Lt, d.joint_attention_dim, D),
        "time_embedder": t_embed,
        "guidance_embedder": t_embed if d.guidance_embeds else 0,
        # double_stream_modulation_img / _txt (6D each) and single_stream_modulation (3D), once per forward
        "modulation": linear_flops(B, D, 15 * D),
        "double_blocks": d.num_layers * double_block_flops(d, L, Lt, B),
        "single_blocks": d.num_single_layers * single_block_flops(d, L, Lt, B),
    }
    return with_output_layers(parts, d, L, B)


def transformer_backward_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> int:
    """Backward of one forward, all weights trainable: twice the forward minus the input gradients of
    the layers fed only by data (x_embedder, context_embedder, the timestep / guidance projections)."""
    d = Flux2Dims.from_config(cfg)
    p = transformer_flops_breakdown(d, image_tokens, text_tokens, batch)
    B, D = int(batch), d.inner_dim
    data_fed = (p["x_embedder"] + p["context_embedder"]
                + linear_flops(B, d.timestep_guidance_channels, D) * (2 if d.guidance_embeds else 1))
    return 2 * p["total"] - data_fed


# FLUX.2's VAE (AutoencoderKLFlux2): the decoder keys that set its FLOPs and memory (32 latent
# channels; the same Decoder as FLUX.1's AutoencoderKL otherwise).
FLUX2_VAE_CONFIG = vae_decoder_config(32, use_post_quant_conv=True)
