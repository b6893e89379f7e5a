"""FLOP primitives shared by the model families' analytic FLOP counts (fastvideo.perf).

A matmul [m, k] x [k, n] costs 2*m*n*k FLOPs; element-wise work is not counted. Besides the two
primitives: the layer groups FLUX.1 and SD3 build their blocks from (q/k/v projections with
attention over the joint tokens, the 4x MLP, the timestep / pooled-text embedders), reading a
family's dims dataclass from a transformer config, and their common 16-channel VAE.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Mapping, Sequence

# Width of the sinusoidal timestep (and FLUX's guidance) projection fed to TimestepEmbedding (fixed in diffusers).
TIMESTEP_PROJ_DIM = 256



def vae_decoder_config(latent_channels: int, use_post_quant_conv: bool,
                       block_out_channels: tuple[int, ...] = (128, 256, 512, 512)) -> dict:
    """The AutoencoderKL config keys that set a 2-D decoder's FLOPs (2 residual blocks per level, an
    attention mid block, RGB out): FLUX.1's, SD3.5's, FLUX.2's (32 latent channels) and the 2-D count
    of Qwen-Image's (base 96)."""
    return {
        "block_out_channels": list(block_out_channels),
        "layers_per_block": 2,
        "latent_channels": latent_channels,
        "out_channels": 3,
        "mid_block_add_attention": True,
        "use_post_quant_conv": use_post_quant_conv,
    }


# The same for FLUX.1-dev's and SD3.5's VAE.
VAE_16CH_CONFIG = vae_decoder_config(16, use_post_quant_conv=False)


class HeadDims:
    """Mixin of a frozen dims dataclass with num_attention_heads, attention_head_dim and (where read)
    mlp_ratio, patch_size, in_channels, out_channels: the widths every MMDiT count uses."""

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def mlp_dim(self) -> int:
        return int(self.inner_dim * self.mlp_ratio)

    @property
    def output_dim(self) -> int:
        """What proj_out writes per token: patch_size^2 x out_channels (in_channels when unset)."""
        return self.patch_size * self.patch_size * (self.out_channels or self.in_channels)


def linear_flops(tokens: int, fan_in: int, fan_out: int) -> int:
    """nn.Linear on [tokens, fan_in]: 2 * tokens * fan_in * fan_out (bias adds are not counted)."""
    return 2 * tokens * fan_in * fan_out


def attention_flops(batch: int, q_len: int, kv_len: int, inner_dim: int) -> int:
    """Q K^T and A V over all heads: 2 * (2 * B * Lq * Lkv * inner_dim)."""
    return 4 * batch * q_len * kv_len * inner_dim


def qkv_attention_flops(batch: int, tokens: int, inner_dim: int) -> int:
    """to_q / to_k / to_v (and their add_*_proj twins: the same count per token) on B x S tokens
    of width D, then self-attention over the S tokens; no output projection."""
    return 3 * linear_flops(batch * tokens, inner_dim, inner_dim) + attention_flops(batch, tokens, tokens, inner_dim)


def mlp_flops(tokens: int, inner_dim: int, hidden_dim: int) -> int:
    """FeedForward: Linear(D, F) -> activation -> Linear(F, D) on ``tokens`` rows."""
    return linear_flops(tokens, inner_dim, hidden_dim) + linear_flops(tokens, hidden_dim, inner_dim)


def embedder_flops(batch: int, fan_in: int, inner_dim: int) -> int:
    """TimestepEmbedding / PixArtAlphaTextProjection: Linear(fan_in, D) -> SiLU -> Linear(D, D), one row per sample."""
    return linear_flops(batch, fan_in, inner_dim) + linear_flops(batch, inner_dim, inner_dim)


def with_output_layers(parts: dict[str, int], d: "HeadDims", L: int, B: int) -> dict[str, int]:
    """``parts`` of an MMDiT forward completed by its output layers and "total": norm_out
    (AdaLayerNormContinuous, D -> 2D per sample) and proj_out (the L image tokens, D -> output_dim)."""
    D = d.inner_dim
    parts["norm_out"] = linear_flops(B, D, 2 * D)
    parts["proj_out"] = linear_flops(B * L, D, d.output_dim)
    parts["total"] = sum(parts.values())
    return parts


def token_counts(image_tokens: int, text_tokens: int, batch: int) -> tuple[int, int, int]:
    """(L, Lt, B) as ints, refused unless all positive."""
    L, Lt, B = int(image_tokens), int(text_tokens), int(batch)
    if min(L, Lt, B) <= 0:
        raise ValueError(f"image_tokens, text_tokens and batch must be positive (got {L}, {Lt}, {B})")
    return L, Lt, B


def dims_from_config(cls, cfg, required: Sequence[str], class_name: str, tuple_keys: Sequence[str] = ()):
    """A family's frozen dims dataclass ``cls`` from a transformer config dict (config.json), a
    diffusers config object or an instance; keys absent or None keep the defaults; ``required``
    must be present (else a ValueError naming ``class_name``); ``tuple_keys`` become tuples."""
    if isinstance(cfg, cls):
        return cfg
    get = cfg.get if isinstance(cfg, Mapping) else (lambda k, d=None: getattr(cfg, k, d))
    values = {f.name: get(f.name, None) for f in fields(cls)}
    values = {k: (tuple(v) if k in tuple_keys else v) for k, v in values.items() if v is not None}
    missing = [k for k in required if k not in values]
    if missing:
        raise ValueError(f"transformer config lacks {', '.join(missing)}: is it a {class_name} config?")
    return cls(**values)
