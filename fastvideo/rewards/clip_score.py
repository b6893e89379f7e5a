"""CLIP score reward with a transformers CLIPModel from a local folder.

Score = cosine similarity of the L2-normalised image and text embeddings, in [-1, 1] (no x100
and no clamp at 0; torchmetrics' CLIPScore is ``100 * max(score, 0)``). Image i is scored
against prompt i.

The same scorer, multiplied by ``logit_scale.exp()``, is PickScore (see pickscore.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from fastvideo.rewards.base import BatchedReward, ImageBatch, as_pils
from fastvideo.errors import MissingInputError
from fastvideo.library_lines import projected_features

from fastvideo.rewards.weights import default_folder, where_to_get

DEFAULT_CLIP_DIR = default_folder("clip")
# What save_pretrained writes for a CLIPModel and a CLIPProcessor.
MODEL_FILES = "config.json + model.safetensors (or pytorch_model.bin)"
PROCESSOR_FILES = "preprocessor_config.json + tokenizer files (vocab.json, merges.txt)"


def check_hf_folder(folder: str | Path, what: str, files: str, reward: str) -> Path:
    """A local save_pretrained folder, or an error naming the files and where to get them (the
    ``reward``'s rows of fastvideo.rewards.weights)."""
    path = Path(folder)
    if not path.is_dir():
        raise MissingInputError(
            f"{what} folder {str(path)!r} does not exist. It must hold {files} as written by "
            f"save_pretrained: {where_to_get(reward, str(path))}."
        )
    needed = "preprocessor_config.json" if "preprocessor" in files else "config.json"
    if not (path / needed).is_file():
        raise MissingInputError(
            f"{what} folder {str(path)!r} has no {needed}; it must hold {files}: {where_to_get(reward, str(path))}."
        )
    return path


class HFClipReward(BatchedReward):
    """<normalised image embedding, normalised text embedding> per (image, its own prompt),
    optionally times ``logit_scale.exp()``.

    Images of either input form go through the CLIPProcessor as 8-bit PIL images, as the
    published PickScore / CLIP scoring code feeds them.
    """

    name = "hf_clip"
    use_logit_scale = False

    def __init__(
        self,
        model_dir: str | Path,
        processor_dir: str | Path | None,
        what: str,
        reward: str,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 8,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        from transformers import CLIPModel, CLIPProcessor

        model_dir = check_hf_folder(model_dir, what, MODEL_FILES, reward)
        processor_dir = check_hf_folder(
            processor_dir if processor_dir is not None else model_dir,
            f"{what} processor",
            PROCESSOR_FILES,
            reward,
        )
        self.model = CLIPModel.from_pretrained(model_dir, local_files_only=True)
        self.model = self.model.eval().requires_grad_(False).to(self.device)
        self.processor = CLIPProcessor.from_pretrained(processor_dir, local_files_only=True)
        self.max_length = min(77, int(self.model.config.text_config.max_position_embeddings))

    def _score(self, images: ImageBatch, prompts: Sequence[str]) -> torch.Tensor:
        pixels = self.processor(images=as_pils(images), return_tensors="pt")["pixel_values"]
        text = self.processor(
            text=list(prompts),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        with self.autocast():
            image_embeds = self.model.get_image_features(pixel_values=pixels.to(self.device))
            text_embeds = self.model.get_text_features(
                input_ids=text["input_ids"].to(self.device),
                attention_mask=text["attention_mask"].to(self.device),
            )
        image_embeds = F.normalize(projected_features(image_embeds).float(), dim=-1)
        text_embeds = F.normalize(projected_features(text_embeds).float(), dim=-1)
        scores = (image_embeds * text_embeds).sum(dim=-1)
        if self.use_logit_scale:
            scores = scores * self.model.logit_scale.detach().float().exp()
        return scores


class ClipScoreReward(HFClipReward):
    """CLIP score: cosine similarity in [-1, 1] per (image, its own prompt).

    Args:
        clip_dir: CLIPModel folder (e.g. openai/clip-vit-large-patch14 saved locally).
        processor_dir: CLIPProcessor folder; defaults to clip_dir.
        device, dtype, batch_size: see BatchedReward.
    """

    name = "clip"
    use_logit_scale = False

    def __init__(
        self,
        clip_dir: str | Path = DEFAULT_CLIP_DIR,
        processor_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 8,
    ) -> None:
        super().__init__(
            clip_dir, processor_dir, "CLIP", "clip",
            device=device, dtype=dtype, batch_size=batch_size,
        )
