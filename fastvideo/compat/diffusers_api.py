"""Where diffusers keeps FLUX's building blocks, on each library line this project supports.

The recipe line (diffusers 0.32) and the current line (0.42) build the same FLUX transformer from
differently named pieces:

============================  =======================================  =================================
piece                         0.32                                     0.42
============================  =======================================  =================================
attention module              ``attention_processor.Attention``        ``transformer_flux.FluxAttention``
stock attention processor(s)  ``attention_processor.FluxAttnProcessor  ``transformer_flux.FluxAttnProcessor``
                              2_0`` and its ``_NPU`` twin              (what the deprecated ``*2_0`` names
                                                                       now return)
q/k RMS norms                 ``normalization.RMSNorm``                ``torch.nn.RMSNorm``
rotary embedding              ``embeddings.FluxPosEmbed``              ``transformer_flux.FluxPosEmbed``
============================  =======================================  =================================

Both RMS norm classes exist on both lines, so code that handles both needs no line check; the two
rows that do differ are answered here, and only here. The line is told by what diffusers defines
(``transformer_flux.FluxAttnProcessor`` exists on 0.42, not on 0.32), not by its version string.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class FluxBlocks:
    """The installed diffusers' FLUX classes that differ between the library lines."""

    pos_embed: type  # FLUX's rotary embedding module (no parameters)
    processors: tuple[type, ...]  # the stock processors of FLUX's joint and single attention


@functools.lru_cache(maxsize=None)
def flux_blocks() -> FluxBlocks:
    """:class:`FluxBlocks` of the installed diffusers (imported on first call)."""
    from diffusers.models.transformers import transformer_flux

    if hasattr(transformer_flux, "FluxAttnProcessor"):  # current line (0.42)
        return FluxBlocks(transformer_flux.FluxPosEmbed, (transformer_flux.FluxAttnProcessor,))
    from diffusers.models import attention_processor, embeddings  # recipe line (0.32)

    return FluxBlocks(
        embeddings.FluxPosEmbed,
        (attention_processor.FluxAttnProcessor2_0, attention_processor.FluxAttnProcessor2_0_NPU),
    )
