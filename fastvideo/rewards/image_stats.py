"""Image-statistics rewards that need no weights: detail (high-frequency energy) and saturation.

They are guards against reward hacking more than training targets: a run trained on JPEG
compressibility (or over-optimised on a preference model) drifts towards flat, smooth or
over-saturated images, and these statistics move with that drift. Prompts are ignored.

- ``detail``: mean absolute 4-neighbour Laplacian of the luminance Y = 0.299 R + 0.587 G + 0.114 B
  over interior pixels, on images in [0, 1]. 0 for a flat image; 4 for a one-pixel black/white
  checkerboard (the largest possible value).
- ``saturation``: mean HSV saturation (max - min) / max per pixel (0 where max = 0), in [0, 1].
"""

from __future__ import annotations

from typing import Sequence

import torch

from fastvideo.rewards.base import BatchedReward, ImageBatch, as_tensor_list

LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601, as PIL's convert("L")


def luminance(image: torch.Tensor) -> torch.Tensor:
    """[3, H, W] in [0, 1] -> [H, W] float32 luma."""
    w = torch.tensor(LUMA, dtype=torch.float32).view(3, 1, 1)
    return (image.float() * w).sum(dim=0)


def laplacian_energy(image: torch.Tensor) -> float:
    """Mean |4 Y[i,j] - Y[i-1,j] - Y[i+1,j] - Y[i,j-1] - Y[i,j+1]| over interior pixels of a
    [3, H, W] image in [0, 1]; needs H, W >= 3."""
    if image.shape[-1] < 3 or image.shape[-2] < 3:
        raise ValueError(f"the detail reward needs images of at least 3x3 pixels, got {tuple(image.shape)}")
    y = luminance(image)
    lap = 4 * y[1:-1, 1:-1] - y[:-2, 1:-1] - y[2:, 1:-1] - y[1:-1, :-2] - y[1:-1, 2:]
    return float(lap.abs().mean())


def mean_saturation(image: torch.Tensor) -> float:
    """Mean HSV saturation of a [3, H, W] image in [0, 1]."""
    x = image.float()
    hi, lo = x.max(dim=0).values, x.min(dim=0).values
    sat = torch.where(hi > 0, (hi - lo) / hi.clamp_min(1e-12), torch.zeros_like(hi))
    return float(sat.mean())


class _ImageStatReward(BatchedReward):
    """A reward that is one statistic of each image alone (``stat``: a [3, H, W] tensor -> float);
    float32 [B] on CPU, 64 images a chunk by default (no model: chunks only bound the memory)."""

    def __init__(self, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 batch_size: int = 64) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)

    @staticmethod
    def stat(image: torch.Tensor) -> float:
        raise NotImplementedError

    def _score(self, images: ImageBatch, prompts: Sequence[str]) -> torch.Tensor:
        return torch.tensor([self.stat(im) for im in as_tensor_list(images)], dtype=torch.float32)


class DetailReward(_ImageStatReward):
    """High-frequency energy (mean |Laplacian| of luma); float32 [B] on CPU. Higher = more detail."""

    name = "detail"
    stat = staticmethod(laplacian_energy)


class SaturationReward(_ImageStatReward):
    """Mean HSV saturation in [0, 1]; float32 [B] on CPU."""

    name = "saturation"
    stat = staticmethod(mean_saturation)
