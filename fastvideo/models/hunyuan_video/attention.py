"""Each sample's own attention mask in HunyuanVideoTransformer3DModel on the recipe line (diffusers 0.32).

diffusers 0.32's forward builds the mask [B, S, S] (S = video + text tokens; a sample's padded text
positions masked as keys and as queries) and its ``HunyuanVideoAttnProcessor2_0`` hands it as is to
``scaled_dot_product_attention`` on [B, H, S, D] tensors, which broadcasts it as [1, B, S, S]: head h
attends under sample h's mask (B = H), or the call fails to broadcast (1 < B != H). So a batch whose
prompts have different text lengths gets wrong velocities (every head of every sample must use that
sample's mask), and one of more samples than heads does not run. diffusers 0.42 builds a key mask
[B, 1, 1, S] per sample and needs nothing.

:func:`per_sample_masks` gives every dual- and single-stream attention of a 0.32 transformer the stock
processor, with the mask given its head axis ([B, 1, S, S]) when the samples' masks differ: one forward
for the batch, exact. Where the stock mask was right (one sample, or samples of one text length and as
many as heads) the stock call runs unchanged, so those results stay bit-identical (the head axis alone
changes SDPA's kernel: 3e-7 on the CPU); samples of one text length but not as many as heads (which did
not run) get that one mask [1, S, S]. Whether the masks differ is read once per forward (the first
attention's mask; every block gets the same tensor) and is a function of the mask alone, so gradient
checkpointing's recompute takes the same branch. Splitting the forward by sample would be exact too,
but would run B forwards where FSDP's ranks must all run the same number (each forward gathers the
weights): a rank with a mixed batch next to one without would hang.
The sequence-parallel plan (sequence_parallel.py) replaces this processor like the stock one (it is
one) and builds each sample's mask [B, 1, S, S] itself.
"""

from __future__ import annotations

import weakref
from functools import lru_cache

import torch

from fastvideo.library_lines import is_current


@lru_cache(maxsize=None)
def per_sample_processor() -> type:
    """diffusers' ``HunyuanVideoAttnProcessor2_0`` whose mask [B, S, S] gets a head axis (0.32)."""
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    class HunyuanVideoPerSampleMaskProcessor(HunyuanVideoAttnProcessor2_0):
        """The stock processor under each sample's own mask (one instance shared by every attention, which
        remembers whether the forward in flight's mask differs between samples)."""

        def __init__(self):
            super().__init__()
            self._seen, self._differ = None, False

        def _masks_differ(self, mask: torch.Tensor) -> bool:
            if self._seen is None or self._seen() is not mask:
                keys = mask[:, 0]  # the first (video) query's row: the key mask of each sample
                self._seen, self._differ = weakref.ref(mask), not bool((keys == keys[:1]).all())
            return self._differ

        def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states=None, attention_mask=None,
                     image_rotary_emb=None):
            mask = attention_mask
            if mask is not None and mask.ndim == 3 and mask.shape[0] > 1:
                if self._masks_differ(mask):
                    mask = mask.unsqueeze(1)  # [B, 1, S, S]: every head of a sample under its mask
                elif mask.shape[0] != attn.heads:
                    mask = mask[:1]  # one mask for all (the stock [B, S, S] does not broadcast)
            return super().__call__(attn, hidden_states, encoder_hidden_states, mask, image_rotary_emb)

    return HunyuanVideoPerSampleMaskProcessor


def per_sample_masks(transformer: torch.nn.Module) -> int:
    """On the recipe line: every attention holding the stock ``HunyuanVideoAttnProcessor2_0`` (the dual- and
    single-stream blocks; the token refiner's has its own class and a per-sample mask) gets
    :func:`per_sample_processor`'s. Returns how many (0 on the current line: nothing to fix)."""
    if is_current():
        return 0
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    processor, swapped = per_sample_processor()(), 0
    for module in transformer.modules():
        if type(getattr(module, "processor", None)) is HunyuanVideoAttnProcessor2_0:
            module.processor = processor
            swapped += 1
    return swapped
