"""Analytic FLOPs of Qwen-Image's transformer (diffusers 0.42's QwenImageTransformer2DModel, layer by
layer; tests/models/test_qwen_image.py checks them against FlopCounterMode on the tiny model), and
the real configuration the cost model knows.

Conventions: fastvideo.perf.flops. Qwen-Image is an MMDiT of ``num_layers`` double-stream blocks
(QwenImageTransformerBlock): separate image and text weights (adaLN Linear(D, 6D) per stream and
sample, q/k/v and output projections, a GELU feed-forward D -> 4D -> D per stream), joint attention
over the text then image tokens. Around them: img_in Linear(64, D), the text's RMS norm and txt_in
Linear(3584, D), the timestep embedder (256 -> D -> D), AdaLayerNormContinuous (D -> 2D) and proj_out
(D -> 64) on the image tokens. No padding: the text is as long as the batch's longest prompt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fastvideo.models.flops import (HeadDims, TIMESTEP_PROJ_DIM, dims_from_config, embedder_flops, linear_flops,
                                    mlp_flops, qkv_attention_flops, token_counts,
                                    with_output_layers)


@dataclass(frozen=True)
class QwenImageDims(HeadDims):
    """The QwenImageTransformer2DModel config keys that set its FLOPs (defaults: Qwen-Image 20B, the
    Qwen/Qwen-Image transformer/config.json)."""

    patch_size: int = 2
    in_channels: int = 64
    out_channels: int = 16
    num_layers: int = 60
    attention_head_dim: int = 128
    num_attention_heads: int = 24
    joint_attention_dim: int = 3584  # Qwen2.5-VL-7B's hidden size
    guidance_embeds: bool = False
    axes_dims_rope: tuple = (16, 56, 56)

    @classmethod
    def from_config(cls, cfg) -> "QwenImageDims":
        return dims_from_config(cls, cfg, ("num_layers", "attention_head_dim", "num_attention_heads"),
                                "QwenImageTransformer2DModel", tuple_keys=("axes_dims_rope",))


QWEN_IMAGE_20B = QwenImageDims()
QWEN2_5_VL_7B_PARAMS = 8.29e9  # the text encoder (language model 7.07e9 + vision tower 0.67e9 + head 0.55e9)


def reference_config(d: QwenImageDims) -> dict:
    """The diffusers config of ``d`` (what from_config builds the real transformer from)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(d).items()}


def block_flops(d: QwenImageDims, L: int, Lt: int, B: int = 1) -> int:
    """One QwenImageTransformerBlock: img_mod and txt_mod (6 D each, one row per sample), q/k/v of both
    streams and joint attention over L + Lt, to_out and to_add_out, img_mlp and txt_mlp (4 D)."""
    D, S = d.inner_dim, L + Lt
    adaln = 2 * linear_flops(B, D, 6 * D)
    return adaln + qkv_attention_flops(B, S, D) + linear_flops(B * S, D, D) + mlp_flops(B * S, D, 4 * D)


def transformer_flops_breakdown(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> dict[str, int]:
    """One QwenImageTransformer2DModel forward by part. image_tokens L = (h/16)(w/16), text_tokens Lt
    (the batch's longest prompt after the template's prefix), batch B."""
    d = QwenImageDims.from_config(cfg)
    L, Lt, B = token_counts(image_tokens, text_tokens, batch)
    D = d.inner_dim
    parts = {
        "img_in": linear_flops(B * L, d.in_channels, D),
        "txt_in": linear_flops(B * Lt, d.joint_attention_dim, D),
        "time_embedder": embedder_flops(B, TIMESTEP_PROJ_DIM, D),
        "transformer_blocks": d.num_layers * block_flops(d, L, Lt, B),
    }
    return with_output_layers(parts, d, L, B)


def transformer_backward_flops(cfg, image_tokens: int, text_tokens: int, batch: int = 1) -> int:
    """Backward of one forward, all weights trainable: twice the forward minus the input gradients of
    the layers fed only by data (img_in, the timestep embedder's first linear), and minus the whole
    backward of the last block's text output (to_add_out and txt_mlp: the model returns the image
    tokens only, so autograd never reaches them). txt_in's input is the text RMS norm's output, whose
    weight trains: its input gradient is computed."""
    d = QwenImageDims.from_config(cfg)
    p = transformer_flops_breakdown(d, image_tokens, text_tokens, batch)
    rows, D = int(batch) * int(text_tokens), d.inner_dim
    dead_text = linear_flops(rows, D, D) + mlp_flops(rows, D, 4 * D)
    return 2 * p["total"] - p["img_in"] - linear_flops(int(batch), TIMESTEP_PROJ_DIM, D) - 2 * dead_text
