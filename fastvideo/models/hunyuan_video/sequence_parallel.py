"""HunyuanVideo's sequence-parallel plan (fastvideo.distributed.sequence_parallel): the video tokens split.

HunyuanVideoTransformer3DModel's forward makes the RoPE tables (cos, sin) [L, D] of the F' x H' x W'
video tokens (frame-major, no text rows) from the latents, embeds the tokens (``x_embedder``: [B, L, C]),
refines the Llama tokens, builds the attention mask from the video tokens' count and the text mask
(diffusers 0.32: [B, S, S], a padded text position masked as key and query; 0.42: [B, 1, 1, S], as key),
and runs the dual-stream then the single-stream blocks as block(video, text, temb, mask, rope, ...); the
joint attention puts the video tokens first, the text last.

The split: ``x_embedder``'s output keeps this rank's 1/N of the video tokens (a contiguous run of the
frame-major order: whole frames when N divides F', else rows inside them), a pre-hook on every block
hands it the matching rows of the RoPE tables, and ``proj_out``'s output is gathered (as FLUX.1's
plan). The text stream stays replicated (the dual-stream SP of FLUX.1): the blocks' attention
(:class:`HunyuanVideoSequenceParallelProcessor`) attends across the group through
SequenceShard.attention with the text last, under the stock mask rebuilt for the whole sequence (every
video token kept, the text as its mask says). The token refiner's attention is over the text alone and
keeps its processor.
"""

from __future__ import annotations

import torch

from fastvideo.distributed.sequence_parallel import SequenceParallelPlan, SequenceShard
from fastvideo.models.npu_ops import attention_bnsd


def _whole_mask(mask: torch.Tensor | None, video_tokens: int, text_tokens: int) -> torch.Tensor | None:
    """The stock mask of this rank's sequence (its video tokens, then the text) -> the same mask over
    every rank's video tokens then the text: [B, 1, S, S] from 0.32's [B, S', S'], [B, 1, 1, S] from
    0.42's [B, 1, 1, S']. The text's key mask is the first (video) query row's last text_tokens entries."""
    if mask is None:
        return None
    text = mask.flatten(1, -2)[:, 0, -text_tokens:].bool()  # [B, Lt]
    keep = torch.cat([torch.ones(text.shape[0], video_tokens, dtype=torch.bool, device=text.device), text], dim=1)
    if mask.ndim == 3:  # diffusers 0.32: a padded text position is masked as a query too
        return (keep[:, :, None] & keep[:, None, :])[:, None]
    return keep[:, None, None, :]


class HunyuanVideoSequenceParallelProcessor:
    """diffusers' ``HunyuanVideoAttnProcessor2_0`` (dual-stream blocks: the text through add_*_proj;
    single-stream: one projection of [video ; text]) with the attention across the sequence group:
    hidden_states [B, L/N, C] (this rank's video tokens), encoder_hidden_states [B, Lt, C] (every rank's
    text), image_rotary_emb (cos, sin) [L/N, D] (this rank's rows). Returns (video [B, L/N, C], text)."""

    def __init__(self, shard: SequenceShard):
        self.shard = shard

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.embeddings import apply_rotary_emb

        if encoder_hidden_states is None:
            raise ValueError("HunyuanVideo sequence parallelism attends over the video and the text tokens together")
        text, local = encoder_hidden_states.shape[1], hidden_states.shape[1]
        single = attn.add_q_proj is None
        x = torch.cat([hidden_states, encoder_hidden_states], dim=1) if single else hidden_states
        q, k, v = (p(x).unflatten(2, (attn.heads, -1)).transpose(1, 2) for p in (attn.to_q, attn.to_k, attn.to_v))
        q = attn.norm_q(q) if attn.norm_q is not None else q
        k = attn.norm_k(k) if attn.norm_k is not None else k
        if image_rotary_emb is not None:  # the video rows only
            q, k = (torch.cat([apply_rotary_emb(t[:, :, :local], image_rotary_emb), t[:, :, local:]], dim=2)
                    for t in (q, k))
        if not single:
            tq, tk, tv = (p(encoder_hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
                          for p in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
            tq = attn.norm_added_q(tq) if attn.norm_added_q is not None else tq
            tk = attn.norm_added_k(tk) if attn.norm_added_k is not None else tk
            q, k, v = (torch.cat(pair, dim=2) for pair in ((q, tq), (k, tk), (v, tv)))
        mask = _whole_mask(attention_mask, self.shard.full_tokens, text)
        out = self.shard.attention(q, k, v, text, text_first=False, attend=lambda *qkv: attention_bnsd(*qkv, mask))
        out = out.transpose(1, 2).flatten(2, 3).to(q.dtype)
        video, words = out[:, :local], out[:, local:]
        if getattr(attn, "to_out", None) is not None:
            video = attn.to_out[1](attn.to_out[0](video))
        if getattr(attn, "to_add_out", None) is not None:
            words = attn.to_add_out(words)
        return video, words


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The dual- and single-stream blocks (inside FSDP / checkpoint wrappers too); not the image-to-video
    token-replace blocks (their first-frame token count would need its own split)."""
    from diffusers.models.transformers.transformer_hunyuan_video import (HunyuanVideoSingleTransformerBlock,
                                                                         HunyuanVideoTransformerBlock)

    return [m for m in model.modules() if type(m) in (HunyuanVideoTransformerBlock, HunyuanVideoSingleTransformerBlock)]


def _install_hooks(model: torch.nn.Module, shard: SequenceShard) -> None:
    """Every block takes this rank's rows of the RoPE tables (its fifth argument)."""

    def local_rope(block, args):
        rope = args[4]
        return (*args[:4], tuple(shard.local(t, dim=0) for t in rope), *args[5:])

    for block in _blocks(model):
        block.register_forward_pre_hook(local_rope)


def hunyuan_video_plan() -> SequenceParallelPlan:
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    def attention_modules(model):
        return [block.attn for block in _blocks(model)]

    return SequenceParallelPlan(split="x_embedder", gather="proj_out", processor=HunyuanVideoSequenceParallelProcessor,
                                replaces=(HunyuanVideoAttnProcessor2_0,), hooks=_install_hooks,
                                attention_modules=attention_modules)
