"""The remote reward client reads a bounded reply within a deadline: a server that never stops
sending is cut off at the size its answer can hold (the scores of the request's images), and one that
drips its reply byte by byte is cut off at --reward_timeout, each as one line naming the server and
never retried, where the trainer used to grow by gigabytes or hang without a word."""

from __future__ import annotations

import http.server
import threading
import time
from contextlib import contextmanager

import pytest
import torch

from fastvideo.rewards.http import RemoteRewardError
from fastvideo.rewards.remote import RemoteReward, reply_cap


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "endless"
    sent: list = []

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(10 ** 10))
        self.end_headers()
        self.wfile.write(b'{"scores": [')
        sent = 0
        try:
            while sent < (64 << 20 if self.mode == "endless" else 60):  # the test's ceilings (3 s of drip)
                block = b"1.0, " * (4096 if self.mode == "endless" else 0) or b" "
                self.wfile.write(block)
                self.wfile.flush()
                sent += len(block)
                if self.mode == "drip":
                    time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            type(self).sent.append(sent)


@contextmanager
def _server(mode):
    handler = type("H", (_Handler,), {"mode": mode, "sent": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_an_endless_reply_is_cut_at_what_the_scores_can_hold():
    with _server("endless") as (url, handler):
        client = RemoteReward(f"{url}/hpsv2", timeout_s=30, retries=2, batch_size=4, check=False)
        start = time.monotonic()
        with pytest.raises(RemoteRewardError) as info:
            client(torch.rand(3, 3, 8, 8), ["a", "b", "c"])
        assert time.monotonic() - start < 20
    message = str(info.value)
    assert message.startswith(f"reward server {url} (hpsv2): the reply of {url}/score/hpsv2 passed {reply_cap(3)} bytes")
    assert "\n" not in message
    assert len(handler.sent) == 1  # not retried


def test_a_dripping_reply_is_cut_at_the_deadline():
    with _server("drip") as (url, handler):
        client = RemoteReward(f"{url}/hpsv2", timeout_s=1.0, retries=3, batch_size=4, check=False)
        start = time.monotonic()
        with pytest.raises(RemoteRewardError, match="still arriving at its deadline"):
            client(torch.rand(2, 3, 8, 8), ["a", "b"])
        elapsed = time.monotonic() - start
    assert 0.9 < elapsed < 5.0  # one deadline, no retries; each byte alone came well within the socket timeout
    assert reply_cap(3) == reply_cap(2) + 64


@contextmanager
def _dripping_server():
    """A socket server for what http.server cannot drip: its status line and headers, one byte every
    50 ms (each byte well within any socket timeout; all of them would take 10 s). Yields (base URL,
    the connections' times)."""
    import socketserver

    from server_utils import tcp_server

    seen = []

    class Drip(socketserver.BaseRequestHandler):
        def handle(self):
            seen.append(time.monotonic())
            try:
                for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 200:
                    self.request.sendall(bytes([byte]))
                    time.sleep(0.05)
            except OSError:  # the client hung up: what the test wants
                pass

    with tcp_server(Drip) as url:
        yield url, seen


def test_a_dripped_status_line_is_cut_at_the_deadline_naming_the_server():
    """The wall-clock deadline covers the whole request -- status line and headers too -- not only
    the body: one line naming the server, never retried, what the trainer reports as a ServiceError
    (exit 2, docs/operations.md). (A silent server, or one that stops reading the upload, trips the
    socket timeout as before: sendall's timeout is its total since Python 3.5; it is retried.)"""
    from fastvideo.errors import ServiceError, UserError
    from fastvideo.train_grpo_flux import _with_resume_point

    with _dripping_server() as (url, seen):
        client = RemoteReward(f"{url}/hpsv2", timeout_s=0.8, retries=3, batch_size=64, check=False)
        start = time.monotonic()
        with pytest.raises(RemoteRewardError) as info:
            client(torch.rand(2, 3, 8, 8), ["a", "b"])
        elapsed = time.monotonic() - start
    assert 0.7 < elapsed < 3.0, elapsed  # one deadline; the drip would take 10 s (one byte every 50 ms)
    assert len(seen) == 1  # not retried: a retry would wait as long again
    message = str(info.value)
    assert message.startswith(f"reward server {url} (hpsv2): the reply of {url}/score/hpsv2 was still arriving "
                              "at its deadline of 0.8 s"), message
    assert "\n" not in message
    reported = _with_resume_point(info.value, "/nonexistent")
    assert isinstance(reported, ServiceError) and isinstance(reported, UserError) and url in str(reported)


def test_the_retry_policy_has_a_total_and_a_dripped_health_check_is_a_user_error():
    from fastvideo.rewards import http
    from fastvideo.rewards.http import EndpointError

    assert http.retry_total(2.0, 3) == 2.0 * 4 + 0.5 + 1.0 + 2.0
    from server_utils import canned_http_server

    busy = b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy"
    with canned_http_server(busy) as (url, seen):
        start = time.monotonic()
        with pytest.raises(RemoteRewardError, match=r"retry policy's total of 1\.2 s leaves no time") as info:
            http.call_with_retries(f"reward server {url}", lambda s: http.http_json(f"{url}/x", b"{}", s),
                                   retries=4, backoff_s=0.2, timeout_s=5.0, total_s=1.2)
        elapsed = time.monotonic() - start
    assert elapsed < 1.2 and len(seen) == 3, (elapsed, seen)  # tries after 0, 0.2, 0.6 s; the 0.8 s backoff would pass it
    assert f"reward server {url} failed 3 times" in str(info.value) and "HTTP 503" in str(info.value)
    with _dripping_server() as (url, seen):
        start = time.monotonic()
        with pytest.raises(EndpointError, match=f"reward server {url} .*does not answer.*deadline of 0.5 s"):
            from fastvideo.rewards.remote import check_reward_server

            check_reward_server(f"{url}/hpsv2", timeout_s=0.5)
        assert time.monotonic() - start < 2.5
