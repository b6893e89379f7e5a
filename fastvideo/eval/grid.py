"""A labelled comparison grid: one row per model, one column per prompt (image 0 of each, the
same noise down a column), the prompt printed above its column and each image's scores under it.
A video family's clips show as frame strips (fastvideo.video_io.frame_strip), with an MP4 beside
the grid (clip_grid_mp4).

Text is drawn with PIL's default font (a scalable one on Pillow >= 10.1 with FreeType, sized to
the cells; the fixed bitmap font before). Images narrower than MIN_CELL pixels are enlarged by a
whole factor (nearest neighbour), so a tiny model's 32x32 samples still leave room for a line of
text; the full prompts are also kept in the PNG's Description text chunk.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

MIN_CELL = 160  # pixels: the narrowest column
PAD = 4
MAX_CAPTION_LINES = 4


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()


def _text_width(draw, text: str, font) -> int:
    left, _, right, _ = draw.textbbox((0, 0), text, font=font)
    return right - left


def wrap(draw, text: str, font, width: int, max_lines: int = MAX_CAPTION_LINES) -> list[str]:
    """``text`` broken at spaces into lines at most ``width`` pixels wide (a word wider than that
    stands alone); past ``max_lines`` the last line ends with '...'."""
    lines: list[str] = []
    for word in text.split():
        if lines and _text_width(draw, f"{lines[-1]} {word}", font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    if len(lines) > max_lines:
        last = lines[max_lines - 1]
        while last and _text_width(draw, last + "...", font) > width:
            last = last[:-1]
        lines = lines[:max_lines - 1] + [last.rstrip() + "..."]
    return lines


def _cells(cells, scale: int) -> list:
    """uint8 [G, h, w, 3] (fastvideo.sampling.images.cells_uint8) -> G PIL images enlarged ``scale`` times."""
    from PIL import Image

    out = []
    for pixels in cells:
        im = Image.fromarray(pixels)
        out.append(im.resize((im.width * scale, im.height * scale), Image.NEAREST) if scale > 1 else im)
    return out


def labelled_grid(rows: list[tuple[str, torch.Tensor, list[list[str]]]], captions: list[str],
                  out_png: str | Path) -> Path:
    """rows: (model label, images [G, 3, H, W] in [0, 1] (a video family's clips [G, F, 3, H, W]:
    each cell their frame strip), per column the text lines under the image, e.g. its scores);
    captions: the G prompts, printed above their columns."""
    from PIL import Image, ImageDraw, PngImagePlugin

    from fastvideo.sampling.images import cells_uint8

    pixels = [cells_uint8(images) for _, images, _ in rows]  # [G, h, w, 3] each
    scale = max(1, math.ceil(MIN_CELL / rows[0][1].shape[-1]))  # from a frame's width
    cell_w, cell_h = max(p.shape[2] for p in pixels) * scale, max(p.shape[1] for p in pixels) * scale
    font = _font(max(11, cell_w // 18))
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_h = probe.textbbox((0, 0), "Hg", font=font)[3] + 3
    label_w = max(_text_width(probe, label, font) for label, _, _ in rows) + 2 * PAD
    wrapped = [wrap(probe, c, font, cell_w - 2 * PAD) for c in captions]
    header_h = max(map(len, wrapped), default=0) * line_h + 2 * PAD
    text_lines = max((len(t) for _, _, texts in rows for t in texts), default=0)
    row_h = cell_h + text_lines * line_h + 2 * PAD
    canvas = Image.new("RGB", (label_w + len(captions) * (cell_w + PAD), header_h + len(rows) * row_h), "white")
    draw = ImageDraw.Draw(canvas)
    for col, lines in enumerate(wrapped):
        x = label_w + col * (cell_w + PAD) + PAD
        for i, line in enumerate(lines):
            draw.text((x, PAD + i * line_h), line, fill="black", font=font)
    for r, (label, images, texts) in enumerate(rows):
        y = header_h + r * row_h
        draw.text((PAD, y + cell_h // 2 - line_h // 2), label, fill="black", font=font)
        for col, im in enumerate(_cells(pixels[r], scale)):
            x = label_w + col * (cell_w + PAD)
            canvas.paste(im, (x, y))
            for i, line in enumerate(texts[col] if col < len(texts) else []):
                draw.text((x + PAD, y + cell_h + PAD + i * line_h), line, fill="black", font=font)
    info = PngImagePlugin.PngInfo()
    info.add_text("Description", " | ".join(f"col {i}: {c}" for i, c in enumerate(captions)))
    out_png = Path(out_png)
    canvas.save(out_png, pnginfo=info)
    return out_png


def clip_grid_mp4(rows: list[torch.Tensor], out_mp4: str | Path, fps: float | None = None) -> Path | None:
    """The clip rows of a grid ([G, F, 3, H, W] each, F > 1; image rows such as editing's sources
    are left out) as one MP4: each row's clips side by side, the rows top to bottom, frame by
    frame. None when no row is a clip."""
    import numpy as np

    from fastvideo.sampling.images import as_images_or_clips
    from fastvideo.video_io import DEFAULT_FPS, tile_clips, write_mp4

    clips = [c for c, is_clip in map(as_images_or_clips, rows) if is_clip]
    if not clips:
        return None
    tiles = [tile_clips(c.detach().float().clamp(0, 1).cpu()) for c in clips]  # [F, H, G*W, 3] each
    return write_mp4(np.concatenate(tiles, axis=1), out_mp4, fps or DEFAULT_FPS)
