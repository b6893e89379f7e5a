"""The reward server's request format: a batch of images and prompts as one binary body.

    body = uint32 little-endian N | N bytes of UTF-8 JSON header | image payloads, concatenated

header = {"prompts": [B strings], "encoding": "f32" | "u8" | "png",
          "images": [{"shape": [...], "nbytes": n}, ...]}

- ``f32``: each image float32 ``[3, H, W]`` in [0, 1], little-endian; the server rebuilds the
  exact tensor batch, so remote scores equal in-process scores bit for bit. The default for
  tensor batches (what the trainer sends).
- ``u8``: each image uint8 ``[H, W, 3]`` (8-bit RGB, as a saved PNG holds it): 4x smaller; the
  server scores PIL images. Exact for PIL inputs; a float tensor is rounded to 8 bits first.
- ``png``: each image a PNG file (lossless 8-bit, smallest on the wire, costs encode time).

The reply is JSON ``{"scores": [B floats]}``; a float32 score survives the JSON round trip
exactly (float32 -> Python float -> float32). A non-finite score travels as ``null`` and the
reply then also holds ``"nonfinite": [indices]`` (JSON has no NaN).

:func:`parse_request` checks every field before it allocates anything: a malformed body raises
:class:`WireFormatError` (the server answers 400), one over the server's limits (images per
request, pixels per image and per request, read from a PNG's header before it is decoded) raises
:class:`WireTooLargeError` (413). Its :class:`ParsedRequest` says how many pixels decoding will
hold, so the server can wait for room before :func:`decode_parsed` allocates them.
"""

from __future__ import annotations

import io
import json
import math
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from fastvideo.rewards.base import ImageBatch, RewardInputError, check_inputs, tensor_to_uint8

ENCODINGS = ("f32", "u8", "png")
MAX_HEADER_BYTES = 16 << 20


class WireFormatError(ValueError):
    """A request body that does not follow the format above."""


class WireTooLargeError(WireFormatError):
    """A well-formed request over a limit (image count, pixels per image)."""


def _check_pixels(height: int, width: int, max_pixels: int | None) -> None:
    if max_pixels is not None and height * width > max_pixels:
        raise WireTooLargeError(f"an image of {width}x{height} pixels is over this server's limit of "
                                f"{max_pixels} pixels (--max_pixels)")


def _image_payloads(images: ImageBatch, encoding: str) -> list[tuple[list[int], bytes]]:
    """u8 / png payloads, one per image."""
    if encoding == "f32":
        raise RewardInputError("encoding f32 needs a float tensor batch; send PIL images as u8 or png")
    if isinstance(images, torch.Tensor):
        arrays = list(tensor_to_uint8(images))
    else:
        arrays = [np.asarray(im.convert("RGB"), dtype=np.uint8) for im in images]
    if encoding == "u8":
        return [(list(a.shape), np.ascontiguousarray(a).tobytes()) for a in arrays]
    out = []
    for a in arrays:
        buf = io.BytesIO()
        Image.fromarray(a, mode="RGB").save(buf, format="PNG", compress_level=1)
        out.append((list(a.shape), buf.getvalue()))
    return out


def encode_request(images: ImageBatch, prompts: Sequence[str], encoding: str = "f32") -> bytes:
    """One scoring request body for B images and their B prompts."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown image encoding {encoding!r}; use one of {ENCODINGS}")
    check_inputs(images, prompts)
    if encoding == "f32" and isinstance(images, torch.Tensor):
        # One copy of the whole batch instead of one per image (the images are contiguous anyway).
        arr = images.detach().float().cpu().contiguous().numpy()
        metas = [{"shape": list(arr.shape[1:]), "nbytes": arr[0].nbytes}] * arr.shape[0]
        payload = arr.astype("<f4", copy=False).tobytes()
    else:
        pieces = _image_payloads(images, encoding)
        metas = [{"shape": shape, "nbytes": len(data)} for shape, data in pieces]
        payload = b"".join(data for _, data in pieces)
    head = json.dumps({"prompts": list(prompts), "encoding": encoding, "images": metas}).encode("utf-8")
    return b"".join([struct.pack("<I", len(head)), head, payload])


def _check_shape(shape, channels_first: bool, max_pixels: int | None) -> list[int]:
    """A declared image shape -> [3, H, W] or [H, W, 3] of positive ints, within ``max_pixels``."""
    if not (isinstance(shape, list) and len(shape) == 3 and all(type(d) is int and d > 0 for d in shape)):
        raise WireFormatError(f"image shape must be 3 positive ints; got {shape!r:.100}")
    height, width = (shape[1], shape[2]) if channels_first else (shape[0], shape[1])
    if (shape[0] if channels_first else shape[2]) != 3:
        raise WireFormatError(f"image shape {shape} is not RGB ({'[3, H, W]' if channels_first else '[H, W, 3]'})")
    _check_pixels(height, width, max_pixels)
    return shape


def _png_size(data, max_pixels: int | None) -> tuple[int, int]:
    """(H, W) from a PNG's header, within ``max_pixels``: nothing is decoded."""
    try:
        with Image.open(io.BytesIO(data), formats=["PNG"]) as im:
            width, height = im.size
    except Image.DecompressionBombError as exc:  # PIL's own guard (Image.MAX_IMAGE_PIXELS)
        raise WireTooLargeError(f"PNG image over the pixel limit: {exc}") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise WireFormatError(f"undecodable PNG image: {type(exc).__name__}: {exc}") from None
    _check_pixels(height, width, max_pixels)
    return height, width


def _decode_png(data: bytes):
    """PNG bytes (size already checked by _png_size) -> RGB PIL image."""
    try:
        im = Image.open(io.BytesIO(data), formats=["PNG"])
        im.load()
        return im if im.mode == "RGB" else im.convert("RGB")  # convert() of an RGB image is a second copy
    except Image.DecompressionBombError as exc:
        raise WireTooLargeError(f"PNG image over the pixel limit: {exc}") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise WireFormatError(f"undecodable PNG image: {type(exc).__name__}: {exc}") from None


def _parse_header(body: bytes, max_images: int | None) -> tuple[str, list[str], list[dict], int]:
    """(encoding, prompts, image records, payload offset), every field's type checked."""
    if len(body) < 4:
        raise WireFormatError("request body too short: expected a uint32 header length first")
    (n,) = struct.unpack("<I", body[:4])
    if n > MAX_HEADER_BYTES or 4 + n > len(body):
        raise WireFormatError(f"header length {n} does not fit a body of {len(body)} bytes")
    try:
        header = json.loads(body[4:4 + n].decode("utf-8"))
        encoding, prompts, metas = header["encoding"], header["prompts"], header["images"]
    except (ValueError, KeyError, TypeError) as exc:
        raise WireFormatError(f"bad request header: {exc}") from None
    except RecursionError:  # e.g. 200,000 nested "[": the client's mistake, not the server's failure
        raise WireFormatError("bad request header: JSON nested too deeply") from None
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise WireFormatError(f"unknown encoding {encoding!r:.50}; expected one of {ENCODINGS}")
    if not (isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)):
        raise WireFormatError("header prompts must be a list of strings")
    if not (isinstance(metas, list) and all(isinstance(m, dict) for m in metas)):
        raise WireFormatError("header images must be a list of {shape, nbytes} records")
    if max_images is not None and len(metas) > max_images:
        raise WireTooLargeError(f"{len(metas)} images in one request; this server takes at most {max_images}")
    for meta in metas:
        if not (type(meta.get("nbytes")) is int and 0 <= meta["nbytes"] <= len(body)):
            raise WireFormatError(f"image nbytes must be an int within the body; got {meta.get('nbytes')!r:.50}")
    return encoding, prompts, metas, 4 + n


@dataclass(frozen=True)
class ParsedRequest:
    """A request body checked down to each image's size, before any pixel is decoded: what
    decoding it will cost (``pixels``, H * W summed over its images) is known here."""

    encoding: str
    prompts: list[str]
    spans: list[tuple[int, int]]  # (start, end) of each image's payload in the body
    shapes: list[list[int]]  # declared shapes (f32 [3, H, W], u8 [H, W, 3]); PNG: [H, W, 3] from its header
    pixels: int


def _image_shape(encoding: str, meta: dict, data, max_pixels: int | None) -> list[int]:
    """One image's shape, its byte count checked against it (PNG: read from its header)."""
    if encoding == "png":
        return [*_png_size(data, max_pixels), 3]
    shape = _check_shape(meta.get("shape"), encoding == "f32", max_pixels)
    # math.prod of Python ints: a shape cannot overflow into a small byte count (np.prod would wrap).
    if math.prod(shape) * (4 if encoding == "f32" else 1) != len(data):
        raise WireFormatError(f"{encoding} image of shape {shape} does not match its {len(data)} bytes")
    return shape


def parse_request(body: bytes, max_pixels: int | None = None, max_images: int | None = None,
                  max_request_pixels: int | None = None) -> ParsedRequest:
    """Check a body against the format and the limits without decoding an image.

    ``max_pixels`` (H * W per image), ``max_images`` and ``max_request_pixels`` (H * W summed over
    the request's images: the per-image and per-request counts multiply otherwise, and a 1.5 MiB
    body of 32 flat 4096 x 4096 PNGs would decode to 1.5 GiB): None for no limit."""
    encoding, prompts, metas, offset = _parse_header(body, max_images)
    spans, shapes = [], []
    for meta in metas:
        if offset + meta["nbytes"] > len(body):
            raise WireFormatError(f"a body of {len(body)} bytes does not match its images' "
                                  f"{offset + meta['nbytes']} bytes (truncated)")
        shapes.append(_image_shape(encoding, meta, memoryview(body)[offset:offset + meta["nbytes"]], max_pixels))
        spans.append((offset, offset + meta["nbytes"]))
        offset += meta["nbytes"]
    if offset != len(body):
        raise WireFormatError(f"{len(body) - offset} bytes left after the last image")
    if encoding == "f32" and any(shape != shapes[0] for shape in shapes):
        raise WireFormatError("f32 images of one request must share one size")
    sizes = [(s[1], s[2]) if encoding == "f32" else (s[0], s[1]) for s in shapes]
    pixels = sum(h * w for h, w in sizes)
    if max_request_pixels is not None and pixels > max_request_pixels:
        raise WireTooLargeError(
            f"{len(sizes)} images of {pixels} pixels in all are over this server's limit of {max_request_pixels} "
            f"pixels per request (--max_request_pixels); send fewer images per request (--reward_batch_size)")
    return ParsedRequest(encoding, prompts, spans, shapes, pixels)


def decode_parsed(body: bytes, parsed: ParsedRequest) -> tuple[ImageBatch, list[str]]:
    """A parsed body -> (a float tensor [B, 3, H, W] for f32, else B PIL images; B prompts)."""
    if parsed.encoding == "f32":
        shape = parsed.shapes[0] if parsed.shapes else [3, 1, 1]
        arr = np.frombuffer(body, dtype="<f4", count=len(parsed.spans) * math.prod(shape),
                            offset=parsed.spans[0][0] if parsed.spans else 0)
        # one copy of the whole batch, writable and in native order
        return torch.from_numpy(arr.reshape(len(parsed.spans), *shape).astype(np.float32)), parsed.prompts
    images = []
    for (start, end), shape in zip(parsed.spans, parsed.shapes):
        if parsed.encoding == "png":
            images.append(_decode_png(body[start:end]))
        else:
            images.append(Image.fromarray(np.frombuffer(body, np.uint8, end - start, start).reshape(shape), mode="RGB"))
    return images, parsed.prompts


def decode_request(body: bytes, max_pixels: int | None = None, max_images: int | None = None,
                   max_request_pixels: int | None = None) -> tuple[ImageBatch, list[str]]:
    """Body -> (a float tensor [B, 3, H, W] for f32, else B PIL images; B prompts), within the
    limits of :func:`parse_request`."""
    return decode_parsed(body, parse_request(body, max_pixels, max_images, max_request_pixels))
