"""Preprocessing of editing prompt files: the source images a family encodes beside the text.

The check (``check_prompt_sources``) runs in PreprocessConfig.validate, before torch.distributed or
any model loads: an editing family (``family.edits``) needs a JSONL prompt file whose records name
images, a text-to-image family refuses one, and every image (the spare batch mates' too) must be
readable and of one size that fits the family (fastvideo.data.sources). Each problem is one line.
"""

from __future__ import annotations

from pathlib import Path

from fastvideo.data.prompts import PromptList, load_prompts
from fastvideo.data.sources import (MAX_SOURCE_PIXELS, FrameEnds, check_source_images, file_digest, load_pixels,
                                    reference_count, references)
from fastvideo.errors import ConfigError

SOURCE_VAE_MULTIPLE = 32  # calculate_dimensions' rounding of the resized source's sides


def source_size(text: str) -> tuple[int, int]:
    """--source_vae_size's 'SIDE' or 'HEIGHT,WIDTH' -> (height, width); argparse reports anything else in
    one line."""
    import argparse

    try:
        sides = tuple(int(p) for p in text.split(","))
    except ValueError:
        sides = ()
    if len(sides) not in (1, 2):
        raise argparse.ArgumentTypeError(f"expected SIDE or HEIGHT,WIDTH in pixels (e.g. 384 or 384,384), got {text!r}")
    return (sides[0], sides[-1])


def source_vae_family(name: str, size: tuple[int, int] | None):
    """The family ``name``, with --source_vae_size's area H*W as its vae_area when ``size`` is given;
    ConfigError (one line) for a family that resizes no source or sides not positive multiples of 32."""
    from fastvideo.models.registry import get_model_family

    if size is None:
        return get_model_family(name)
    if size[0] * size[1] > MAX_SOURCE_PIXELS:
        raise ConfigError(f"--source_vae_size {size[0]},{size[1]}: {size[0] * size[1] / 1e6:.1f} MP, over the "
                          f"{MAX_SOURCE_PIXELS / 1e6:.1f} MP a source may have (4096x4096)")
    if get_model_family(name).vae_area is None:
        raise ConfigError(f"--source_vae_size: model family {name!r} encodes each source image at its own size (it "
                          "resizes none): leave the flag out")
    if any(side < SOURCE_VAE_MULTIPLE or side % SOURCE_VAE_MULTIPLE for side in size):
        raise ConfigError(f"--source_vae_size {size[0]},{size[1]}: each side must be a positive multiple of "
                          f"{SOURCE_VAE_MULTIPLE} (the pipeline rounds the resized source's sides to it), e.g. 384 "
                          "(Flow-Factory's) or 1024 (the pipeline's)")
    return get_model_family(name, vae_area=size[0] * size[1])


def with_frames(family, num_frames: int | None):
    """``family`` making clips of --num_frames (``set_num_frames``: a video family's check, ConfigError in
    one line); ConfigError for a family whose stored records do not depend on the clip's length."""
    if num_frames is None:
        return family
    if not (family.edits and hasattr(family, "set_num_frames")):
        raise ConfigError(f"--num_frames: model family {family.name!r} stores nothing that depends on the clip's "
                          "length (only image-to-video does: --model_family wan_i2v): leave the flag out")
    family.set_num_frames(num_frames)
    return family


def check_prompt_sources(prompt_file: str, max_prompts: int, family) -> tuple[int, int] | None:
    """The source images' (height, width) for an editing family, None for a text-to-image one."""
    plist = load_prompts(prompt_file, max_prompts)
    if family.edits and plist.images is None:
        use = getattr(family, "source_use", "edits images")
        raise ConfigError(f"model family {family.name!r} {use} but prompt file {prompt_file!r} names no "
                          'source image: pass a .jsonl file of {"prompt": ..., "image": ...} records')
    if not family.edits and plist.images is not None:
        raise ConfigError(f"prompt file {prompt_file!r} names source images but model family {family.name!r} "
                          "generates from text alone: choose an editing family (--model_family kontext) or a "
                          "prompt file without images")
    if plist.images is None:
        return None
    count = reference_count(plist.images[0])  # one for every record (fastvideo.data.sources)
    if isinstance(plist.images[0], FrameEnds):  # {"image": first, "last_image": last}
        if not getattr(family, "takes_last_image", False):
            raise ConfigError(f"prompt file {prompt_file!r} gives a \"last_image\" a record but model family "
                              f"{family.name!r} takes no last frame (image-to-video does: --model_family wan_i2v): "
                              "remove the \"last_image\" keys")
        count = 1
    if count > family.max_references:
        raise ConfigError(f"prompt file {prompt_file!r} gives {count} reference images a record but model family "
                          f"{family.name!r} reads at most {family.max_references}: give one \"image\" path a record "
                          "(several references: --model_family flux2_edit)")
    size = check_source_images(all_images(plist), family.source_multiple)
    family.check_source_size(*size)
    return size


def record_images(plist: PromptList) -> list:
    """Each record's image (a path, or a tuple of references), the prompts' then the spare batch mates'
    beyond --max_prompts (encoded too): what add_sources indexes."""
    return list(plist.images or []) + list(plist.spare_images or [])


def all_images(plist: PromptList) -> list[Path]:
    """Every image file of record_images, each reference of a record (what the check reads)."""
    return [p for image in record_images(plist) for p in references(image)]


def record_keys(plist: PromptList) -> list[str]:
    """What identifies each prompt's stored record: its caption, and for an editing file the
    digest of its source image's bytes too (a changed image is re-encoded on a rerun; several
    references: their digests in order)."""
    if plist.images is None:
        return list(plist.prompts)
    digests = [",".join(file_digest(p) for p in references(im)) for im in plist.images]
    return [f"{c}\0image:{d}" for c, d in zip(plist.prompts, digests)]


def add_sources(family, encoders, cond, images: list[Path] | None, indices: list[int]):
    """``cond`` of the prompts ``indices`` with their source images encoded (unchanged for a
    text-to-image family); records of several references give pixels [B, N, 3, H, W]."""
    if images is None:
        return cond
    return family.encode_sources(encoders, cond, load_pixels([images[i] for i in indices]))
