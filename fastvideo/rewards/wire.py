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
exactly (float32 -> Python float -> float32).
"""

from __future__ import annotations

import io
import json
import struct
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from fastvideo.rewards.base import ImageBatch, RewardInputError, check_inputs, tensor_to_uint8

ENCODINGS = ("f32", "u8", "png")
MAX_HEADER_BYTES = 16 << 20


class WireFormatError(ValueError):
    """A request body that does not follow the format above."""


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


def _decode_one(encoding: str, shape: list[int], data: bytes):
    if encoding == "png":
        im = Image.open(io.BytesIO(data))
        im.load()
        return im.convert("RGB")
    if len(shape) != 3 or int(np.prod(shape)) != len(data):
        raise WireFormatError(f"image of shape {shape} does not match its {len(data)} bytes")
    return Image.fromarray(np.frombuffer(data, dtype=np.uint8).reshape(shape), mode="RGB")


def decode_request(body: bytes) -> tuple[ImageBatch, list[str]]:
    """Body -> (a float tensor [B, 3, H, W] for f32, else B PIL images; B prompts)."""
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
    if encoding not in ENCODINGS:
        raise WireFormatError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}")
    if encoding == "f32":
        return _decode_f32_batch(body, 4 + n, metas), list(prompts)
    offset, images = 4 + n, []
    for meta in metas:
        data = body[offset:offset + int(meta["nbytes"])]
        offset += int(meta["nbytes"])
        images.append(_decode_one(encoding, list(meta["shape"]), data))
    if offset != len(body):
        raise WireFormatError(f"{len(body) - offset} bytes left after the last image")
    return images, list(prompts)


def _decode_f32_batch(body: bytes, offset: int, metas: list[dict]) -> torch.Tensor:
    """f32 payloads -> one [B, 3, H, W] tensor (one copy); every image must share one shape."""
    shapes = {tuple(m["shape"]) for m in metas}
    if len(shapes) > 1:
        raise WireFormatError("f32 images of one request must share one size")
    shape = next(iter(shapes), (3, 1, 1))
    if len(shape) != 3 or any(int(m["nbytes"]) != int(np.prod(shape)) * 4 for m in metas):
        raise WireFormatError(f"f32 image of shape {list(shape)} does not match its byte count")
    if len(body) - offset != len(metas) * int(np.prod(shape)) * 4:
        raise WireFormatError(f"f32 payload of {len(body) - offset} bytes does not match {len(metas)} images "
                              f"of shape {list(shape)} (truncated, or bytes left after the last image)")
    arr = np.frombuffer(body, dtype="<f4", offset=offset).reshape(len(metas), *shape)
    return torch.from_numpy(arr.astype(np.float32))  # a writable copy in native order
