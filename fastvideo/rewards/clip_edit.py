"""An editing reward from the CLIP weights the clip reward already uses (--clip_dir; nothing new).

    score = keep * cos(image, source image) + (1 - keep) * cos(image, instruction)

cos of L2-normalised CLIP embeddings, in [-1, 1]: the first term keeps what the edit should leave
alone (the image's CLIP embedding stays near its source's), the second is CLIP score of the edit
instruction (the clip reward's). ``keep`` weighs them (keep=, default 0.5). It needs the
source images (an editing model family, e.g. --model_family kontext): called without them it
refuses in one line. A record of several reference images (FLUX.2 [klein]'s JSONL "image" list) is
scored against its first reference (the family's source_images).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from fastvideo.library_lines import projected_features
from fastvideo.rewards.base import ImageBatch, as_pils
from fastvideo.rewards.clip_score import DEFAULT_CLIP_DIR, HFClipReward


def edit_score(image_embeds: torch.Tensor, source_embeds: torch.Tensor, text_embeds: torch.Tensor,
               keep: float) -> torch.Tensor:
    """[B]: keep * cos(image, source) + (1 - keep) * cos(image, text) of [B, D] embeddings."""
    image, source, text = (F.normalize(e.float(), dim=-1) for e in (image_embeds, source_embeds, text_embeds))
    return keep * (image * source).sum(-1) + (1.0 - keep) * (image * text).sum(-1)


class ClipEditReward(HFClipReward):
    """CLIP similarity to the source image (what stays) blended with CLIP score of the instruction."""

    name = "clip_edit"
    uses_sources = True

    def __init__(self, clip_dir: str | Path = DEFAULT_CLIP_DIR, processor_dir: str | Path | None = None,
                 keep: float = 0.5, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 batch_size: int = 8) -> None:
        if not 0.0 <= keep <= 1.0:
            raise ValueError(f"clip_edit keep must be in [0, 1]; got {keep}")
        super().__init__(clip_dir, processor_dir, "CLIP", "clip_edit", device=device, dtype=dtype,
                         batch_size=batch_size)
        self.keep = float(keep)

    def _image_features(self, images: ImageBatch) -> torch.Tensor:
        pixels = self.processor(images=as_pils(images), return_tensors="pt")["pixel_values"]
        with self.autocast():
            return projected_features(self.model.get_image_features(pixel_values=pixels.to(self.device))).float()

    def _score(self, images: ImageBatch, prompts: Sequence[str], sources: torch.Tensor | None = None) -> torch.Tensor:
        text = self.processor(text=list(prompts), padding=True, truncation=True, max_length=self.max_length,
                              return_tensors="pt")
        with self.autocast():
            text_embeds = projected_features(self.model.get_text_features(
                input_ids=text["input_ids"].to(self.device), attention_mask=text["attention_mask"].to(self.device)))
        return edit_score(self._image_features(images), self._image_features(sources), text_embeds.float(), self.keep)
