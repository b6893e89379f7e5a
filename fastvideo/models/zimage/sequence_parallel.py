"""Z-Image's sequence-parallel plan (fastvideo.distributed.sequence_parallel).

ZImageTransformer2DModel's forward embeds each sample's image patches (padded to a multiple of 32
tokens with its x_pad_token) and caption (padded likewise), refines each stream alone (the noise
refiner: image tokens; the context refiner: text tokens), then runs the main layers on one
sequence per sample, [image tokens, caption tokens], batch-padded at the end with a key-padding
mask when captions differ in length.

The split: after the image stream's ``_prepare_sequence`` (tokens and RoPE rows, which follow them)
each rank keeps 1/N of the padded image tokens, so the noise refiner attends image-only across the
group (no text) and the unified sequence holds this rank's image tokens, then the (replicated)
caption tokens. The context refiner is text-only and keeps diffusers' processor. The final layer's
output is gathered (image tokens; the caption rows, which unpatchify drops, stay local). The masks
the forward builds describe the whole sequence's keys (every rank's image tokens, then the text),
which is what the gathered attention sees.
"""

from __future__ import annotations

import torch

from fastvideo.distributed.sequence_parallel import SequenceParallelPlan, SequenceShard
from fastvideo.models.npu_ops import attention_bnsd, rotate_pairs
from fastvideo.models.zimage.npu import key_padding_bnsd, single_stream_out, single_stream_qkv


def _rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] rotated by freqs [B, S, D/2]: complex (diffusers' RopeEmbedder, its maths) or
    [B, S, D/2, 2] real (zimage.npu.NpuZImageRope on an NPU)."""
    if not freqs.is_complex():
        return rotate_pairs(x, freqs)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs.unsqueeze(2)).flatten(3).type_as(x)


class ZImageSequenceParallelProcessor:
    """diffusers' ``ZSingleStreamAttnProcessor`` with the attention across the sequence group: q / k / v
    hold this rank's image tokens first, then the text tokens (none in the noise refiner)."""

    def __init__(self, shard: SequenceShard):
        self.shard = shard

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, freqs_cis=None):
        """hidden_states [B, L/N + S_text, C]; attention_mask [B, L + S_text] bool (True: keep; the
        whole sequence's keys) or None. Returns [B, L/N + S_text, C]."""
        q, k, v = single_stream_qkv(attn, hidden_states)
        if freqs_cis is not None:
            q, k = _rope(q, freqs_cis), _rope(k, freqs_cis)
        mask = key_padding_bnsd(attention_mask)
        text = hidden_states.shape[1] - self.shard.local_tokens
        out = self.shard.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), text, text_first=False,
                                   attend=lambda *qkv: attention_bnsd(*qkv, mask))
        return single_stream_out(attn, out, q.dtype)


def _install_hooks(model: torch.nn.Module, shard: SequenceShard) -> None:
    """The image stream split after its ``_prepare_sequence`` (tokens and RoPE rows) and the final
    layer's image tokens gathered (the forward's other calls to _prepare_sequence: captions)."""
    prepare = model._prepare_sequence

    def split_image_stream(feats, pos_ids, inner_pad_mask, pad_token, *args, **kwargs):
        out = prepare(feats, pos_ids, inner_pad_mask, pad_token, *args, **kwargs)
        if pad_token is not model.x_pad_token:
            return out
        tokens, freqs, *rest = out
        tokens = shard.split(tokens)
        return (tokens, freqs.narrow(1, shard.rank * shard.local_tokens, shard.local_tokens), *rest)

    model._prepare_sequence = split_image_stream

    def gather(module, inputs, out):
        local = shard.local_tokens
        return torch.cat([shard.gather(out[:, :local]), out[:, local:]], dim=1)

    for final in model.all_final_layer.values():
        final.register_forward_hook(gather)


def _image_attention(model: torch.nn.Module):
    """The noise refiner's and main layers' attention (the context refiner's is text-only)."""
    return [block.attention for block in (*model.noise_refiner, *model.layers)]


def zimage_plan() -> SequenceParallelPlan:
    from diffusers.models.transformers.transformer_z_image import ZSingleStreamAttnProcessor

    from fastvideo.models.zimage.npu import NpuZImageAttnProcessor

    return SequenceParallelPlan(split=None, gather=None, processor=ZImageSequenceParallelProcessor,
                                replaces=(ZSingleStreamAttnProcessor, NpuZImageAttnProcessor),
                                hooks=_install_hooks, attention_modules=_image_attention, heads_key="n_heads",
                                image_only=lambda model: [block.attention for block in model.noise_refiner])
