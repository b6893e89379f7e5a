"""Wan's sequence-parallel plan (fastvideo.distributed.sequence_parallel): the video tokens split.

WanTransformer3DModel's forward patchifies the latents [B, C, F, H, W] into F' x H' x W' tokens
(frame-major), makes their RoPE tables (cos, sin) [1, S, 1, D] and, for Wan2.2-TI2V, one timestep
embedding per token ([B, S, 6, C]), then runs each block as block(tokens, text, temb, rope) and
ends with a per-token modulated norm and the output projection.

The split: a pre-hook on the first block keeps this rank's 1/N of the tokens (a contiguous run of
the frame-major order: whole frames when N divides F', else rows inside them); a pre-hook on every
block hands it the matching rows of the RoPE tables and of a per-token temb; a pre-hook on the
output norm gathers the tokens again (the final modulation and unpatchify see every token, as one
rank). Self-attention attends across the group (SequenceShard.attention with no text tokens: image
q / k / v go head-split by one all-to-all and back by one); the cross-attention to the replicated
umT5 tokens needs no exchange (its queries are this rank's tokens, its keys every text token) and
keeps its own processor.
"""

from __future__ import annotations

import torch

from fastvideo.distributed.sequence_parallel import SequenceParallelPlan, SequenceShard
from fastvideo.models.npu_ops import attention_bnsd
from fastvideo.models.wan.npu import qkv_heads


class WanSequenceParallelProcessor:
    """diffusers' ``WanAttnProcessor`` for the self-attention, across the sequence group: q / k / v
    hold this rank's tokens, rotated by this rank's RoPE rows."""

    def __init__(self, shard: SequenceShard):
        self.shard = shard

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        """hidden_states [B, L/N, C]; rotary_emb (cos, sin) [1, L/N, 1, D]. Returns [B, L/N, C]."""
        q, k, v = qkv_heads(attn, hidden_states, None, rotary_emb)  # [B, N, L/N, D] each
        out = self.shard.attention(q, k, v, 0, text_first=True, attend=attention_bnsd)
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The WanTransformerBlocks in order (inside FSDP / checkpoint wrappers too)."""
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    return [m for m in model.modules() if isinstance(m, WanTransformerBlock)]


def _install_hooks(model: torch.nn.Module, shard: SequenceShard) -> None:
    """Split before the first block, this rank's RoPE and temb rows into every block, gather before
    the output norm."""
    blocks = _blocks(model)

    def local_inputs(block, args):
        hidden, context, temb, rope = args
        if block is blocks[0]:
            hidden = shard.split(hidden)
        if temb.ndim == 4:  # Wan2.2-TI2V: one timestep embedding per token [B, S, 6, C]
            temb = shard.local(temb)
        return hidden, context, temb, tuple(shard.local(t) for t in rope)

    for block in blocks:
        block.register_forward_pre_hook(local_inputs)
    model.norm_out.register_forward_pre_hook(lambda module, args: (shard.gather(args[0]), *args[1:]))


def wan_plan() -> SequenceParallelPlan:
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    from fastvideo.models.wan.npu import NpuWanAttnProcessor

    def self_attention(model):
        return [block.attn1 for block in _blocks(model)]

    return SequenceParallelPlan(split=None, gather=None, processor=WanSequenceParallelProcessor,
                                replaces=(WanAttnProcessor, NpuWanAttnProcessor), hooks=_install_hooks,
                                attention_modules=self_attention, image_only=self_attention)
