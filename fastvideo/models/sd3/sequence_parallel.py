"""SD3 / SD3.5's sequence-parallel plan (fastvideo.distributed.sequence_parallel): the patch tokens
(absolute positions already added by ``pos_embed``) are split after ``pos_embed`` and gathered
after ``proj_out`` (the unpatchify that follows reads the input's height and width); every joint
and dual (image-only) attention runs through :class:`SD3SequenceParallelProcessor`."""

from __future__ import annotations

from fastvideo.distributed.sequence_parallel import SequenceParallelPlan, SequenceShard
from fastvideo.models.npu_ops import attention_bnsd, joint_qkv


class SD3SequenceParallelProcessor:
    """diffusers' ``JointAttnProcessor2_0`` (image tokens first, then the text's; the text output
    projected unless the block is context_pre_only) with the attention across the sequence group."""

    def __init__(self, shard: SequenceShard):
        self.shard = shard

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        """hidden_states [B, L/N, C], encoder_hidden_states [B, S_text, C] or None (a dual block's
        image-only attention). Returns [B, L/N, C] (and [B, S_text, C])."""
        if attention_mask is not None:
            raise ValueError("SD3 sequence parallelism takes no attention mask")
        q, k, v, text = joint_qkv(attn, hidden_states, encoder_hidden_states, text_first=False)
        out = self.shard.attention(q, k, v, text, text_first=False, attend=attention_bnsd)
        out = out.transpose(1, 2).flatten(2).to(q.dtype)  # [B, S, H*D]
        image, context = out[:, :hidden_states.shape[1]], out[:, hidden_states.shape[1]:]
        image = attn.to_out[1](attn.to_out[0](image))  # linear, dropout
        if encoder_hidden_states is None:
            return image
        if not attn.context_pre_only:
            context = attn.to_add_out(context)
        return image, context


def _image_only(model):
    """SD3.5's attn2: self-attention over the image tokens (no context projections)."""
    return [m for m in model.modules() if hasattr(m, "processor") and getattr(m, "add_q_proj", None) is None]


def sd3_plan() -> SequenceParallelPlan:
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    return SequenceParallelPlan(split="pos_embed", gather="proj_out", processor=SD3SequenceParallelProcessor,
                                replaces=(JointAttnProcessor2_0,), image_only=_image_only)
