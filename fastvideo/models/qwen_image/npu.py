"""Qwen-Image on an Ascend NPU: its RoPE without complex numbers on the device and its joint attention
through the device adapter (npu_ops.attention_bnsd: the fused kernel, the text's key-padding mask
converted). The RMS norms are npu_ops.adapt_for_npu's (the q/k norms of both streams and the text
norm: 4 per block + 1). Installed by components.adapt_for_device on an NPU only.
"""

from __future__ import annotations

import torch
from torch import nn

from fastvideo.models import npu_ops


class NpuQwenRope(nn.Module):
    """Wraps diffusers' QwenEmbedRope: the stock tables made on the CPU (complex64 there), handed to
    the device as (cos, sin) pairs [S, D/2, 2] float32: (image freqs, text freqs)."""

    def __init__(self, stock: nn.Module):
        super().__init__()
        self.stock = stock

    def forward(self, video_fhw, device=None, max_txt_seq_len=None):
        img, txt = self.stock(video_fhw, device=torch.device("cpu"), max_txt_seq_len=max_txt_seq_len)
        return tuple(torch.view_as_real(f).to(device) for f in (img, txt))


def rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """apply_rotary_emb_qwen(use_real=False) in real arithmetic: x [B, S, N, D] (pairs (2i, 2i + 1)
    rotate together) by freqs [S, D/2, 2] (cos, sin) -> float32 [B, S, N, D] (the stock result's dtype
    before the processor casts)."""
    return npu_ops.rotate_pairs(x.float(), freqs.unsqueeze(0).expand(x.shape[0], -1, -1, -1))


class NpuQwenAttnProcessor:
    """diffusers' QwenDoubleStreamAttnProcessor2_0 with the RoPE of :class:`NpuQwenRope` (real
    arithmetic) and :func:`npu_ops.attention_bnsd` (SDPA off an NPU)."""

    def __call__(self, attn: nn.Module, hidden_states, encoder_hidden_states=None, encoder_hidden_states_mask=None,
                 attention_mask=None, image_rotary_emb=None):
        if attention_mask is not None:
            raise ValueError("the Qwen-Image attention takes encoder_hidden_states_mask, not attention_mask")
        mask = None
        if encoder_hidden_states_mask is not None:
            image = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
            mask = torch.cat([encoder_hidden_states_mask, image], dim=1)[:, None, None, :]
        head_dim = attn.inner_dim // attn.heads
        img = [p(hidden_states).unflatten(-1, (-1, head_dim)) for p in (attn.to_q, attn.to_k, attn.to_v)]
        txt = [p(encoder_hidden_states).unflatten(-1, (-1, head_dim))
               for p in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
        img[0], img[1] = attn.norm_q(img[0]), attn.norm_k(img[1])
        txt[0], txt[1] = attn.norm_added_q(txt[0]), attn.norm_added_k(txt[1])
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img[0], img[1] = (rotate(t, img_freqs).type_as(t) for t in img[:2])
            txt[0], txt[1] = (rotate(t, txt_freqs).type_as(t) for t in txt[:2])
        q, k, v = (torch.cat([t, i], dim=1).transpose(1, 2) for t, i in zip(txt, img))
        out = npu_ops.attention_bnsd(q, k, v, mask).transpose(1, 2).flatten(2).to(q.dtype)
        seq_txt = encoder_hidden_states.shape[1]
        img_out = attn.to_out[0](out[:, seq_txt:].contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        return img_out, attn.to_add_out(out[:, :seq_txt].contiguous())


def adapt_qwen_image_for_npu(transformer: nn.Module) -> int:
    """Install :class:`NpuQwenRope` and :class:`NpuQwenAttnProcessor` in a diffusers
    QwenImageTransformer2DModel, in place. Idempotent; no parameter changes. Returns the number of
    attention processors swapped."""
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0, QwenEmbedRope

    model = getattr(transformer, "module", transformer)
    if isinstance(model.pos_embed, QwenEmbedRope):
        model.pos_embed = NpuQwenRope(model.pos_embed)
    processor, swapped = NpuQwenAttnProcessor(), 0
    for module in model.modules():
        if isinstance(getattr(module, "processor", None), QwenDoubleStreamAttnProcessor2_0):
            module.set_processor(processor)
            swapped += 1
    return swapped
