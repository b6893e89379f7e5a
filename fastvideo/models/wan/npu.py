"""Wan on an Ascend NPU: its attention through the device adapter.

Wan's RoPE needs nothing of its own: diffusers 0.42 makes its (cos, sin) tables from float64
frequencies but keeps them float32, and rotates q and k in real arithmetic (no complex numbers;
tests/models/test_wan.py runs the forward under the float64 guard). The attention (self, cross and
Wan2.1-I2V's image keys) goes through npu_ops.attention_bnsd: the fused kernel on an NPU, SDPA
elsewhere. The RMS norms (q/k norms across heads) are npu_ops.adapt_for_npu's. Installed by
components.adapt_for_device on an NPU only.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from fastvideo.models.npu_ops import attention_bnsd, set_processors

logger = logging.getLogger(__name__)


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotation of the channel pairs (2i, 2i+1) of x [B, S, N, D] by the angles whose cos and
    sin tables [1, S, 1, D] repeat each value twice (diffusers' repeat_interleave_real); x's dtype."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).type_as(x)


def _heads(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """[B, S, N*D] -> [B, N, S, D]."""
    return x.unflatten(2, (attn.heads, -1)).transpose(1, 2)


def _projections(attn: nn.Module, hidden_states: torch.Tensor, context: torch.Tensor | None):
    """(q, k, v) [B, S, N*D] of a WanAttention, fused projections or not (diffusers' _get_qkv_projections)."""
    source = hidden_states if context is None else context
    if not attn.fused_projections:
        return attn.to_q(hidden_states), attn.to_k(source), attn.to_v(source)
    if not attn.is_cross_attention:
        return attn.to_qkv(hidden_states).chunk(3, dim=-1)
    return (attn.to_q(hidden_states), *attn.to_kv(source).chunk(2, dim=-1))


def qkv_heads(attn: nn.Module, hidden_states: torch.Tensor, context: torch.Tensor | None, rotary_emb=None):
    """(q, k, v) [B, N, S, D] of a WanAttention: projected, q and k normalised across the heads, split
    into heads, q and k rotated by rotary_emb (cos, sin) [1, S, 1, D] when given."""
    q, k, v = _projections(attn, hidden_states, context)
    q, k = attn.norm_q(q), attn.norm_k(k)
    q, k, v = (x.unflatten(2, (attn.heads, -1)) for x in (q, k, v))
    if rotary_emb is not None:
        q, k = rotate_interleaved(q, *rotary_emb), rotate_interleaved(k, *rotary_emb)
    return tuple(x.transpose(1, 2) for x in (q, k, v))


class NpuWanAttnProcessor:
    """diffusers' ``WanAttnProcessor`` with its attention through :func:`attention_bnsd` (the fused
    kernel on an NPU, SDPA elsewhere) and the rotation of :func:`rotate_interleaved`."""

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states=None,
                 attention_mask: torch.Tensor | None = None, rotary_emb=None) -> torch.Tensor:
        """hidden_states [B, S, C]; encoder_hidden_states [B, L, C] (cross-attention; Wan2.1-I2V: the
        image's tokens first, then 512 text tokens); rotary_emb (cos, sin) [1, S, 1, D]. -> [B, S, C]."""
        image_context = None
        if attn.add_k_proj is not None:  # the I2V image keys: 512 is the text encoder's length, as diffusers
            split = encoder_hidden_states.shape[1] - 512
            image_context, encoder_hidden_states = encoder_hidden_states[:, :split], encoder_hidden_states[:, split:]
        q, k, v = qkv_heads(attn, hidden_states, encoder_hidden_states, rotary_emb)
        out = attention_bnsd(q, k, v, attention_mask).transpose(1, 2).flatten(2, 3).type_as(q)
        if image_context is not None:
            if attn.fused_projections:
                key_img, value_img = attn.to_added_kv(image_context).chunk(2, dim=-1)
            else:
                key_img, value_img = attn.add_k_proj(image_context), attn.add_v_proj(image_context)
            image = attention_bnsd(q, _heads(attn, attn.norm_added_k(key_img)), _heads(attn, value_img))
            out = out + image.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def adapt_wan_for_npu(transformer: nn.Module) -> int:
    """Install :class:`NpuWanAttnProcessor` in a diffusers WanTransformer3DModel, in place (its RMS
    norms: npu_ops.adapt_for_npu). Idempotent; no parameter changes. Returns the number of attention
    processors swapped (2 per block: self and cross)."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    model = getattr(transformer, "module", transformer)
    swapped = set_processors(model, WanAttnProcessor, NpuWanAttnProcessor())
    logger.info("Wan NPU kernels installed: %d attention processors", swapped)
    return swapped
