"""Clips over the wire (rewards/clip_wire.py): a served clip reward gets the clips (8-bit frames, or
float32 bit for bit), the frame-pixel limit refuses early with 413 naming --max_clip_pixels, and a
clip the reward fails on comes back null under "failed" -- NaN on the trainer's side, never 0 or -1."""

from __future__ import annotations

import json
import math
import struct
import urllib.error
import urllib.request

import pytest
import torch

from fastvideo.rewards.clip_wire import clips_to_uint8, decode_clips, encode_clip_request, parse_clip_request
from fastvideo.rewards.remote import RemoteReward, RemoteRewardError
from fastvideo.rewards.video import ClipReward, score_clips_each
from fastvideo.rewards.wire import WireFormatError, WireTooLargeError
from server_utils import serve_in_thread

PROMPTS = ["a cat", "a dog", "a fox"]


def _clips(b=3, f=4, h=8, w=12, seed=0):
    return torch.rand(b, f, 3, h, w, generator=torch.Generator().manual_seed(seed))


class Motion(ClipReward):
    """Mean frame-to-frame change of each clip; raises on a clip whose first pixel is above ``poison``."""

    name = "motion"

    def __init__(self, poison: float = 2.0, **kw):
        super().__init__(**kw)
        self.poison, self.calls = poison, []

    def _score_clips(self, clips, prompts):
        self.calls.append(clips.shape[0])
        if bool((clips[:, 0, 0, 0, 0] > self.poison).any()):
            raise RuntimeError("decoder failed on this clip")
        return (clips[:, 1:] - clips[:, :-1]).abs().mean(dim=(1, 2, 3, 4))


def _body_with(header: dict, payload: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<I", len(raw)) + raw + payload


def test_clip_wire_round_trip_and_refusals():
    clips = _clips()
    for encoding, want in (("f32", clips), ("u8", clips_to_uint8(clips).float() / 255)):
        body = encode_clip_request(clips, PROMPTS, encoding)
        parsed = parse_clip_request(body)
        assert parsed.shape == (3, 4, 3, 8, 12) and parsed.pixels == 3 * 4 * 8 * 12 and parsed.prompts == PROMPTS
        assert torch.equal(decode_clips(body, parsed), want), encoding
    u8 = encode_clip_request(clips, PROMPTS, "u8")
    assert len(u8) - len(encode_clip_request(clips[:, :0 + 1], PROMPTS, "u8")) == 3 * 3 * 3 * 8 * 12  # 1 B a value
    with pytest.raises(WireTooLargeError, match=r"3 clip\(s\) of 4 frames of 12x8 are 1152 frame pixels, over .* "
                                                r"limit of 1151 per request \(--max_clip_pixels\)"):
        parse_clip_request(u8, max_clip_pixels=1151)
    parse_clip_request(u8, max_clip_pixels=1152)
    with pytest.raises(WireTooLargeError, match="--max_pixels"):
        parse_clip_request(u8, max_pixels=95)
    with pytest.raises(WireTooLargeError, match="at most 2"):
        parse_clip_request(u8, max_clips=2)
    with pytest.raises(WireFormatError, match="need 3456 bytes; the body has 3455"):
        parse_clip_request(u8[:-1])
    payload = u8[-3456:]
    for header, match in (({"prompts": PROMPTS, "encoding": "png", "clips": {"shape": [3, 4, 3, 8, 12]}}, "encoding"),
                          ({"prompts": PROMPTS, "encoding": "u8", "clips": {"shape": [3, 4, 4, 8, 12]}}, "shape"),
                          ({"prompts": PROMPTS[:2], "encoding": "u8", "clips": {"shape": [3, 4, 3, 8, 12]}},
                           "3 clips but 2 prompts")):
        with pytest.raises(WireFormatError, match=match):
            parse_clip_request(_body_with(header, payload))


def test_a_failing_clip_is_isolated_not_scored():
    clips = _clips()
    clips[1, 0, 0, 0, 0] = 1.0
    reward = Motion(poison=0.999)
    scores, failed = score_clips_each(reward, clips, PROMPTS)
    assert list(failed) == [1] and "RuntimeError: decoder failed" in failed[1] and math.isnan(scores[1])
    torch.testing.assert_close(scores[[0, 2]], Motion()(clips[[0, 2]], [PROMPTS[0], PROMPTS[2]]))
    assert reward.calls == [3, 1, 1, 1]  # the batch, then each clip alone
    lone, why = score_clips_each(reward, clips[1:2], PROMPTS[1:2])
    assert math.isnan(lone[0]) and list(why) == [0] and reward.calls[-1] == 1 and len(reward.calls) == 5


def test_a_served_clip_reward_scores_clips_and_reports_a_failed_one(capsys):
    from fastvideo.tools.reward_server import build_app
    from fastvideo.tools.reward_server_guard import ServerLimits

    clips = _clips()
    reward = Motion(poison=0.999)
    limits = ServerLimits(max_clip_pixels=2 * 4 * 8 * 12)  # two of these clips per request
    with serve_in_thread(build_app({"motion": reward}, limits=limits)) as (url, _):
        f32 = RemoteReward(f"{url}/motion?encoding=f32", batch_size=8)
        assert f32.takes_clips and f32.info["limits"]["max_clip_pixels"] == 2 * 4 * 8 * 12
        assert torch.equal(f32(clips, PROMPTS), Motion()(clips, PROMPTS))  # f32: bit for bit
        assert reward.calls == [2, 1]  # split to the server's frame-pixel limit, not refused
        u8 = RemoteReward(f"{url}/motion", batch_size=8)(clips, PROMPTS)
        torch.testing.assert_close(u8, Motion()(clips_to_uint8(clips).float() / 255, PROMPTS))
        bad = clips.clone()
        bad[1, 0, 0, 0, 0] = 1.0
        got = RemoteReward(f"{url}/motion", batch_size=1)(bad, PROMPTS)
        assert math.isnan(got[1]) and torch.isfinite(got[[0, 2]]).all()
        assert "could not score clip(s) [0] of a request of 1" in capsys.readouterr().err
        too_big = urllib.request.Request(f"{url}/score/motion", data=encode_clip_request(clips, PROMPTS, "u8"))
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(too_big, timeout=10)
        assert exc.value.code == 413 and "--max_clip_pixels" in exc.value.read().decode()
        with pytest.raises(RemoteRewardError, match="limit of 768 .*--max_clip_pixels"):
            RemoteReward(f"{url}/motion")(_clips(1, 9), PROMPTS[:1])  # one clip over the limit: said before sending


class ClipPlugin:
    """A --plugin callable that takes clips: each clip's frame count times its mean."""

    takes_clips = True

    def __call__(self, clips, prompts):
        return clips.mean(dim=(1, 2, 3, 4)) * clips.shape[1]


def test_a_clip_plugin_is_served_clips_and_images_are_refused():
    from fastvideo.tools.reward_server import PluginReward, build_app, served_info

    plugin = PluginReward("clipper", ClipPlugin(), batch_size=4)
    clips = _clips()
    assert plugin.takes_clips and served_info("clipper", plugin, {})["takes_clips"] is True
    with serve_in_thread(build_app({"clipper": plugin})) as (url, _):
        got = RemoteReward(f"{url}/clipper?encoding=f32")(clips, PROMPTS)
        assert torch.equal(got, clips.mean(dim=(1, 2, 3, 4)) * 4)
        from fastvideo.rewards.wire import encode_request

        images = urllib.request.Request(f"{url}/score/clipper", data=encode_request(clips[:, 0], PROMPTS, "f32"))
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(images, timeout=10)
        assert exc.value.code == 400 and "clipper scores clips" in exc.value.read().decode()


def test_bad_clip_pixels_are_a_400_before_the_reward_sees_them():
    from fastvideo.tools.reward_server import make_scorer
    from fastvideo.tools.reward_server_guard import ServerLimits

    class Unchecked:  # a clip reward that checks nothing itself
        takes_clips, calls = True, []

        def __call__(self, clips, prompts):
            self.calls.append(clips.shape)
            return clips.mean(dim=(1, 2, 3, 4))

    reward, clips = Unchecked(), _clips()
    clips[2, 1, 0, 0, 0] = float("nan")
    status, reply = make_scorer({"raw": reward}, "cpu", ServerLimits())("raw", encode_clip_request(clips, PROMPTS, "f32"))
    assert status == 400 and "NaN or Inf" in reply["detail"] and reward.calls == []
