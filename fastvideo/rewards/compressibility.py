"""JPEG compressibility reward (DDPO, Black et al. 2023): minus the JPEG size in kB.

Needs no weights, so it is the default reward of the CPU demo. Images are quantised to 8 bits
(round(x * 255)), encoded as JPEG at a fixed quality (default 95, as DDPO) and scored as
``-len(jpeg_bytes) / 1000``. Prompts are ignored. Flat images score higher than noisy ones.
"""

from __future__ import annotations

import io
from typing import Sequence

import torch

from fastvideo.rewards.base import BatchedReward, ImageBatch, as_pils


def jpeg_size_kb(image, quality: int) -> float:
    """Size in kB (1000 bytes) of one PIL image saved as JPEG at the given quality."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000.0


class JpegCompressibilityReward(BatchedReward):
    """``-JPEG size in kB`` per image; float32 ``[B]`` on CPU.

    Args:
        quality: JPEG quality 1..100 (DDPO uses 95; PIL advises against > 95).
        device, dtype: accepted for a uniform interface; encoding runs on CPU.
        batch_size: chunk size (only bounds host memory for the 8-bit copies).
    """

    name = "compressibility"

    def __init__(
        self,
        quality: int = 95,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 64,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        if not isinstance(quality, int) or not 1 <= quality <= 100:
            raise ValueError(f"JPEG quality must be an int in 1..100; got {quality!r}")
        self.quality = quality

    def _score(self, images: ImageBatch, prompts: Sequence[str]) -> torch.Tensor:
        return torch.tensor([-jpeg_size_kb(im, self.quality) for im in as_pils(images)])
