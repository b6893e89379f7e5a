"""remote: rewards on loopback: same scores as in-process, retries, clear failures."""

import logging

import pytest
import torch

from fastvideo.rewards import build_reward
from fastvideo.rewards.combine import RewardSpecError, build_multi_reward, format_reward_spec, parse_reward_spec
from fastvideo.rewards.remote import RemoteReward, RemoteRewardError, check_reward_endpoints
from server_utils import canned_http_server, free_port, serve_in_thread


@pytest.fixture(scope="module")
def server(tiny_rewards):
    from fastvideo.tools.reward_server import build_app

    rewards = {
        "hpsv2": build_reward("hpsv2", hps_ckpt_dir=tiny_rewards.hps_ckpt_dir,
                              model_name=tiny_rewards.hps_model_name, batch_size=3),
        "pickscore": build_reward("pickscore", pickscore_dir=tiny_rewards.pickscore_dir, batch_size=3),
        "compressibility": build_reward("compressibility"),
    }
    with serve_in_thread(build_app(rewards)) as (url, _):
        yield url, rewards


def test_spec_parsing_of_remote_entries():
    specs = parse_reward_spec("remote:http://h:8000/hpsv2:0.5, pickscore:2, remote:https://x/r/clip")
    assert [(s.name, s.weight, s.kind, s.url) for s in specs] == [
        ("hpsv2", 0.5, "remote", "http://h:8000/hpsv2"), ("pickscore", 2.0, "local", None),
        ("clip", 1.0, "remote", "https://x/r/clip")]
    assert parse_reward_spec(format_reward_spec(specs)) == specs
    assert parse_reward_spec("remote:http://h:1/hpsv2?encoding=u8:3")[0].url == "http://h:1/hpsv2?encoding=u8"


@pytest.mark.parametrize("spec, message", [
    ("remote:http://h:8000", "names no reward"),
    ("remote:h:8000/hpsv2", "http"),
    ("remote:http://h/hpsv2?encoding=jpeg", "encoding"),
    ("remote:http://h/hpsv2:nan", "finite"),
    ("hpsv2,remote:http://h/hpsv2", "twice"),
])
def test_bad_remote_entries(spec, message):
    with pytest.raises(RewardSpecError, match=message):
        parse_reward_spec(spec)


@pytest.mark.parametrize("name", ["hpsv2", "pickscore", "compressibility"])
def test_remote_scores_equal_in_process_exactly(server, name, make_images, make_pils, prompts):
    url, local = server
    images = torch.rand(4, 3, 24, 40, generator=torch.Generator().manual_seed(5))
    # Requests of 3 + 1 images: the server's model calls see the same batch shapes as the local
    # reward (batch_size 3), so even the GEMM blocking is the same and the scores are identical.
    remote = RemoteReward(f"{url}/{name}", batch_size=3)
    assert torch.equal(remote(images, prompts), local[name](images, prompts))
    pils = make_pils([(20, 30), (33, 17), (16, 16), (40, 40)], seed=1)  # PIL lists travel as u8
    remote_u8 = RemoteReward(f"{url}/{name}?encoding=u8")
    assert torch.equal(remote_u8(pils, prompts), local[name](pils, prompts))


def test_png_encoding_equals_scoring_8bit_images(server, prompts):
    url, local = server
    images = torch.rand(4, 3, 24, 24, generator=torch.Generator().manual_seed(6))
    got = RemoteReward(f"{url}/hpsv2?encoding=png")(images, prompts)
    rounded = (images * 255).round() / 255
    torch.testing.assert_close(got, local["hpsv2"](rounded, prompts), rtol=0, atol=1e-6)


def test_server_hps_input_scores_as_the_trainer_would(tiny_rewards, hps_reward, prompts):
    """The server's --hps_input: server-scored HPS equals local scoring with the same
    input_precision, for both settings (and the settings differ: the flag reaches the reward)."""
    import copy

    from fastvideo.tools.reward_server import build_app, build_parser, build_rewards

    images = torch.rand(4, 3, 24, 24, generator=torch.Generator().manual_seed(8))  # not 8-bit exact
    assert hps_reward.input_precision == "uint8" and hps_reward.batch_size == 3
    got = {}
    for hps_input in ("uint8", "float"):
        args = build_parser().parse_args(["--rewards", "hpsv2", "--device", "cpu", "--batch_size", "3",
                                          "--hps_ckpt_dir", str(tiny_rewards.hps_ckpt_dir),
                                          "--hps_model_name", tiny_rewards.hps_model_name, "--hps_input", hps_input])
        rewards, info, _ = build_rewards(args)
        assert info["hpsv2"]["input_precision"] == hps_input
        local = copy.copy(hps_reward)  # the same model, scored through the other path
        local.input_precision = hps_input
        with serve_in_thread(build_app(rewards, info)) as (url, _):
            got[hps_input] = RemoteReward(f"{url}/hpsv2", batch_size=3)(images, prompts)
        assert torch.equal(got[hps_input], local(images, prompts)), hps_input
    assert (got["uint8"] - got["float"]).abs().max() > 1e-6


def test_multi_reward_mixes_remote_and_local(server, tiny_rewards, prompts):
    url, local = server
    images = torch.rand(4, 3, 24, 24, generator=torch.Generator().manual_seed(7))
    multi = build_multi_reward(f"remote:{url}/hpsv2:0.5,compressibility:0.25",
                               reward_kwargs={"remote": {"timeout_s": 30.0, "retries": 1}})
    out = multi(images, prompts)
    expected = 0.5 * local["hpsv2"](images, prompts) + 0.25 * local["compressibility"](images, prompts)
    assert torch.equal(out.total, expected)
    assert list(out.raw) == ["hpsv2", "compressibility"]


def test_unreachable_server_fails_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RemoteRewardError, match=f"{url}.*does not answer"):
        check_reward_endpoints(parse_reward_spec(f"remote:{url}/hpsv2"), timeout_s=2)


def test_reward_not_served_is_named(server):
    url, _ = server
    with pytest.raises(RemoteRewardError, match="does not serve 'aesthetic'"):
        RemoteReward(f"{url}/aesthetic")


class Flaky:
    """A reward that raises on its first ``failures`` calls (the server answers 500)."""

    def __init__(self, failures):
        self.failures, self.calls = failures, 0

    def __call__(self, images, prompts):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("device lost")
        return torch.arange(len(prompts), dtype=torch.float32)


def test_server_errors_are_retried_then_fail_clearly(caplog, make_images):
    from fastvideo.tools.reward_server import build_app

    flaky = Flaky(failures=3)
    with serve_in_thread(build_app({"flaky": flaky})) as (url, _):
        reward = RemoteReward(f"{url}/flaky", retries=1)
        with caplog.at_level(logging.WARNING, logger="fastvideo.rewards.remote"):
            with pytest.raises(RemoteRewardError, match=f"{url}.*failed 2 times.*HTTP 500"):
                reward(make_images(2), ["a", "b"])
        assert "retry 1/1" in caplog.text
        assert flaky.calls == 2
        # The third call fails, the retry succeeds.
        assert torch.equal(reward(make_images(2), ["a", "b"]), torch.tensor([0.0, 1.0]))
        assert flaky.calls == 4


def test_server_gone_mid_run(make_images):
    from fastvideo.tools.reward_server import build_app

    with serve_in_thread(build_app({"flaky": Flaky(0)})) as (url, server):
        reward = RemoteReward(f"{url}/flaky", retries=2)
        assert reward(make_images(2), ["a", "b"]).tolist() == [0.0, 1.0]
        server.should_exit = True
    with pytest.raises(RemoteRewardError, match=f"{url}.*failed 3 times.*still running"):
        reward(make_images(2), ["a", "b"])


@pytest.mark.parametrize("failure, retried", [
    (400, False), (401, False), (404, False), (413, False), (422, False), (499, False),  # the last 4xx
    (500, True), (502, True), (503, True), (599, True), ("refused", True), ("reset", True), ("timeout", True),
])
def test_retry_policy_4xx_never_5xx_and_connection_errors_always(failure, retried, monkeypatch):
    import io
    import urllib.error

    from fastvideo.rewards import http

    monkeypatch.setattr(http.time, "sleep", lambda s: None)
    calls = []

    def fail():
        calls.append(1)
        if isinstance(failure, int):
            raise urllib.error.HTTPError("http://h/x", failure, "why", {}, io.BytesIO(b"detail"))
        raise {"refused": urllib.error.URLError(ConnectionRefusedError()), "reset": ConnectionResetError(),
               "timeout": TimeoutError()}[failure]

    with pytest.raises(RemoteRewardError, match="failed 3 times" if retried else "refused the request"):
        http.call_with_retries("server", fail, retries=2)
    assert len(calls) == (3 if retried else 1)


def _http(status_line: str, body: bytes, length: int | None = None) -> bytes:
    """A raw HTTP/1.1 reply; ``length`` other than len(body) makes a truncated one."""
    n = len(body) if length is None else length
    return f"{status_line}\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n".encode() + body


HEALTH = _http("HTTP/1.1 200 OK", b'{"status": "ok", "rewards": {"r": {"class": "X"}}, "limits": {}}')

# (raw reply to /score, retried?, a word the one-line error must hold). Retried: what a proxy or a
# dying server sends (garbled); not retried: well-formed replies of the wrong shape or type.
BAD_REPLIES = {
    "not-json": (_http("HTTP/1.1 200 OK", b"<html>proxy</html>"), True, "not JSON"),
    "not-utf8": (_http("HTTP/1.1 200 OK", b"\xff\xfe{}"), True, "not JSON"),
    "json-nested-100000-deep": (_http("HTTP/1.1 200 OK", b"[" * 100_000), True, "not JSON"),
    "truncated-body": (_http("HTTP/1.1 200 OK", b'{"scores": [0.1', length=40), True, "IncompleteRead"),
    "bad-status-line": (b"HTTP/1.1 OK-ish\r\n\r\n{}", True, "BadStatusLine"),
    "closed-without-reply": (b"", True, "RemoteDisconnected"),
    "5xx-multiline-detail": (_http("HTTP/1.1 502 Bad Gateway", b"upstream\nTraceback (most recent call last):\n"),
                             True, "HTTP 502"),
    "json-list": (_http("HTTP/1.1 200 OK", b"[0.5, 0.5]"), False, "JSON list"),
    "scores-booleans": (_http("HTTP/1.1 200 OK", b'{"scores": [true, true]}'), False, "non-numeric"),
    "scores-strings": (_http("HTTP/1.1 200 OK", b'{"scores": ["0.5", "0.5"]}'), False, "non-numeric"),
    "scores-lists": (_http("HTTP/1.1 200 OK", b'{"scores": [[0.5], [0.5]]}'), False, "non-numeric"),
    "scores-too-few": (_http("HTTP/1.1 200 OK", b'{"scores": [0.5]}'), False, "for 2 images"),
    "scores-missing": (_http("HTTP/1.1 200 OK", b'{"score": [0.5, 0.5]}'), False, "for 2 images"),
    "scores-huge-int": (_http("HTTP/1.1 200 OK", b'{"scores": [1, 1' + b"0" * 400 + b"]}"), False, "out of range"),
}


@pytest.mark.parametrize("kind", list(BAD_REPLIES))
def test_a_bad_reply_is_one_line_naming_the_url_retried_only_when_garbled(kind, monkeypatch):
    """Issue #39 item 14: no traceback of json/http.client, the URL named, garbled replies retried."""
    from fastvideo.rewards import http

    monkeypatch.setattr(http.time, "sleep", lambda s: None)
    reply, retried, needle = BAD_REPLIES[kind]
    with canned_http_server(reply, health=HEALTH) as (url, seen):
        reward = RemoteReward(f"{url}/r", retries=2, timeout_s=10)
        with pytest.raises(RemoteRewardError) as caught:
            reward(torch.rand(2, 3, 4, 4), ["a", "b"])
    message = str(caught.value)
    assert needle in message and url in message and "\n" not in message, message
    assert len([s for s in seen if s.startswith("POST")]) == (3 if retried else 1), seen


@pytest.mark.parametrize("health, needle", [
    (_http("HTTP/1.1 200 OK", b"[1, 2]"), "JSON list"),
    (_http("HTTP/1.1 200 OK", b"<html/>"), "not JSON"),
    (_http("HTTP/1.1 200 OK", b'{"rewards": ["r"]}'), "not a flux-grpo reward server"),
    (b"HTTP/1.1 OK-ish\r\n\r\n", "BadStatusLine"),
], ids=["json-list", "not-json", "rewards-a-list", "bad-status-line"])
def test_a_bad_health_reply_is_a_user_error_naming_the_url(health, needle):
    from fastvideo.errors import UserError

    with canned_http_server(health) as (url, _):
        with pytest.raises(UserError) as caught:
            RemoteReward(f"{url}/r")
    assert needle in str(caught.value) and url in str(caught.value), caught.value
