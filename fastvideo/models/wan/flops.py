"""Analytic FLOPs of Wan's transformer (diffusers 0.42's WanTransformer3DModel, layer by layer;
tests/models/test_wan.py checks them against FlopCounterMode on the tiny model).

Conventions: fastvideo.perf.flops. ``image_tokens`` counts latent cells (the rollout's tokens,
f h w); the transformer's tokens are L = cells / (pt ph pw) after its Conv3d patch embedding (1x2x2).
Per block (WanTransformerBlock): self-attention (q/k/v, attention over L, to_out), cross-attention
(q and to_out on L, k/v on the Lt text tokens, attention L x Lt), a GELU feed-forward D -> ffn_dim ->
D; the adaLN modulation is a table plus the timestep projection (no per-block Linear). Around them:
the patch embedding, the timestep embedder (freq_dim -> D -> D) and time_proj (D -> 6D), once per
sample or, with Wan2.2-TI2V's per-token timesteps, once per token; the text projection (text_dim ->
D -> D on Lt tokens); proj_out (D -> out_channels pt ph pw).
"""

from __future__ import annotations

import math

from fastvideo.models.flops import attention_flops, linear_flops, mlp_flops, qkv_attention_flops, token_counts


def _dims(cfg) -> dict:
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    heads, head_dim = int(get("num_attention_heads")), int(get("attention_head_dim"))
    return dict(D=heads * head_dim, patch=math.prod(get("patch_size")), C=int(get("in_channels")),
                out=int(get("out_channels") or get("in_channels")), ffn=int(get("ffn_dim")),
                layers=int(get("num_layers")), text=int(get("text_dim")), freq=int(get("freq_dim")))


def block_flops(D: int, ffn: int, L: int, Lt: int, B: int) -> int:
    """One WanTransformerBlock on B samples of L video tokens and Lt text tokens."""
    self_attn = qkv_attention_flops(B, L, D) + linear_flops(B * L, D, D)
    cross = 2 * linear_flops(B * L, D, D) + 2 * linear_flops(B * Lt, D, D) + attention_flops(B, L, Lt, D)
    return self_attn + cross + mlp_flops(B * L, D, ffn)


def transformer_flops_breakdown(cfg, image_tokens: int, text_tokens: int, batch: int = 1,
                                per_token_timesteps: bool = False) -> dict[str, int]:
    """One WanTransformer3DModel forward by part; image_tokens: latent cells (f h w)."""
    d = _dims(cfg)
    cells, Lt, B = token_counts(image_tokens, text_tokens, batch)
    L, D = cells // d["patch"], d["D"]
    rows = B * L if per_token_timesteps else B
    parts = {
        "patch_embedding": linear_flops(B * L, d["C"] * d["patch"], D),
        "time_embedder": linear_flops(rows, d["freq"], D) + linear_flops(rows, D, D) + linear_flops(rows, D, 6 * D),
        "text_embedder": linear_flops(B * Lt, d["text"], D) + linear_flops(B * Lt, D, D),
        "blocks": d["layers"] * block_flops(D, d["ffn"], L, Lt, B),
        "proj_out": linear_flops(B * L, D, d["out"] * d["patch"]),
    }
    parts["total"] = sum(parts.values())
    return parts


def transformer_backward_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1,
                               per_token_timesteps: bool = False) -> int:
    """Backward of one forward, all weights trainable: twice the forward minus the input gradients of
    the layers fed only by data (the patch embedding, the timestep embedder's first linear, the text
    projection's first linear)."""
    d = _dims(cfg)
    p = transformer_flops_breakdown(cfg, image_tokens, text_tokens, batch, per_token_timesteps)
    cells, Lt, B = token_counts(image_tokens, text_tokens, batch)
    rows = B * (cells // d["patch"]) if per_token_timesteps else B
    return (2 * p["total"] - p["patch_embedding"] - linear_flops(rows, d["freq"], d["D"])
            - linear_flops(B * Lt, d["text"], d["D"]))


def image_context_flops(cfg, image_tokens: int, clip_tokens: int, batch: int = 1) -> dict[str, int]:
    """Wan2.1-I2V's CLIP image tokens (``clip_tokens`` of them, image_dim wide), the count a text-to-video
    forward lacks: the image embedder once (LayerNorm, image_dim -> image_dim -> D, LayerNorm) and in
    every block's cross-attention add_k_proj / add_v_proj on them and the L video tokens' attention over
    them. "backward": what they add to the backward, twice their forward (the embedder's first linear
    takes its input gradient too: its LayerNorm before it has weights)."""
    d = _dims(cfg)
    get = cfg.get if isinstance(cfg, dict) else (lambda k, default=None: getattr(cfg, k, default))
    cells, Li, B = token_counts(image_tokens, clip_tokens, batch)
    L, D, image_dim = cells // d["patch"], d["D"], int(get("image_dim"))
    embedder = linear_flops(B * Li, image_dim, image_dim) + linear_flops(B * Li, image_dim, D)
    attention = d["layers"] * (2 * linear_flops(B * Li, D, D) + attention_flops(B, L, Li, D))
    return {"image_embedder": embedder, "image_attention": attention,
            "backward": 2 * (embedder + attention)}
