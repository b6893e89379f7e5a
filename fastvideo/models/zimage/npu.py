"""Z-Image on an Ascend NPU: its RoPE without complex numbers (real (cos, sin) tables) and its masked
single-stream attention through the device adapter (npu_ops.attention_bnsd: the fused kernel, the
key-padding mask converted; SDPA elsewhere). The RMS norms are npu_ops.adapt_for_npu's. Installed by
components.adapt_for_device on an NPU only; the sequence-parallel processor shares the q/k/v and
output helpers.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch
from torch import nn

from fastvideo.models.npu_ops import attention_bnsd, rotate_pairs, set_processors

logger = logging.getLogger(__name__)


class NpuZImageRope:
    """Drop-in for Z-Image's ``RopeEmbedder`` (a plain object, not a module) without complex numbers:
    the per-axis rotations as (cos, sin) pairs. The angle tables are made once, here, on the CPU as
    diffusers makes them (float64 frequencies, float32 angles) and moved to the ids' device.

    ids [S, n_axes] int -> [S, sum(axes_dims) / 2, 2] float32: the real and imaginary parts of the
    stock embedder's complex64 result."""

    def __init__(self, theta: float, axes_dims: Sequence[int], axes_lens: Sequence[int]):
        self.theta, self.axes_dims, self.axes_lens = theta, list(axes_dims), list(axes_lens)
        self.tables = []
        for dim, length in zip(self.axes_dims, self.axes_lens):
            freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            angles = torch.outer(torch.arange(length, dtype=torch.float64), freqs).float()  # [length, dim / 2]
            self.tables.append(torch.stack([angles.cos(), angles.sin()], dim=-1))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tables[0].device != ids.device:
            self.tables = [t.to(ids.device) for t in self.tables]
        return torch.cat([table[ids[:, i]] for i, table in enumerate(self.tables)], dim=-2)


class NpuZImageAttnProcessor:
    """Z-Image's single-stream attention (diffusers' ``ZSingleStreamAttnProcessor``) with the RoPE of
    :class:`NpuZImageRope` (real arithmetic) and the attention of :func:`attention_bnsd` (the fused
    kernel on an NPU, its key-padding mask converted; SDPA elsewhere)."""

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states=None,
                 attention_mask: torch.Tensor | None = None, freqs_cis: torch.Tensor | None = None) -> torch.Tensor:
        """hidden_states [B, S, C]; attention_mask [B, S] bool (True: keep) or None; freqs_cis
        [B, S, D/2, 2]. Returns [B, S, C]."""
        q, k, v = single_stream_qkv(attn, hidden_states)
        if freqs_cis is not None:
            q, k = rotate_pairs(q, freqs_cis), rotate_pairs(k, freqs_cis)
        out = attention_bnsd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), key_padding_bnsd(attention_mask))
        return single_stream_out(attn, out, q.dtype)


def single_stream_qkv(attn: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Z-Image's (q, k, v) [B, S, N, D] of hidden_states [B, S, C], q and k normalised when the layer
    has norms (ZSingleStreamAttnProcessor)."""
    q, k, v = (proj(hidden_states).unflatten(-1, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
    if attn.norm_q is not None:
        q = attn.norm_q(q)
    if attn.norm_k is not None:
        k = attn.norm_k(k)
    return q, k, v


def key_padding_bnsd(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A key-padding mask [B, S] (True: keep) as [B, 1, 1, S]; any other mask (or None) as it is."""
    return attention_mask[:, None, None, :] if attention_mask is not None and attention_mask.ndim == 2 \
        else attention_mask


def single_stream_out(attn: nn.Module, out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The attention's [B, N, S, D] -> [B, S, N*D] in ``dtype`` -> the output projection (and dropout)."""
    out = attn.to_out[0](out.transpose(1, 2).flatten(2).to(dtype))
    return attn.to_out[1](out) if len(attn.to_out) > 1 else out


def adapt_zimage_for_npu(transformer: nn.Module) -> int:
    """Install :class:`NpuZImageRope` and :class:`NpuZImageAttnProcessor` in a diffusers
    ZImageTransformer2DModel, in place (its RMS norms: :func:`adapt_for_npu`). Idempotent; no
    parameter changes. Returns the number of attention processors swapped."""
    from diffusers.models.transformers.transformer_z_image import RopeEmbedder, ZSingleStreamAttnProcessor

    model = getattr(transformer, "module", transformer)
    rope = model.rope_embedder
    if isinstance(rope, RopeEmbedder):
        model.rope_embedder = NpuZImageRope(rope.theta, rope.axes_dims, rope.axes_lens)
    swapped = set_processors(model, ZSingleStreamAttnProcessor, NpuZImageAttnProcessor())
    logger.info("Z-Image NPU kernels installed: real-arithmetic RoPE, %d attention processors", swapped)
    return swapped
