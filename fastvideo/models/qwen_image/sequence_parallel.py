"""Qwen-Image's sequence-parallel plan (fastvideo.distributed.sequence_parallel).

QwenImageTransformer2DModel embeds its packed image tokens token by token (``img_in``), computes
RoPE from ``img_shapes`` in ``pos_embed`` as (image tables [L, D/2], text tables [S_text, D/2]), and
runs dual-stream blocks whose joint attention puts the text first, masked by the text's key-padding
mask. The split: ``img_in``'s output keeps this rank's 1/N of the image tokens, ``pos_embed``'s
image tables keep the same rows, the tokens are gathered after ``proj_out``; the joint attention
(:class:`QwenSequenceParallelProcessor`) attends across the group, its mask over the whole
sequence's keys (the text's mask, then every rank's image tokens).
"""

from __future__ import annotations

import torch

from fastvideo.distributed.sequence_parallel import SequenceParallelPlan, SequenceShard
from fastvideo.models.npu_ops import attention_bnsd


def _rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] by freqs [S, D/2]: complex (diffusers' QwenEmbedRope, its maths) or [S, D/2, 2]
    real (qwen_image.npu.NpuQwenRope on an NPU)."""
    if freqs.is_complex():
        from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

        return apply_rotary_emb_qwen(x, freqs, use_real=False)
    from fastvideo.models.qwen_image.npu import rotate

    return rotate(x, freqs).type_as(x)


class QwenSequenceParallelProcessor:
    """diffusers' ``QwenDoubleStreamAttnProcessor2_0`` with the attention across the sequence group:
    hidden_states [B, L/N, C] (this rank's image tokens), encoder_hidden_states [B, S_text, C]."""

    def __init__(self, shard: SequenceShard):
        self.shard = shard

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, encoder_hidden_states_mask=None,
                 attention_mask=None, image_rotary_emb=None):
        if encoder_hidden_states is None or attention_mask is not None:
            raise ValueError("the Qwen-Image attention takes the text stream and encoder_hidden_states_mask, "
                             "not attention_mask")
        mask = None
        if encoder_hidden_states_mask is not None:  # keys: the text, then every rank's image tokens
            image = torch.ones(hidden_states.shape[0], self.shard.full_tokens, dtype=torch.bool,
                               device=hidden_states.device)
            mask = torch.cat([encoder_hidden_states_mask.bool(), image], dim=1)[:, None, None, :]
        head_dim = attn.inner_dim // attn.heads
        img = [p(hidden_states).unflatten(-1, (-1, head_dim)) for p in (attn.to_q, attn.to_k, attn.to_v)]
        txt = [p(encoder_hidden_states).unflatten(-1, (-1, head_dim))
               for p in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
        for pair, (nq, nk) in ((img, (attn.norm_q, attn.norm_k)), (txt, (attn.norm_added_q, attn.norm_added_k))):
            pair[0] = nq(pair[0]) if nq is not None else pair[0]
            pair[1] = nk(pair[1]) if nk is not None else pair[1]
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img[0], img[1] = (_rope(t, img_freqs) for t in img[:2])
            txt[0], txt[1] = (_rope(t, txt_freqs) for t in txt[:2])
        seq_txt = encoder_hidden_states.shape[1]
        q, k, v = (torch.cat([t, i], dim=1).transpose(1, 2) for t, i in zip(txt, img))
        out = self.shard.attention(q, k, v, seq_txt, text_first=True,
                                   attend=lambda *qkv: attention_bnsd(*qkv, mask))
        out = out.transpose(1, 2).flatten(2).to(q.dtype)
        img_out = attn.to_out[0](out[:, seq_txt:].contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        return img_out, attn.to_add_out(out[:, :seq_txt].contiguous())


def _install_hooks(model: torch.nn.Module, shard: SequenceShard) -> None:
    """pos_embed's image tables keep this rank's rows (the text's stay whole); under zero_cond_t
    (Qwen-Image-Edit-2511: per-token modulation, generated tokens 0, source tokens 1) each block's
    modulate_index [B, L] keeps the same columns."""

    def rows(module, inputs, out):
        img, txt = out
        return img.narrow(0, shard.rank * shard.local_tokens, shard.local_tokens), txt

    model.get_submodule("pos_embed").register_forward_hook(rows)
    if not getattr(model.config, "zero_cond_t", False):
        return

    def local(index):
        if isinstance(index, torch.Tensor) and index.ndim == 2 and index.shape[1] == shard.full_tokens:
            return index.narrow(1, shard.rank * shard.local_tokens, shard.local_tokens)
        return index

    def columns(module, args, kwargs):  # the forward passes it by keyword (the project's checkpointing wraps
        # whole blocks; diffusers' own, which passes it positionally, is never enabled)
        if "modulate_index" not in kwargs:
            raise ValueError("Qwen-Image sequence parallelism: a block got modulate_index positionally "
                             "(diffusers' gradient checkpointing); use the project's --gradient_checkpointing")
        return args, {**kwargs, "modulate_index": local(kwargs["modulate_index"])}

    for block in model.get_submodule("transformer_blocks"):
        block.register_forward_pre_hook(columns, with_kwargs=True)


def qwen_image_plan() -> SequenceParallelPlan:
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    from fastvideo.models.qwen_image.npu import NpuQwenAttnProcessor

    return SequenceParallelPlan(split="img_in", gather="proj_out", processor=QwenSequenceParallelProcessor,
                                replaces=(QwenDoubleStreamAttnProcessor2_0, NpuQwenAttnProcessor),
                                hooks=_install_hooks)
