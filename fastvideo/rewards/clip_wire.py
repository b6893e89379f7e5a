"""Clips over the wire: the request body a served clip reward (``takes_clips``, rewards/video.py)
receives, and the reply's per-clip failures.

A clip request is the image format's frame (rewards/wire.py: a little-endian uint32 header length,
a UTF-8 JSON header, the payload) with a ``"clips"`` record in place of ``"images"``::

    {"prompts": [B strings], "encoding": "u8" | "f32", "clips": {"shape": [B, F, 3, H, W]}}

followed by the B clips' frames, C order: ``u8`` one byte per value (the 8-bit frames, value
round(x * 255) as diffusers' numpy_to_pil rounds; 4x smaller than f32, the default for clips: an
81-frame 480x832 clip is 97 MB as u8), ``f32`` float32 in [0, 1] (exact: remote scores equal
in-process ones bit for bit). The clips of one request share one shape (a rollout's do).

Limits, checked from the header before anything is decoded (:class:`wire.WireTooLargeError`, 413):
clips per request (the server's ``--max_images``), pixels per frame (``--max_pixels``) and frames x
pixels of the whole request (``--max_clip_pixels``: F * H * W summed over its clips).

The reply is the image reply, ``{"scores": [B numbers or null]}``; a clip the reward could not
score (it raised on that clip alone) is null, listed under ``"failed"`` with its reason under
``"errors"`` (same order): the trainer drops it (NaN, rewards/combine.py), it is never scored 0.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from fastvideo.rewards.wire import WireFormatError, WireTooLargeError, read_header

CLIP_ENCODINGS = ("u8", "f32")


@dataclass(frozen=True)
class ParsedClips:
    """A clip request checked down to its size, before any frame is decoded."""

    encoding: str
    prompts: list[str]
    shape: tuple[int, int, int, int, int]  # [B, F, 3, H, W]
    offset: int  # where the frames start in the body

    @property
    def pixels(self) -> int:
        """Frames x pixels of the request (F * H * W summed over its B clips): what decoding holds."""
        b, f, _, h, w = self.shape
        return b * f * h * w


def clips_to_uint8(clips: torch.Tensor) -> torch.Tensor:
    """Float clips [B, F, 3, H, W] in [0, 1] -> uint8, rounded as rewards.base.tensor_to_uint8."""
    return clips.detach().float().clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8)


def encode_clip_request(clips: torch.Tensor, prompts: Sequence[str], encoding: str = "u8") -> bytes:
    """One scoring request for B float clips [B, F, 3, H, W] in [0, 1] and their B prompts."""
    if encoding not in CLIP_ENCODINGS:
        raise ValueError(f"clips travel as one of {CLIP_ENCODINGS}; got {encoding!r}")
    if encoding == "u8":
        payload = clips_to_uint8(clips).cpu().contiguous().numpy().tobytes()
    else:
        payload = clips.detach().float().cpu().contiguous().numpy().astype("<f4", copy=False).tobytes()
    head = json.dumps({"prompts": list(prompts), "encoding": encoding,
                       "clips": {"shape": list(clips.shape)}}).encode("utf-8")
    return b"".join([struct.pack("<I", len(head)), head, payload])


def is_clip_request(body: bytes) -> bool:
    """Whether a body's header holds ``"clips"`` (WireFormatError for a body without a readable header)."""
    return "clips" in read_header(body)[0]


def parse_clip_request(body: bytes, max_pixels: int | None = None, max_clips: int | None = None,
                       max_clip_pixels: int | None = None) -> ParsedClips:
    """Check a clip body against the format and the limits (None: no limit) without decoding it."""
    header, offset = read_header(body)
    encoding, prompts, record = header.get("encoding"), header.get("prompts"), header.get("clips")
    if not isinstance(encoding, str) or encoding not in CLIP_ENCODINGS:
        raise WireFormatError(f"clip encoding must be one of {CLIP_ENCODINGS}; got {encoding!r:.50}")
    if not (isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)):
        raise WireFormatError("header prompts must be a list of strings")
    shape = record.get("shape") if isinstance(record, dict) else None
    if not (isinstance(shape, list) and len(shape) == 5 and all(type(d) is int and d > 0 for d in shape)
            and shape[2] == 3):
        raise WireFormatError(f'header "clips" must be {{"shape": [B, F, 3, H, W]}} of positive ints; '
                              f"got {record!r:.100}")
    b, f, _, h, w = shape
    if b != len(prompts):
        raise WireFormatError(f"{b} clips but {len(prompts)} prompts; send one prompt per clip")
    if max_clips is not None and b > max_clips:
        raise WireTooLargeError(f"{b} clips in one request; this server takes at most {max_clips} (--max_images)")
    if max_pixels is not None and h * w > max_pixels:
        raise WireTooLargeError(f"frames of {w}x{h} pixels are over this server's limit of {max_pixels} "
                                f"pixels (--max_pixels)")
    parsed = ParsedClips(encoding, prompts, (b, f, 3, h, w), offset)
    if max_clip_pixels is not None and parsed.pixels > max_clip_pixels:
        raise WireTooLargeError(
            f"{b} clip(s) of {f} frames of {w}x{h} are {parsed.pixels} frame pixels, over this server's limit of "
            f"{max_clip_pixels} per request (--max_clip_pixels); send fewer clips per request "
            f"(--reward_batch_size), fewer frames or smaller ones")
    # math.prod of Python ints: a shape cannot overflow into a small byte count
    want = math.prod(shape) * (1 if encoding == "u8" else 4)
    if len(body) - offset != want:
        raise WireFormatError(f"{encoding} clips of shape {shape} need {want} bytes; the body has {len(body) - offset}")
    return parsed


def decode_clips(body: bytes, parsed: ParsedClips) -> torch.Tensor:
    """A parsed body's clips as float32 [B, F, 3, H, W] in [0, 1] (u8: the 8-bit values / 255)."""
    count = math.prod(parsed.shape)
    if parsed.encoding == "u8":
        arr = np.frombuffer(body, dtype=np.uint8, count=count, offset=parsed.offset)
        return torch.from_numpy(arr.reshape(parsed.shape).astype(np.float32) / np.float32(255.0))
    arr = np.frombuffer(body, dtype="<f4", count=count, offset=parsed.offset)
    return torch.from_numpy(arr.reshape(parsed.shape).astype(np.float32))
