"""The reward server's request format round-trips images and prompts exactly."""

import struct

import numpy as np
import pytest
import torch

from fastvideo.rewards.wire import WireFormatError, decode_request, encode_request


def test_f32_tensor_round_trip_is_bit_exact(make_images):
    images = torch.rand(3, 3, 17, 23, generator=torch.Generator().manual_seed(0))  # not 8-bit values
    prompts = ["a", "Ünïcode ✓", "x" * 300]
    got, got_prompts = decode_request(encode_request(images, prompts, "f32"))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert torch.equal(got, images) and got_prompts == prompts


@pytest.mark.parametrize("encoding", ["u8", "png"])
def test_8bit_round_trip_of_pils_of_different_sizes(make_pils, encoding):
    pils = make_pils([(20, 30), (31, 17)], seed=2)
    got, _ = decode_request(encode_request(pils, ["p", "q"], encoding))
    assert [im.size for im in got] == [im.size for im in pils]
    for a, b in zip(got, pils):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_u8_of_a_tensor_rounds_like_saved_pngs(make_images):
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    got, _ = decode_request(encode_request(images, ["a", "b"], "u8"))
    expected = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    assert np.array_equal(np.stack([np.asarray(im) for im in got]), expected)


def test_f32_needs_a_tensor(make_pils):
    with pytest.raises(ValueError, match="u8 or png"):
        encode_request(make_pils([(8, 8)]), ["a"], "f32")


@pytest.mark.parametrize("body, message", [
    (b"\x01", "too short"),
    (struct.pack("<I", 999) + b"{}", "does not fit"),
    (struct.pack("<I", 2) + b"{}", "bad request header"),
])
def test_malformed_bodies_are_named(body, message):
    with pytest.raises(WireFormatError, match=message):
        decode_request(body)


def test_truncated_payload_is_refused():
    body = encode_request(torch.zeros(1, 3, 4, 4), ["a"], "f32")
    with pytest.raises(WireFormatError, match="does not match"):
        decode_request(body[:-4])
    with pytest.raises(WireFormatError, match="left after"):
        decode_request(body + b"xx")


def _wire(header: dict, payload: bytes) -> bytes:
    import json

    head = json.dumps(header).encode()
    return struct.pack("<I", len(head)) + head + payload


@pytest.mark.parametrize("header, message", [
    ({"encoding": "u8", "prompts": "a", "images": [{"shape": [1, 1, 3], "nbytes": 3}]}, "prompts must be a list"),
    ({"encoding": "u8", "prompts": ["a"], "images": [{"shape": [1, 1, 3], "nbytes": "3"}]}, "nbytes must be an int"),
    ({"encoding": "u8", "prompts": ["a"], "images": [{"shape": [1, 1, 3], "nbytes": -3}]}, "nbytes must be an int"),
])
def test_header_fields_are_type_checked_before_use(header, message):
    with pytest.raises(WireFormatError, match=message):
        decode_request(_wire(header, b"\0" * 3))
