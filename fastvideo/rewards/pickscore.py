"""PickScore reward (Kirstain et al. 2023) with transformers, on any device.

PickScore_v1 is a CLIP ViT-H-14 fine-tuned on Pick-a-Pic preferences. Its published scoring code
computes ``logit_scale.exp() * <normalised text embedding, normalised image embedding>``; we do
the same, so scores are on PickScore's usual scale (about 18-24 for real images; logit_scale.exp()
is about 100). Some DanceGRPO versions omit the logit scale (scores 100x smaller); the ranking
inside a group, and so the GRPO advantages, do not change with that constant factor.

Unlike upstream DanceGRPO, which scored every image of a batch against the FIRST prompt, image i
is scored against prompt i.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fastvideo.rewards.clip_score import HFClipReward
from fastvideo.rewards.weights import default_folder

# yuvalkirstain/PickScore_v1 (model) and laion/CLIP-ViT-H-14-laion2B-s32B-b79K's processor, in one
# folder (fastvideo/rewards/weights.py).
DEFAULT_PICKSCORE_DIR = default_folder("pickscore")


class PickScoreReward(HFClipReward):
    """PickScore per (image, its own prompt); float32 ``[B]`` on CPU.

    Args:
        pickscore_dir: CLIPModel folder of PickScore_v1 (save_pretrained layout).
        processor_dir: CLIPProcessor folder (upstream uses laion/CLIP-ViT-H-14-laion2B-s32B-b79K's
            processor); defaults to pickscore_dir.
        device, dtype, batch_size: see BatchedReward.
    """

    name = "pickscore"
    use_logit_scale = True

    def __init__(
        self,
        pickscore_dir: str | Path = DEFAULT_PICKSCORE_DIR,
        processor_dir: str | Path | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        batch_size: int = 8,
    ) -> None:
        super().__init__(
            pickscore_dir, processor_dir, "PickScore", "pickscore",
            device=device, dtype=dtype, batch_size=batch_size,
        )
