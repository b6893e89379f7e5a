"""FLUX.1's sequence-parallel plan (fastvideo.distributed.sequence_parallel): its packed image tokens
are split after ``x_embedder``, the RoPE tables of ``pos_embed`` (text rows, then image rows) follow
the split, the tokens are gathered after ``proj_out``, and the double- and single-stream blocks
attend through :class:`FluxSequenceParallelProcessor`. Both library lines: the processor is the
project's own FLUX processor (npu_ops.NpuFluxAttnProcessor, the stock maths on either line)."""

from __future__ import annotations

from fastvideo.distributed.sequence_parallel import SequenceParallelPlan, SequenceShard
from fastvideo.library_lines import flux_blocks
from fastvideo.models.npu_ops import NpuFluxAttnProcessor, attention_bnsd


class FluxSequenceParallelProcessor(NpuFluxAttnProcessor):
    """The FLUX processor whose attention runs across the sequence group. q / k / v hold the text
    tokens (replicated) first, then this rank's image tokens, in joint and single blocks alike."""

    def __init__(self, shard: SequenceShard):
        self.shard = shard

    def _attend(self, q, k, v, attention_mask):
        if attention_mask is not None:
            raise ValueError("FLUX sequence parallelism takes no attention mask")
        text = q.shape[2] - self.shard.local_tokens
        return self.shard.attention(q, k, v, text, text_first=True, attend=attention_bnsd)


def flux_plan(pos_embed: str = "pos_embed") -> SequenceParallelPlan:
    return SequenceParallelPlan(split="x_embedder", gather="proj_out", rope=pos_embed,
                                processor=FluxSequenceParallelProcessor,
                                replaces=(*flux_blocks().processors, NpuFluxAttnProcessor))
