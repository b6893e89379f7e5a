"""Editing prompt files: prompts that carry a source image.

A JSONL prompt file (``*.jsonl``) holds one record per line, ``{"prompt": "...", "image": "path"}``;
a relative ``image`` path resolves against the prompt file's own folder (not the working
directory), so a data folder can be moved whole. ``image`` may be left out of every record (a
text-to-image JSONL file) but not of some: a file mixes nothing.

Several reference images (multi-reference editing, FLUX.2 [klein]): ``"image"`` is a list of paths,
``{"prompt": "...", "image": ["a.png", "b.png"]}``, in the order the pipeline's ``image=[...]`` takes
them; every record gives the same number, and all images of a file share one size. A record's image
is then a tuple of paths; a list of one path is the plain string's single path (the same record).
The rewards and evaluation grids that show a source use the first reference.

``check_source_images`` is the check preprocessing runs before any model loads: every image
exists, opens as an image, and all share one size whose sides are multiples of ``multiple`` (the
family's latent packing: 16 for FLUX.1 Kontext). Each problem is one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch

from fastvideo.errors import UserError

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # valid JSON ("\\ud800"), but not text: no encoder takes it
JSONL_HINT = 'one JSON object a line: {"prompt": "...", "image": "path/to/source.png"}'


class SourceImageError(UserError, ValueError):
    """A prompt file's source image is missing, unreadable or of the wrong size."""


class FrameEnds(tuple):
    """A record's (first frame, last frame): its "image" and its "last_image" (image-to-video's first and
    last frame condition, WanImageToVideoPipeline's ``last_image``): two references to every check and
    loader (one size, [B, 2, 3, H, W] pixels, both digests), told apart from a list of references."""


def is_jsonl(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".jsonl"


def parse_jsonl(path: Path, text: str) -> tuple[list[tuple[str, Path | tuple[Path, ...] | None]], int]:
    """(prompt, resolved image path, tuple of reference paths or None) per non-blank line, and the
    number of blank lines. Relative image paths resolve against ``path``'s folder."""
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
        except RecursionError:  # values nested thousands deep: no record of ours
            raise SourceImageError(f"prompt file {str(path)!r} line {number} nests its values too deeply to be a "
                                   f"record: {JSONL_HINT}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise SourceImageError(f"prompt file {str(path)!r} line {number} has no \"prompt\" string: {JSONL_HINT}")
        names = _image_names(path, number, obj.get("image"))
        for field, values in (("prompt", [obj["prompt"]]), ("image", names)):
            if any(_LONE_SURROGATE.search(v) for v in values):
                raise SourceImageError(f"prompt file {str(path)!r} line {number}: the \"{field}\" string holds a lone "
                                       "UTF-16 surrogate escape (e.g. \\ud800), which is no character: fix or remove it")
        paths = tuple(resolve_image(path, n) for n in names)
        image = None if not paths else paths[0] if len(paths) == 1 else paths
        records.append((obj["prompt"], _with_last_image(path, number, obj.get("last_image"), image)))
    _check_same_images(path, records)
    return records, blank


def _with_last_image(path: Path, number: int, last, image):
    """The record's image, with its "last_image" (a path string beside one "image") as FrameEnds."""
    if last is None:
        return image
    if not isinstance(last, str) or not isinstance(image, Path) or _LONE_SURROGATE.search(last):
        raise SourceImageError(f"prompt file {str(path)!r} line {number}: \"last_image\" must be one path string "
                               "beside one \"image\" path (the clip's last frame)")
    return FrameEnds((image, resolve_image(path, last)))


def _image_names(path: Path, number: int, image) -> list[str]:
    """A record's "image" as a list of path strings: none, one (a string) or several (a non-empty list
    of strings, the references in order; a list of one is the string's single path)."""
    if image is None:
        return []
    names = image if isinstance(image, list) else [image]
    bad = [n for n in names if not isinstance(n, str)]
    if bad or not names:
        got = "an empty list" if not names else type(bad[0]).__name__
        got = f"a list holding {got}" if isinstance(image, list) and names else got
        raise SourceImageError(f"prompt file {str(path)!r} line {number}: \"image\" must be a path string, got {got} "
                               "(several references: a non-empty list of path strings)")
    return names


def _check_same_images(path: Path, records: list) -> None:
    """Every record names images, or none; and each the same number of references."""
    with_image = sum(1 for _, im in records if im is not None)
    if 0 < with_image < len(records):
        first = next(i for i, (_, im) in enumerate(records) if im is None)
        raise SourceImageError(f"prompt file {str(path)!r}: {with_image} of {len(records)} records name an image "
                               f"but record {first} does not: give every record an \"image\", or none")
    ends = [i for i, (_, im) in enumerate(records) if isinstance(im, FrameEnds)]
    if 0 < len(ends) < len(records):
        odd = next(i for i, (_, im) in enumerate(records) if not isinstance(im, FrameEnds))
        raise SourceImageError(f"prompt file {str(path)!r}: {len(ends)} of {len(records)} records name a \"last_image\" "
                               f"but record {odd} does not: give every record a \"last_image\", or none")
    counts = [reference_count(im) for _, im in records]
    if with_image and len(set(counts)) > 1:
        odd = next(i for i, c in enumerate(counts) if c != counts[0])
        raise SourceImageError(f"prompt file {str(path)!r}: record {odd} names {counts[odd]} reference images but "
                               f"record 0 names {counts[0]}: give every record the same number of images")


def references(image) -> tuple[Path, ...]:
    """A record's source images as a tuple: its one path, or its several references in order."""
    return tuple(image) if isinstance(image, tuple) else (image,)


def reference_count(image) -> int:
    return len(image) if isinstance(image, tuple) else 1


def resolve_image(prompt_file: Path, image: str) -> Path:
    """``image`` as written in ``prompt_file``: absolute as it is, relative to the file's folder."""
    p = Path(image).expanduser()
    return p if p.is_absolute() else Path(prompt_file).parent / p


# The largest source image read (its header is checked before any pixel is decoded): 4096^2, 16.8 MP.
# A source is encoded by the VAE at its own size (Kontext) or at --source_vae_size's area; larger
# files only cost memory (a 420 KB 12000x12000 PNG decodes to 432 MB, and grew preprocessing past 3 GB).
MAX_SOURCE_PIXELS = 4096 * 4096
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")  # grayscale PNG/TIFF at 16 bits
NO_RANGE = {"I": "32-bit integer", "F": "32-bit float"}  # no value range a decoder can know


def open_rgb(path: Path):
    """The image at ``path`` as an RGB PIL image, decoded as diffusers' ``load_image`` does (its
    EXIF orientation applied, then ``convert("RGB")``), except where that conversion is wrong: a
    16-bit grayscale image is scaled to 8 bits (round(v * 255 / 65535); PIL's conversion clips it
    to white) and a 32-bit integer or float image (which it turns black) is refused. A
    SourceImageError naming the file when it cannot be read, is too large or has such a mode."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        exists = path.is_file()
    except OSError as exc:  # a name or path too long for the file system, and the like
        raise SourceImageError(f"source image {str(path)[:200]!r} cannot be looked up: {exc.strerror}") from None
    if not exists:
        raise SourceImageError(f"source image {str(path)!r} does not exist (named in the prompt file; relative "
                               "paths resolve against the prompt file's folder)")
    try:
        with Image.open(path) as im:
            _check_header(path, im)
            im.load()
            return _to_rgb(path, ImageOps.exif_transpose(im))
    except Image.DecompressionBombError:  # PIL's own guard, at open: the header claims > 2 x MAX_IMAGE_PIXELS
        raise SourceImageError(f"source image {str(path)!r} claims more pixels than PIL decodes (over "
                               f"{2 * Image.MAX_IMAGE_PIXELS / 1e6:.0f} MP): resize it to the size you train with") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        if isinstance(exc, SourceImageError):
            raise
        raise SourceImageError(f"source image {str(path)!r} is not a readable image ({type(exc).__name__}): "
                               "re-save it as PNG or JPEG") from None


def _check_header(path: Path, im) -> None:
    """Size and mode from the file's header, before its pixels are decoded."""
    w, h = im.size
    if w * h > MAX_SOURCE_PIXELS:
        raise SourceImageError(f"source image {str(path)!r} is {w}x{h} ({w * h / 1e6:.1f} MP), over the "
                               f"{MAX_SOURCE_PIXELS / 1e6:.1f} MP a source may have: resize it to the size you "
                               "train with")
    if im.mode in NO_RANGE:
        raise SourceImageError(f"source image {str(path)!r} is a {NO_RANGE[im.mode]} image (mode {im.mode}), whose "
                               "value range no decoder can know: save it as an 8- or 16-bit PNG")


def _to_rgb(path: Path, im):
    import numpy as np
    from PIL import Image

    if im.mode in SIXTEEN_BIT:
        wide = np.asarray(im, dtype=np.uint32)
        return Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8), mode="L").convert("RGB")
    return im.convert("RGB")


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


def load_pixels(paths: list) -> torch.Tensor:
    """Source images -> float32 [B, 3, H, W] in [0, 1] (value / 255, like ToTensor); records of several
    references (tuples of paths, one count) -> [B, N, 3, H, W], the references in order."""
    import numpy as np

    if paths and isinstance(paths[0], tuple):
        return torch.stack([load_pixels(list(refs)) for refs in paths])
    arrays = [np.asarray(open_rgb(p), dtype=np.uint8) for p in paths]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float().div_(255.0)


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's SHA-256 (which image a stored record was made from)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
