"""Analytic FLOPs of Z-Image's transformer (diffusers 0.42's ZImageTransformer2DModel, layer by layer;
tests/models/test_zimage.py checks them against FlopCounterMode on the tiny model), and the real
configuration the cost model knows.

Conventions: fastvideo.perf.flops. Z-Image is a single-stream transformer: the image tokens pass
``n_refiner_layers`` modulated noise-refiner blocks, the caption tokens as many unmodulated
context-refiner blocks, then both, concatenated, ``n_layers`` modulated blocks and the final layer.
Every block is the same ZImageTransformerBlock (q/k/v/out projections without bias, a SwiGLU
feed-forward of width int(8 D / 3), adaLN modulation from the 256-wide timestep embedding when
modulated). Each stream is padded to a multiple of 32 tokens before it enters its blocks
(SEQ_MULTI_OF), so the counts below take the padded lengths.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fastvideo.models.flops import (attention_flops, dims_from_config, linear_flops, token_counts)

SEQ_MULTI_OF = 32  # diffusers' transformer_z_image.SEQ_MULTI_OF
ADALN_EMBED_DIM = 256  # its ADALN_EMBED_DIM (the timestep embedding's width, capped by D)
T_EMBED_MID = 1024  # TimestepEmbedder(mid_size=1024)
FREQ_DIM = 256  # the sinusoidal timestep projection


@dataclass(frozen=True)
class ZImageDims:
    """The ZImageTransformer2DModel config keys that set its FLOPs (defaults: Z-Image 6B, the
    Tongyi-MAI/Z-Image and -Turbo transformer/config.json)."""

    dim: int = 3840
    n_layers: int = 30
    n_refiner_layers: int = 2
    n_heads: int = 30
    n_kv_heads: int = 30
    in_channels: int = 16
    cap_feat_dim: int = 2560  # Qwen3-4B's hidden size
    all_patch_size: tuple = (2,)
    all_f_patch_size: tuple = (1,)
    axes_dims: tuple = (32, 48, 48)
    axes_lens: tuple = (1536, 512, 512)
    rope_theta: float = 256.0
    t_scale: float = 1000.0
    norm_eps: float = 1e-5
    qk_norm: bool = True

    @property
    def ffn_dim(self) -> int:
        return int(self.dim / 3 * 8)

    @property
    def adaln_dim(self) -> int:
        return min(self.dim, ADALN_EMBED_DIM)

    @property
    def patch_dim(self) -> int:
        return self.all_patch_size[0] ** 2 * self.all_f_patch_size[0] * self.in_channels

    @classmethod
    def from_config(cls, cfg) -> "ZImageDims":
        return dims_from_config(cls, cfg, ("dim", "n_layers", "n_heads"), "ZImageTransformer2DModel",
                                tuple_keys=("all_patch_size", "all_f_patch_size", "axes_dims", "axes_lens"))


Z_IMAGE_6B = ZImageDims()
QWEN3_4B_PARAMS = 4.02e9  # the text encoder, for the docs' memory notes


def reference_config(d: ZImageDims) -> dict:
    """The diffusers config of ``d`` (what from_config builds the real transformer from)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(d).items()}


def padded(tokens: int) -> int:
    """A stream's length after the transformer pads it to a multiple of SEQ_MULTI_OF."""
    return -(-int(tokens) // SEQ_MULTI_OF) * SEQ_MULTI_OF


def block_flops(d: ZImageDims, S: int, B: int = 1, modulated: bool = True) -> int:
    """One ZImageTransformerBlock on B x S tokens: q/k/v/out projections, self-attention, the SwiGLU
    feed-forward (w1, w3: D -> F; w2: F -> D), and its adaLN linear (one row per sample) when modulated."""
    D, F = d.dim, d.ffn_dim
    out = 4 * linear_flops(B * S, D, D) + attention_flops(B, S, S, D)
    out += 2 * linear_flops(B * S, D, F) + linear_flops(B * S, F, D)
    return out + (linear_flops(B, d.adaln_dim, 4 * D) if modulated else 0)


def transformer_flops_breakdown(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> dict[str, int]:
    """One ZImageTransformer2DModel forward by part. image_tokens L = (h/16)(w/16), text_tokens Lt
    (each prompt's token count; both are padded to a multiple of 32 here), batch B."""
    d = ZImageDims.from_config(cfg)
    L, Lt, B = token_counts(image_tokens, text_tokens, batch)
    L, Lt, D = padded(L), padded(Lt), d.dim
    parts = {
        "t_embedder": linear_flops(B, FREQ_DIM, T_EMBED_MID) + linear_flops(B, T_EMBED_MID, d.adaln_dim),
        "x_embedder": linear_flops(B * L, d.patch_dim, D),
        "noise_refiner": d.n_refiner_layers * block_flops(d, L, B),
        "cap_embedder": linear_flops(B * Lt, d.cap_feat_dim, D),
        "context_refiner": d.n_refiner_layers * block_flops(d, Lt, B, modulated=False),
        "layers": d.n_layers * block_flops(d, L + Lt, B),
        # the final layer runs on the whole joint sequence (the caption's rows are dropped after it)
        "final_layer": linear_flops(B, d.adaln_dim, D) + linear_flops(B * (L + Lt), D, d.patch_dim),
    }
    parts["total"] = sum(parts.values())
    return parts


def transformer_backward_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> int:
    """Backward of one forward, all weights trainable: twice the forward minus the input gradients of
    the layers fed only by data (x_embedder, the timestep embedder's first linear). The caption
    embedder's input is its RMSNorm's output, whose weight trains: its input gradient is computed."""
    d = ZImageDims.from_config(cfg)
    p = transformer_flops_breakdown(d, image_tokens, text_tokens, batch)
    return 2 * p["total"] - p["x_embedder"] - linear_flops(int(batch), FREQ_DIM, T_EMBED_MID)
