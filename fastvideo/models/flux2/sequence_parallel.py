"""FLUX.2's sequence-parallel plan (fastvideo.distributed.sequence_parallel), [klein] and [dev] alike.

Flux2Transformer2DModel embeds its packed image tokens token by token (``x_embedder``, a Linear)
and computes RoPE for the image and the text apart (``pos_embed(img_ids)``, ``pos_embed(txt_ids)``,
concatenated text first). So the split is made on the forward's inputs: each rank keeps its 1/N of
``hidden_states``' tokens and the same rows of ``img_ids`` (its RoPE rows follow), and the tokens
are gathered after ``proj_out``. The double-stream blocks (``Flux2AttnProcessor``: text then image)
and the single-stream blocks (``Flux2ParallelSelfAttnProcessor``: the joint sequence, text first,
with the MLP fused into its projections) attend through :class:`SequenceShard.attention`.
"""

from __future__ import annotations

import torch

from fastvideo.distributed.sequence_parallel import SequenceParallelPlan, SequenceShard
from fastvideo.models.npu_ops import attention_bnsd

_IMG_IDS = 3  # img_ids' position in Flux2Transformer2DModel.forward (after hidden_states, context, timestep)


def _attend(shard: SequenceShard, q, k, v, text: int, mask) -> torch.Tensor:
    """[B, S, H, D] (text rows first, then this rank's image rows) -> [B, S, H, D]."""
    if mask is not None:
        raise ValueError("FLUX.2 sequence parallelism takes no attention mask")
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return shard.attention(q, k, v, text, text_first=True, attend=attention_bnsd).transpose(1, 2)


class Flux2SequenceParallelProcessor:
    """diffusers' ``Flux2AttnProcessor`` (double-stream joint attention) and
    ``Flux2ParallelSelfAttnProcessor`` (single-stream: q / k / v and the MLP input from one
    projection, the joint sequence text first), by the attention module's kind, with the attention
    across the sequence group."""

    def __init__(self, shard: SequenceShard):
        self.shard = shard

    def __call__(self, attn, hidden_states, *args):
        if hasattr(attn, "to_qkv_mlp_proj"):
            return self.single(attn, hidden_states, *args)
        return self.joint(attn, hidden_states, *args)

    def joint(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.embeddings import apply_rotary_emb
        from diffusers.models.transformers.transformer_flux2 import _get_qkv_projections

        q, k, v, cq, ck, cv = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        q, k, v = (t.unflatten(-1, (-1, attn.head_dim)) for t in (q, k, v))
        q, k = attn.norm_q(q), attn.norm_k(k)
        text = 0
        if attn.added_kv_proj_dim is not None:
            cq, ck, cv = (t.unflatten(-1, (-1, attn.head_dim)) for t in (cq, ck, cv))
            cq, ck = attn.norm_added_q(cq), attn.norm_added_k(ck)
            text = cq.shape[1]
            q, k, v = (torch.cat(pair, dim=1) for pair in ((cq, q), (ck, k), (cv, v)))
        if image_rotary_emb is not None:
            q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        out = _attend(self.shard, q, k, v, text, attention_mask).flatten(2, 3).to(q.dtype)
        context = None
        if encoder_hidden_states is not None:
            context, out = out.split_with_sizes([text, out.shape[1] - text], dim=1)
            context = attn.to_add_out(context)
        out = attn.to_out[1](attn.to_out[0](out))
        return out if context is None else (out, context)

    def single(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.embeddings import apply_rotary_emb

        hidden = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp = torch.split(hidden, [local_qkv, hidden.shape[-1] - local_qkv], dim=-1)
        q, k, v = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))
        q, k = attn.norm_q(q), attn.norm_k(k)
        if image_rotary_emb is not None:
            q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        text = hidden_states.shape[1] - self.shard.local_tokens
        out = _attend(self.shard, q, k, v, text, attention_mask).flatten(2, 3).to(q.dtype)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))


def _install_hooks(model: torch.nn.Module, shard: SequenceShard) -> None:
    """Split the forward's image tokens and their position ids; gather after ``proj_out``."""

    def split_inputs(module, args, kwargs):
        args = list(args)
        tokens = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        tokens = shard.split(tokens)
        if "hidden_states" in kwargs:
            kwargs["hidden_states"] = tokens
        else:
            args[0] = tokens
        key = "img_ids" if "img_ids" in kwargs or len(args) <= _IMG_IDS else _IMG_IDS
        source = kwargs if isinstance(key, str) else args
        ids = source[key]
        source[key] = ids.narrow(-2, shard.rank * shard.local_tokens, shard.local_tokens)
        return tuple(args), kwargs

    model.register_forward_pre_hook(split_inputs, with_kwargs=True)
    model.get_submodule("proj_out").register_forward_hook(lambda m, i, out: shard.gather(out))


def flux2_plan() -> SequenceParallelPlan:
    from diffusers.models.transformers.transformer_flux2 import Flux2AttnProcessor, Flux2ParallelSelfAttnProcessor

    return SequenceParallelPlan(split=None, gather=None, processor=Flux2SequenceParallelProcessor,
                                replaces=(Flux2AttnProcessor, Flux2ParallelSelfAttnProcessor), hooks=_install_hooks)
