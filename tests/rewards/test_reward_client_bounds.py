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
