"""Analytic FLOPs of HunyuanVideo's transformer (diffusers' HunyuanVideoTransformer3DModel, layer by
layer; tests/models/test_hunyuan_video.py checks them against FlopCounterMode on the tiny model).

Conventions: fastvideo.perf.flops. ``image_tokens`` counts latent cells (the rollout's tokens, f h w);
the transformer's tokens are L = cells / (pt p p) after its Conv3d patch embedding (1x2x2); the text
has Lt tokens. The context embedder (HunyuanVideoTokenRefiner) projects the Llama states (text_dim ->
D), embeds the timestep and their masked mean (per sample), and refines them with R self-attention
blocks over Lt (q/k/v/out, a SiLU feed-forward D -> 4D -> D, an adaptive norm D -> 2D per
sample). The conditioning (timestep, guidance, CLIP pooled: each 2 linears per sample). N dual-stream
blocks (AdaLayerNormZero D -> 6D per sample for each stream; q/k/v of both streams, joint attention
over L + Lt, to_out and to_add_out, a GELU feed-forward per stream), S single-stream blocks
(AdaLayerNormZeroSingle D -> 3D; q/k/v and proj_mlp on L + Lt, attention over L + Lt, proj_out
D + mlp -> D), norm_out (D -> 2D) and proj_out (D -> out_channels pt p p). Attention is counted over
every text position (the mask is applied inside the kernel, not by skipping work).
"""

from __future__ import annotations

from fastvideo.models.flops import attention_flops, embedder_flops, linear_flops, mlp_flops, qkv_attention_flops, \
    token_counts

FREQ = 256  # Timesteps(num_channels=256): the sinusoidal embedding the timestep / guidance embedders take
REFINER_MLP = 4  # HunyuanVideoTokenRefiner's mlp_ratio default (the transformer does not pass its own)


def _dims(cfg) -> dict:
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    D = int(get("num_attention_heads")) * int(get("attention_head_dim"))
    patch = int(get("patch_size_t", 1) or 1) * int(get("patch_size")) ** 2
    return dict(D=D, patch=patch, C=int(get("in_channels")), out=int(get("out_channels") or get("in_channels")),
                mlp=int(D * float(get("mlp_ratio", 4.0))), dual=int(get("num_layers")),
                single=int(get("num_single_layers")), refiner=int(get("num_refiner_layers")),
                text=int(get("text_embed_dim")), pooled=int(get("pooled_projection_dim")),
                guidance=bool(get("guidance_embeds", True)))


def _refiner_flops(d: dict, Lt: int, B: int) -> int:
    D = d["D"]
    block = qkv_attention_flops(B, Lt, D) + linear_flops(B * Lt, D, D) + mlp_flops(B * Lt, D, REFINER_MLP * D) \
        + linear_flops(B, D, 2 * D)
    return embedder_flops(B, FREQ, D) + embedder_flops(B, d["text"], D) + linear_flops(B * Lt, d["text"], D) \
        + d["refiner"] * block


def transformer_flops_breakdown(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> dict[str, int]:
    """One HunyuanVideoTransformer3DModel forward by part; image_tokens: latent cells (f h w)."""
    d = _dims(cfg)
    cells, Lt, B = token_counts(image_tokens, text_tokens, batch)
    L, D, S = cells // d["patch"], d["D"], cells // d["patch"] + Lt
    dual = (2 * linear_flops(B, D, 6 * D) + qkv_attention_flops(B, L, D) + 3 * linear_flops(B * Lt, D, D)
            + attention_flops(B, S, S, D) - attention_flops(B, L, L, D) + linear_flops(B * L, D, D)
            + linear_flops(B * Lt, D, D) + mlp_flops(B * L, D, d["mlp"]) + mlp_flops(B * Lt, D, d["mlp"]))
    single = (linear_flops(B, D, 3 * D) + qkv_attention_flops(B, S, D) + linear_flops(B * S, D, d["mlp"])
              + linear_flops(B * S, D + d["mlp"], D))
    parts = {
        "patch_embedding": linear_flops(B * L, d["C"] * d["patch"], D),
        "context_refiner": _refiner_flops(d, Lt, B),
        "conditioning": (2 + d["guidance"]) * embedder_flops(B, FREQ, D) - embedder_flops(B, FREQ, D)
        + embedder_flops(B, d["pooled"], D),
        "dual_blocks": d["dual"] * dual,
        "single_blocks": d["single"] * single,
        "norm_out": linear_flops(B, D, 2 * D),
        "proj_out": linear_flops(B * L, D, d["out"] * d["patch"]),
    }
    parts["total"] = sum(parts.values())
    return parts


def transformer_backward_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> int:
    """Backward of one forward, all weights trainable: twice the forward minus the input gradients of the
    layers fed only by data (the patch embedding, the first linear of each embedder of the timestep,
    guidance, pooled and mean text, and the refiner's proj_in)."""
    d = _dims(cfg)
    p = transformer_flops_breakdown(cfg, image_tokens, text_tokens, batch)
    cells, Lt, B = token_counts(image_tokens, text_tokens, batch)
    D = d["D"]
    data_fed = (p["patch_embedding"] + (2 + d["guidance"]) * linear_flops(B, FREQ, D)
                + linear_flops(B, d["pooled"], D) + linear_flops(B, d["text"], D) + linear_flops(B * Lt, d["text"], D))
    return 2 * p["total"] - data_fed
