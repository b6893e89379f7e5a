"""The reward server's request format: a batch of images and prompts as one binary body.

    body = uint32 little-endian N | N bytes of UTF-8 JSON header | image payloads, concatenated

header = {"prompts": [B strings], "encoding": "f32" | "u8" | "png",
          "images": [{"shape": [...], "nbytes": n}, ...],
          "sources": [{"shape": [...], "nbytes": n}, ...]}      (optional: editing)

``sources`` (editing runs only): the B source images the samples were edited from, in the
request's encoding, their payloads after the images' (one size for all). A request without the key
is the format as it was before sources existed, so an old server reads what a client sends it (the
client sends sources only to a served reward whose /health record says ``"uses_sources": true``).
The server hands them to the reward as a float tensor ``[B, 3, H, W]`` in [0, 1] (u8 / png: the
8-bit values / 255, exact for sources read from image files).

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

from fastvideo.rewards.base import (ImageBatch, RewardInputError, check_inputs, check_sources, pils_to_tensor,
                                    tensor_to_uint8)

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


def encode_request(images: ImageBatch, prompts: Sequence[str], encoding: str = "f32",
                   sources: torch.Tensor | None = None) -> bytes:
    """One scoring request body for B images and their B prompts (and, editing, their B source
    images [B, 3, H, W] in [0, 1]: the header's "sources", absent when None)."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown image encoding {encoding!r}; use one of {ENCODINGS}")
    n = check_inputs(images, prompts)
    metas, payload = _payload(images, encoding)
    header = {"prompts": list(prompts), "encoding": encoding, "images": metas}
    if sources is not None:
        check_sources(sources, n, "remote")
        header["sources"], more = _payload(sources, encoding)
        payload += more
    head = json.dumps(header).encode("utf-8")
    return b"".join([struct.pack("<I", len(head)), head, payload])


def _payload(images: ImageBatch, encoding: str) -> tuple[list[dict], bytes]:
    """(the images' {shape, nbytes} records, their payloads concatenated)."""
    if encoding == "f32" and isinstance(images, torch.Tensor):
        # One copy of the whole batch instead of one per image (the images are contiguous anyway).
        arr = images.detach().float().cpu().contiguous().numpy()
        metas = [{"shape": list(arr.shape[1:]), "nbytes": arr[0].nbytes}] * arr.shape[0]
        payload = arr.astype("<f4", copy=False).tobytes()
    else:
        pieces = _image_payloads(images, encoding)
        metas = [{"shape": shape, "nbytes": len(data)} for shape, data in pieces]
        payload = b"".join(data for _, data in pieces)
    return metas, payload


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


def _check_records(metas, what: str, body_len: int) -> None:
    if not (isinstance(metas, list) and all(isinstance(m, dict) for m in metas)):
        raise WireFormatError(f"header {what} must be a list of {{shape, nbytes}} records")
    for meta in metas:
        if not (type(meta.get("nbytes")) is int and 0 <= meta["nbytes"] <= body_len):
            raise WireFormatError(f"{what[:-1]} nbytes must be an int within the body; got {meta.get('nbytes')!r:.50}")


def read_header(body: bytes) -> tuple[dict, int]:
    """(the JSON header as a dict, payload offset): the length prefix and the JSON checked."""
    if len(body) < 4:
        raise WireFormatError("request body too short: expected a uint32 header length first")
    (n,) = struct.unpack("<I", body[:4])
    if n > MAX_HEADER_BYTES or 4 + n > len(body):
        raise WireFormatError(f"header length {n} does not fit a body of {len(body)} bytes")
    try:
        header = json.loads(body[4:4 + n].decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise WireFormatError(f"bad request header: {exc}") from None
    except RecursionError:  # e.g. 200,000 nested "[": the client's mistake, not the server's failure
        raise WireFormatError("bad request header: JSON nested too deeply") from None
    if not isinstance(header, dict):
        raise WireFormatError(f"bad request header: a JSON object expected; got {type(header).__name__}")
    return header, 4 + n


def _parse_header(body: bytes, max_images: int | None) -> tuple[str, list[str], list[dict], list[dict] | None, int]:
    """(encoding, prompts, image records, source records or None, payload offset), every field's
    type checked."""
    header, offset = read_header(body)
    try:
        encoding, prompts, metas = header["encoding"], header["prompts"], header["images"]
        sources = header.get("sources")
    except (KeyError, TypeError, AttributeError) as exc:
        raise WireFormatError(f"bad request header: {exc}") from None
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise WireFormatError(f"unknown encoding {encoding!r:.50}; expected one of {ENCODINGS}")
    if not (isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)):
        raise WireFormatError("header prompts must be a list of strings")
    _check_records(metas, "images", len(body))
    if max_images is not None and len(metas) > max_images:
        raise WireTooLargeError(f"{len(metas)} images in one request; this server takes at most {max_images}")
    if sources is not None:
        _check_records(sources, "sources", len(body))
        if len(sources) != len(metas):
            raise WireFormatError(f"{len(sources)} source images for {len(metas)} images; send one per image")
    return encoding, prompts, metas, sources, offset


@dataclass(frozen=True)
class ParsedRequest:
    """A request body checked down to each image's size, before any pixel is decoded: what
    decoding it will cost (``pixels``, H * W summed over its images and sources) is known here."""

    encoding: str
    prompts: list[str]
    spans: list[tuple[int, int]]  # (start, end) of each image's payload in the body
    shapes: list[list[int]]  # declared shapes (f32 [3, H, W], u8 [H, W, 3]); PNG: [H, W, 3] from its header
    pixels: int
    source_spans: list[tuple[int, int]] | None = None  # the sources' (editing), None when the request has none
    source_shapes: list[list[int]] | None = None


def _image_shape(encoding: str, meta: dict, data, max_pixels: int | None) -> list[int]:
    """One image's shape, its byte count checked against it (PNG: read from its header)."""
    if encoding == "png":
        return [*_png_size(data, max_pixels), 3]
    shape = _check_shape(meta.get("shape"), encoding == "f32", max_pixels)
    # math.prod of Python ints: a shape cannot overflow into a small byte count (np.prod would wrap).
    if math.prod(shape) * (4 if encoding == "f32" else 1) != len(data):
        raise WireFormatError(f"{encoding} image of shape {shape} does not match its {len(data)} bytes")
    return shape


def _spans(body: bytes, encoding: str, metas: list[dict], offset: int, max_pixels: int | None):
    """(spans, shapes, offset after them) of consecutive payloads described by ``metas``."""
    spans, shapes = [], []
    for meta in metas:
        if offset + meta["nbytes"] > len(body):
            raise WireFormatError(f"a body of {len(body)} bytes does not match its images' "
                                  f"{offset + meta['nbytes']} bytes (truncated)")
        shapes.append(_image_shape(encoding, meta, memoryview(body)[offset:offset + meta["nbytes"]], max_pixels))
        spans.append((offset, offset + meta["nbytes"]))
        offset += meta["nbytes"]
    return spans, shapes, offset


def _hw(encoding: str, shape: list[int]) -> tuple[int, int]:
    return (shape[1], shape[2]) if encoding == "f32" else (shape[0], shape[1])


def parse_request(body: bytes, max_pixels: int | None = None, max_images: int | None = None,
                  max_request_pixels: int | None = None) -> ParsedRequest:
    """Check a body against the format and the limits without decoding an image.

    ``max_pixels`` (H * W per image), ``max_images`` and ``max_request_pixels`` (H * W summed over
    the request's images: the per-image and per-request counts multiply otherwise, and a 1.5 MiB
    body of 32 flat 4096 x 4096 PNGs would decode to 1.5 GiB): None for no limit."""
    encoding, prompts, metas, source_metas, offset = _parse_header(body, max_images)
    spans, shapes, offset = _spans(body, encoding, metas, offset, max_pixels)
    source_spans = source_shapes = None
    if source_metas is not None:
        source_spans, source_shapes, offset = _spans(body, encoding, source_metas, offset, max_pixels)
        if any(_hw(encoding, s) != _hw(encoding, source_shapes[0]) for s in source_shapes):
            raise WireFormatError("the source images of one request must share one size")
    if offset != len(body):
        raise WireFormatError(f"{len(body) - offset} bytes left after the last image")
    if encoding == "f32" and any(shape != shapes[0] for shape in shapes):
        raise WireFormatError("f32 images of one request must share one size")
    sizes = [_hw(encoding, s) for s in shapes + (source_shapes or [])]
    pixels = sum(h * w for h, w in sizes)
    if max_request_pixels is not None and pixels > max_request_pixels:
        raise WireTooLargeError(
            f"{len(sizes)} images of {pixels} pixels in all are over this server's limit of {max_request_pixels} "
            f"pixels per request (--max_request_pixels); send fewer images per request (--reward_batch_size)")
    return ParsedRequest(encoding, prompts, spans, shapes, pixels, source_spans, source_shapes)


def _decode(body: bytes, encoding: str, spans, shapes) -> ImageBatch:
    """Payloads -> a float tensor [B, 3, H, W] for f32, else B PIL images."""
    if encoding == "f32":
        shape = shapes[0] if shapes else [3, 1, 1]
        arr = np.frombuffer(body, dtype="<f4", count=len(spans) * math.prod(shape),
                            offset=spans[0][0] if spans else 0)
        # one copy of the whole batch, writable and in native order
        return torch.from_numpy(arr.reshape(len(spans), *shape).astype(np.float32))
    images = []
    for (start, end), shape in zip(spans, shapes):
        if encoding == "png":
            images.append(_decode_png(body[start:end]))
        else:
            images.append(Image.fromarray(np.frombuffer(body, np.uint8, end - start, start).reshape(shape), mode="RGB"))
    return images


def decode_parsed(body: bytes, parsed: ParsedRequest) -> tuple[ImageBatch, list[str]]:
    """A parsed body -> (a float tensor [B, 3, H, W] for f32, else B PIL images; B prompts)."""
    return _decode(body, parsed.encoding, parsed.spans, parsed.shapes), parsed.prompts


def decode_sources(body: bytes, parsed: ParsedRequest) -> torch.Tensor | None:
    """A parsed body's source images as the float tensor [B, 3, H, W] in [0, 1] rewards take
    (rewards.base), or None when the request carries none."""
    if parsed.source_spans is None:
        return None
    sources = _decode(body, parsed.encoding, parsed.source_spans, parsed.source_shapes)
    return sources if isinstance(sources, torch.Tensor) else pils_to_tensor(sources)


def decode_request(body: bytes, max_pixels: int | None = None, max_images: int | None = None,
                   max_request_pixels: int | None = None) -> tuple[ImageBatch, list[str]]:
    """Body -> (a float tensor [B, 3, H, W] for f32, else B PIL images; B prompts), within the
    limits of :func:`parse_request`."""
    return decode_parsed(body, parse_request(body, max_pixels, max_images, max_request_pixels))
