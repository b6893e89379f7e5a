"""Editing prompt files: prompts that carry a source image.

A JSONL prompt file (``*.jsonl``) holds one record per line, ``{"prompt": "...", "image": "path"}``;
a relative ``image`` path resolves against the prompt file's own folder (not the working
directory), so a data folder can be moved whole. ``image`` may be left out of every record (a
text-to-image JSONL file) but not of some: a file mixes nothing.

``check_source_images`` is the check preprocessing runs before any model loads: every image
exists, opens as an image, and all share one size whose sides are multiples of ``multiple`` (the
family's latent packing: 16 for FLUX.1 Kontext). Each problem is one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from fastvideo.errors import UserError

JSONL_HINT = 'one JSON object a line: {"prompt": "...", "image": "path/to/source.png"}'


class SourceImageError(UserError, ValueError):
    """A prompt file's source image is missing, unreadable or of the wrong size."""


def is_jsonl(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".jsonl"


def parse_jsonl(path: Path, text: str) -> tuple[list[tuple[str, Path | None]], int]:
    """(prompt, resolved image path or None) per non-blank line, and the number of blank lines.
    Relative image paths resolve against ``path``'s folder."""
    records, blank = [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            blank += 1
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise SourceImageError(f"prompt file {str(path)!r} line {number} is not JSON ({exc.msg}): {JSONL_HINT}") \
                from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise SourceImageError(f"prompt file {str(path)!r} line {number} has no \"prompt\" string: {JSONL_HINT}")
        image = obj.get("image")
        if image is not None and not isinstance(image, str):
            raise SourceImageError(f"prompt file {str(path)!r} line {number}: \"image\" must be a path string, "
                                   f"got {type(image).__name__}")
        records.append((obj["prompt"], None if image is None else resolve_image(path, image)))
    with_image = sum(1 for _, im in records if im is not None)
    if 0 < with_image < len(records):
        first = next(i for i, (_, im) in enumerate(records) if im is None)
        raise SourceImageError(f"prompt file {str(path)!r}: {with_image} of {len(records)} records name an image "
                               f"but record {first} does not: give every record an \"image\", or none")
    return records, blank


def resolve_image(prompt_file: Path, image: str) -> Path:
    """``image`` as written in ``prompt_file``: absolute as it is, relative to the file's folder."""
    p = Path(image).expanduser()
    return p if p.is_absolute() else Path(prompt_file).parent / p


def open_rgb(path: Path):
    """The image at ``path`` as an RGB PIL image; SourceImageError naming it when it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise SourceImageError(f"source image {str(path)!r} does not exist (named in the prompt file; relative "
                               "paths resolve against the prompt file's folder)")
    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise SourceImageError(f"source image {str(path)!r} is not a readable image ({type(exc).__name__}): "
                               "re-save it as PNG or JPEG") from None


def check_source_images(paths: list[Path], multiple: int) -> tuple[int, int]:
    """Every image readable and of one size (height, width), both multiples of ``multiple``;
    returns that size. Raises SourceImageError naming the first bad file."""
    size = None
    for path in paths:
        im = open_rgb(path)
        w, h = im.size
        if h % multiple or w % multiple:
            raise SourceImageError(f"source image {str(path)!r} is {w}x{h}: both sides must be multiples of "
                                   f"{multiple}; resize or crop it")
        if size is not None and (h, w) != size:
            raise SourceImageError(f"source image {str(path)!r} is {w}x{h} but the first source image is "
                                   f"{size[1]}x{size[0]}: give every source image one size")
        size = (h, w)
    if size is None:
        raise SourceImageError("no source image to check")
    return size


def load_pixels(paths: list[Path]) -> torch.Tensor:
    """Source images -> float32 [B, 3, H, W] in [0, 1] (value / 255, like ToTensor)."""
    import numpy as np

    arrays = [np.asarray(open_rgb(p), dtype=np.uint8) for p in paths]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float().div_(255.0)


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's SHA-256 (which image a stored record was made from)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
