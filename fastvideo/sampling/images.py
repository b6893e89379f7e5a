"""Write rollout images and per-group grids (with each image's reward) as PNG files; clips as MP4.

Layout: OUT/images/step_{iteration:06d}/flux_{rank}_{idx}.png (idx = index within this rank's
iteration) and OUT/images/step_{iteration:06d}/group_{rank}_{group}.png (group = local group index).
A video family's samples [B, F, 3, H, W] with F > 1 are clips: clip_{rank}_{idx}.mp4 each
(fastvideo.video_io), and each grid cell is the clip's frame strip; F == 1 is an image as before.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

import torch

GRID_CAPTION_HEIGHT = 14  # pixels of text under each image (PIL's default bitmap font is ~11 px)
GRID_TITLE_LINE = 12


def step_dir(out_dir: str | Path, iteration: int) -> Path:
    return Path(out_dir) / "images" / f"step_{int(iteration):06d}"


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] float in [0, 1] (any device) -> CPU uint8 [B, H, W, 3]."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W], got {tuple(images.shape)}")
    return (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()


def as_images_or_clips(samples: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(samples, is_clip): [B, 3, H, W] images as they are; [B, F, 3, H, W] frames as clips when
    F > 1, as the images [B, 3, H, W] they are when F == 1."""
    if samples.ndim == 5 and samples.shape[2] == 3:
        return (samples[:, 0], False) if samples.shape[1] == 1 else (samples, True)
    return samples, False


def cells_uint8(samples: torch.Tensor):
    """uint8 [B, h, w, 3] numpy: images as they are (to_uint8), clips as their frame strips
    (fastvideo.video_io.frame_strip)."""
    samples, is_clip = as_images_or_clips(samples)
    if not is_clip:
        return to_uint8(samples).numpy()
    import numpy as np

    from fastvideo.video_io import frame_strip

    return np.stack([frame_strip(clip) for clip in samples.detach().float().clamp(0, 1).cpu()])


def save_images(images: torch.Tensor, out_dir: str | Path, iteration: int, rank: int = 0,
                fps: float | None = None) -> list[Path]:
    """Save [B, 3, H, W] images in [0, 1] as OUT/images/step_{iteration:06d}/flux_{rank}_{idx}.png;
    clips [B, F, 3, H, W] (F > 1) as clip_{rank}_{idx}.mp4 at ``fps`` (video_io.DEFAULT_FPS)."""
    from PIL import Image

    folder = step_dir(out_dir, iteration)
    folder.mkdir(parents=True, exist_ok=True)
    images, is_clip = as_images_or_clips(images)
    if is_clip:
        from fastvideo.video_io import DEFAULT_FPS, write_mp4

        return [write_mp4(clip, folder / f"clip_{rank}_{idx}.mp4", fps or DEFAULT_FPS)
                for idx, clip in enumerate(images.detach().float().clamp(0, 1).cpu())]
    paths = []
    for idx, arr in enumerate(to_uint8(images).numpy()):
        path = folder / f"flux_{rank}_{idx}.png"
        Image.fromarray(arr).save(path)
        paths.append(path)
    return paths


def _group_captions(captions: Sequence[str] | None, num_groups: int, num_generations: int) -> list[str]:
    if captions is None:
        return [""] * num_groups
    captions = list(captions)
    if len(captions) == num_groups:
        return captions
    if len(captions) == num_groups * num_generations:
        return captions[::num_generations]
    raise ValueError(
        f"captions must have one entry per group ({num_groups}) or per image ({num_groups * num_generations}), "
        f"got {len(captions)}"
    )


def save_group_grids(
    images: torch.Tensor,
    rewards: torch.Tensor | Sequence[float],
    num_generations: int,
    out_dir: str | Path,
    iteration: int,
    rank: int = 0,
    captions: Sequence[str] | None = None,
    columns: int | None = None,
) -> list[Path]:
    """One PNG per group of ``num_generations`` consecutive images, each captioned with its reward.

    images [B, 3, H, W] in [0, 1], group-major as rollout returns them (clips [B, F, 3, H, W]: each
    cell is the clip's frame strip); rewards [B]; captions one per group or one per image (the
    group's prompt is printed above the grid).
    Writes OUT/images/step_{iteration:06d}/group_{rank}_{g}.png and returns the paths.
    """
    from PIL import Image, ImageDraw

    pixels = cells_uint8(images)
    values = torch.as_tensor(rewards, dtype=torch.float32).detach().cpu().reshape(-1).tolist()
    b = pixels.shape[0]
    if num_generations < 1 or b % num_generations:
        raise ValueError(f"{b} images do not split into groups of num_generations={num_generations}")
    if len(values) != b:
        raise ValueError(f"{len(values)} rewards for {b} images")
    num_groups = b // num_generations
    titles = _group_captions(captions, num_groups, num_generations)
    h, w = pixels.shape[1:3]
    cols = columns or min(num_generations, 4)
    rows = -(-num_generations // cols)
    chars_per_line = max(8, (cols * w) // 6)  # the default font is about 6 px per character

    folder = step_dir(out_dir, iteration)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for g in range(num_groups):
        title_lines = textwrap.wrap(titles[g], chars_per_line)[:3] if titles[g] else []
        top = len(title_lines) * GRID_TITLE_LINE + (4 if title_lines else 0)
        cell_h = h + GRID_CAPTION_HEIGHT
        canvas = Image.new("RGB", (cols * w, top + rows * cell_h), "white")
        draw = ImageDraw.Draw(canvas)
        for i, line in enumerate(title_lines):
            draw.text((2, 2 + i * GRID_TITLE_LINE), line, fill="black")
        for k in range(num_generations):
            idx = g * num_generations + k
            x, y = (k % cols) * w, top + (k // cols) * cell_h
            canvas.paste(Image.fromarray(pixels[idx]), (x, y))
            draw.text((x + 2, y + h + 1), f"#{k} r={values[idx]:.4f}", fill="black")
        path = folder / f"group_{rank}_{g}.png"
        canvas.save(path)
        paths.append(path)
    return paths
