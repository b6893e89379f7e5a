"""Editing over the wire: the reward server's client and the VLM judge carry the source images.

The request format's optional "sources" (rewards/wire.py): a served reward that uses them gets them
pixel for pixel; a request without them is byte for byte the format older servers read."""

import base64
import io
import json
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from fastvideo.rewards import build_reward
from fastvideo.rewards.base import needs_sources, takes_sources, tensor_to_uint8
from fastvideo.rewards.remote import RemoteReward, RemoteRewardError
from fastvideo.rewards.vlm import DEFAULT_EDIT_TEMPLATE, DEFAULT_TEMPLATE, VLMJudgeReward
from fastvideo.rewards.wire import (WireFormatError, decode_parsed, decode_sources, encode_request,
                                    parse_request)
from server_utils import serve_in_thread


def _header(body: bytes) -> dict:
    (n,) = struct.unpack("<I", body[:4])
    return json.loads(body[4:4 + n])


def _eight_bit(n, h, w, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), generator=g).float() / 255.0


@pytest.mark.parametrize("encoding", ["f32", "u8", "png"])
def test_sources_round_trip_pixel_equal(encoding):
    images, sources = _eight_bit(3, 16, 24, 0), _eight_bit(3, 12, 20, 1)  # sources of another size
    body = encode_request(images, ["a", "b", "c"], encoding, sources=sources)
    parsed = parse_request(body)
    assert parsed.pixels == 3 * 16 * 24 + 3 * 12 * 20  # the sources count against the pixel limits
    got = decode_sources(body, parsed)
    assert got.dtype == torch.float32 and torch.equal(got, sources)
    decoded, prompts = decode_parsed(body, parsed)
    assert prompts == ["a", "b", "c"]
    if encoding == "f32":
        assert torch.equal(decoded, images)


def test_a_request_without_sources_is_the_old_format():
    images = _eight_bit(2, 8, 8, 2)
    body = encode_request(images, ["a", "b"], "f32")
    assert set(_header(body)) == {"prompts", "encoding", "images"}  # what servers before sources read
    assert len(body) == 4 + struct.unpack("<I", body[:4])[0] + images.numel() * 4
    assert decode_sources(body, parse_request(body)) is None


def test_bad_sources_in_a_request_are_refused():
    images, sources = _eight_bit(2, 8, 8, 3), _eight_bit(2, 8, 8, 4)
    body = encode_request(images, ["a", "b"], "u8", sources=sources)
    head = _header(body)
    head["sources"] = head["sources"][:1]  # one source for two images
    raw = json.dumps(head).encode()
    with pytest.raises(WireFormatError, match="1 source images for 2 images"):
        parse_request(struct.pack("<I", len(raw)) + raw + body[4 + struct.unpack("<I", body[:4])[0]:])
    with pytest.raises(WireFormatError, match="truncated"):
        parse_request(body[:-5])


class Recorder:
    """A plugin reward that takes sources and remembers what it got."""

    uses_sources = True

    def __init__(self):
        self.seen = []

    def __call__(self, images, prompts, sources=None):
        self.seen.append(sources.clone())
        return sources.mean(dim=(1, 2, 3))


@pytest.fixture(scope="module")
def edit_server(tiny_rewards):
    from fastvideo.tools.reward_server import PluginReward, build_app

    recorder = Recorder()
    rewards = {"rec": PluginReward("rec", recorder, 4), "compressibility": build_reward("compressibility"),
               "clip_edit": build_reward("clip_edit", clip_dir=tiny_rewards.pickscore_dir, batch_size=2)}
    info = {"rec": {"class": "Recorder", "uses_sources": True}, "compressibility": {"class": "C"},
            "clip_edit": {"class": "ClipEditReward", "uses_sources": True}}
    with serve_in_thread(build_app(rewards, info)) as (url, _):
        yield url, recorder, rewards


@pytest.mark.parametrize("encoding", ["f32", "u8", "png"])
def test_a_served_reward_receives_the_sources_pixel_equal(edit_server, encoding):
    url, recorder, _ = edit_server
    images, sources = _eight_bit(5, 16, 16, 5), _eight_bit(5, 24, 16, 6)
    client = RemoteReward(f"{url}/rec?encoding={encoding}", batch_size=2)  # 3 requests: 2 + 2 + 1
    assert takes_sources(client) and needs_sources(client)
    recorder.seen.clear()
    scores = client(images, [f"p{i}" for i in range(5)], sources=sources)
    got = torch.cat(recorder.seen)
    assert got.shape == sources.shape and torch.equal(got, sources)
    assert torch.equal(scores, sources.mean(dim=(1, 2, 3)))


def test_served_clip_edit_equals_in_process(edit_server, tiny_rewards):
    url, _, rewards = edit_server
    images, sources = _eight_bit(3, 32, 32, 7), _eight_bit(3, 32, 32, 8)
    prompts = ["make it red", "add a cat", "x"]
    remote = RemoteReward(f"{url}/clip_edit")(images, prompts, sources=sources)
    assert torch.equal(remote, rewards["clip_edit"](images, prompts, sources=sources))
    with pytest.raises(RemoteRewardError, match="refused the request.*source image.*none was given"):
        RemoteReward(f"{url}/clip_edit", retries=0)(images, prompts)


def test_a_reward_without_sources_gets_the_old_request(edit_server, monkeypatch):
    """The client sends sources only where /health says the reward uses them (an older server's
    health never does), so such a server sees the format it knows."""
    import fastvideo.rewards.remote as remote

    url, _, _ = edit_server
    client = RemoteReward(f"{url}/compressibility")
    assert not takes_sources(client)
    bodies = []
    real = remote.encode_request
    monkeypatch.setattr(remote, "encode_request", lambda *a, **k: bodies.append(real(*a, **k)) or bodies[-1])
    images = _eight_bit(2, 8, 8, 9)
    client(images, ["a", "b"], sources=_eight_bit(2, 8, 8, 10))
    assert bodies and all("sources" not in _header(b) for b in bodies)


class JudgeStandIn:
    """An OpenAI-compatible chat endpoint that records each request's content parts."""

    def __init__(self):
        self.requests = []

    def app(self):
        from fastapi import FastAPI

        app = FastAPI()

        @app.get("/v1/models")
        def models():
            return {"object": "list", "data": [{"id": "judge", "object": "model"}]}

        @app.post("/v1/chat/completions")
        def chat(body: dict):
            parts = body["messages"][0]["content"]
            self.requests.append(parts)
            return {"choices": [{"message": {"role": "assistant", "content": f"Final Score: {len(parts)}"}}]}

        return app


def _pixels(part) -> np.ndarray:
    data = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_the_vlm_judge_shows_the_source_first():
    stand_in = JudgeStandIn()
    images, sources = _eight_bit(2, 16, 16, 11), _eight_bit(2, 24, 16, 12)
    with serve_in_thread(stand_in.app()) as (url, _):
        judge = VLMJudgeReward(f"{url}/v1?model=judge", concurrency=1)
        assert takes_sources(judge) and not needs_sources(judge)
        scores = judge(images, ["make it red", "add a cat"], sources=sources)
        plain = judge(images, ["make it red", "add a cat"])  # text to image: the request as before
    assert scores.tolist() == [3.0, 3.0] and plain.tolist() == [2.0, 2.0]
    edit, t2i = stand_in.requests[:2], stand_in.requests[2:]
    for i, (source_part, image_part, text_part) in enumerate(edit):
        assert np.array_equal(_pixels(source_part), tensor_to_uint8(sources)[i])
        assert np.array_equal(_pixels(image_part), tensor_to_uint8(images)[i])
        assert text_part["text"] == DEFAULT_EDIT_TEMPLATE.replace("{prompt}", ["make it red", "add a cat"][i])
    for i, (image_part, text_part) in enumerate(t2i):
        assert np.array_equal(_pixels(image_part), tensor_to_uint8(images)[i])
        assert text_part["text"] == DEFAULT_TEMPLATE.replace("{prompt}", ["make it red", "add a cat"][i])
